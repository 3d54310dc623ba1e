"""Event rows name their stream and topic by number (schema revision 0008): the recorder
numbers a stream or topic at its first event, idempotently, remembers only what is
committed, and a number that names no row is reported, never skipped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from eventsourcing.persistence import IntegrityError, StoredEvent

import pico
from pico.infrastructure.sql import recorder as recorder_module
from pico.infrastructure.sql import schema
from pico.infrastructure.sql.store import SqlDatabase, SqlRecorder
from tests.backends import require_postgres
from tests.integration.test_migrations import scratch_postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlDatabase]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'numbered.db'}"
    else:
        url = "postgresql+psycopg://" + require_postgres("numbering").split("://", 1)[1]
    database = SqlDatabase(url)
    yield database
    database.close()


def _topic() -> str:
    """A topic no other test has numbered (the PostgreSQL test database is shared)."""
    return f"tests.numbered:T{uuid.uuid4().hex}.Happened"


def _numbers(db: SqlDatabase, oid: uuid.UUID) -> list[tuple[int, int, int]]:
    e, s = schema.events.c, schema.streams.c
    q = (
        sa.select(e.stream_id, e.originator_version, e.topic_id)
        .join(schema.streams, s.id == e.stream_id)
        .where(s.originator_id == oid.hex)
        .order_by(e.originator_version)
    )
    with db.writer.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(q)]


def test_an_event_row_holds_its_stream_and_topic_as_numbers_read_back_as_named(
    db: SqlDatabase,
) -> None:
    rec = SqlRecorder(db)
    try:
        a, b, topic = uuid.uuid4(), uuid.uuid4(), _topic()
        rec.insert_events([StoredEvent(a, 1, topic, b"{}"), StoredEvent(b, 1, topic, b"{}")])
        rec.insert_events([StoredEvent(a, 2, "tests.numbered:Other", b'{"x":1}')])
        rows_a, rows_b = _numbers(db, a), _numbers(db, b)
        # Check: one number per stream and per topic, shared by every row that names it.
        assert [v for _, v, _ in rows_a] == [1, 2] and len({s for s, _, _ in rows_a}) == 1
        assert rows_a[0][0] != rows_b[0][0] and rows_a[0][2] == rows_b[0][2] != rows_a[1][2]
        got = rec.select_events(a)
        assert [(e.originator_id, e.originator_version, e.topic, e.state) for e in got] == [
            (a, 1, topic, b"{}"),
            (a, 2, "tests.numbered:Other", b'{"x":1}'),
        ]
    finally:
        rec.close()


def test_a_new_writer_reads_back_the_numbers_another_writer_gave(db: SqlDatabase) -> None:
    """A writer that did not number a stream, topic or session itself (a reopened
    session's) finds their rows present and reads their numbers back: its event rows name
    the same rows as the first writer's."""
    first = SqlRecorder(db)
    oid, topic, session = uuid.uuid4(), _topic(), f"s-{uuid.uuid4().hex[:8]}"
    other = uuid.uuid4()
    try:
        # Another session, stream and topic numbered first: none of the rows the second
        # writer needs is number 1, so a number taken from the wrong row would show.
        elsewhere = f"e-{uuid.uuid4().hex[:8]}"
        first.insert_events([StoredEvent(other, 1, _topic(), b"{}")], session_id=elsewhere)
        first.insert_events([StoredEvent(oid, 1, topic, b"{}")], session_id=session)
    finally:
        first.close()
    second = SqlRecorder(db)
    try:
        second.insert_events([StoredEvent(oid, 2, topic, b'{"n":2}')], session_id=session)
        rows = _numbers(db, oid)
        assert [v for _, v, _ in rows] == [1, 2]
        assert len({s for s, _, _ in rows}) == 1 and len({t for _, _, t in rows}) == 1
        found = second.select_session_events(session, after=0, limit=10)
        assert [(e.originator_id, e.originator_version, e.topic) for _, e in found] == [
            (oid, 1, topic),
            (oid, 2, topic),
        ]
        assert [e.state for e in second.select_events(oid)] == [b"{}", b'{"n":2}']
    finally:
        second.close()


def test_a_rolled_back_batch_forgets_the_numbers_it_added_and_the_next_adds_them_again(
    db: SqlDatabase,
) -> None:
    """A deferred batch that numbered a new stream and topic is rolled back with the
    command that failed after it: the writer must not take those rows as present, or
    the next event of that topic would find no number (NOT NULL: refused)."""
    rec = SqlRecorder(db)
    try:
        old, new, topic = uuid.uuid4(), uuid.uuid4(), _topic()
        session = f"s-{uuid.uuid4().hex[:8]}"
        rec.insert_events([StoredEvent(old, 1, "tests.numbered:Other", b"{}")])
        rec.insert_events([StoredEvent(new, 1, topic, b"{}")], defer=True, session_id=session)
        with pytest.raises(IntegrityError):  # a repeated version: the whole batch goes
            rec.insert_events([StoredEvent(old, 1, "tests.numbered:Other", b"{}")], defer=True)
        assert _numbers(db, new) == [] and rec.last_session_position(session) == 0
        rec.insert_events([StoredEvent(new, 1, topic, b'{"again":true}')], session_id=session)
        assert [e.state for e in rec.select_events(new)] == [b'{"again":true}']
        assert [e.topic for e in rec.select_events(new)] == [topic]
        # Check: the session was numbered again too; its events are found by it.
        found = rec.select_session_events(session, after=0, limit=10)
        assert [(e.originator_id, e.topic) for _, e in found] == [(new, topic)]
    finally:
        rec.close()


def test_a_session_open_batch_never_makes_another_session_wait_for_a_shared_topic(
    db: SqlDatabase,
) -> None:
    """Topics are shared by every session. Session A's deferred batch (group commit) uses
    a new topic; session B's command of the same topic, on the same thread, must not
    wait for A's batch (on PostgreSQL it would wait until the server ended A's batch,
    faulting A): a new topic is numbered before, not inside, a batch."""
    a, b = SqlRecorder(db), SqlRecorder(db)
    try:
        topic = _topic()
        first, second = uuid.uuid4(), uuid.uuid4()
        a.insert_events([StoredEvent(first, 1, topic, b"{}")], defer=True, session_id="a")
        started = time.monotonic()
        b.insert_events([StoredEvent(second, 1, topic, b"{}")], session_id="b")
        assert time.monotonic() - started < 2.0
        a.flush()  # A's batch still commits
        assert [e.topic for e in a.select_events(first)] == [topic]
        assert [e.topic for e in b.select_events(second)] == [topic]
        assert _numbers(db, first)[0][2] == _numbers(db, second)[0][2]
    finally:
        a.close()
        b.close()


class _Counted(dict[str, str]):
    """A statement table that counts its lookups (one per batch that adds such rows)."""

    looked = 0

    def __getitem__(self, key: str) -> str:
        self.looked += 1
        return super().__getitem__(key)


def test_commands_joining_an_open_batch_do_not_number_again_what_it_numbered(
    db: SqlDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = _Counted(recorder_module._ADD_STREAM)
    sessions = _Counted(recorder_module._ADD_SESSION)
    monkeypatch.setattr(recorder_module, "_ADD_STREAM", streams)
    monkeypatch.setattr(recorder_module, "_ADD_SESSION", sessions)
    rec = SqlRecorder(db)
    try:
        oid, session = uuid.uuid4(), f"s-{uuid.uuid4().hex[:8]}"
        rec.insert_events([StoredEvent(oid, 1, _topic(), b"{}")], defer=True, session_id=session)
        assert (streams.looked, sessions.looked) == (1, 1)
        rec.insert_events([StoredEvent(oid, 2, _topic(), b"{}")], defer=True, session_id=session)
        rec.insert_events([StoredEvent(oid, 3, _topic(), b"{}")], session_id=session)
        # Check: the stream and session rows were added once, by the batch's first command ...
        assert (streams.looked, sessions.looked) == (1, 1)
        # ... and every event of the batch names them.
        assert [v for _, v, _ in _numbers(db, oid)] == [1, 2, 3]
        found = rec.select_session_events(session, after=0, limit=10)
        assert [e.originator_version for _, e in found] == [1, 2, 3]
    finally:
        rec.close()


def test_a_writer_past_its_memory_of_numbered_streams_adds_their_rows_idempotently(
    db: SqlDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder_module, "_KNOWN_LIMIT", 3)
    rec = SqlRecorder(db)
    try:
        streams = [uuid.uuid4() for _ in range(5)]
        for version in (1, 2, 3):
            for oid in streams:
                rec.insert_events([StoredEvent(oid, version, "tests.numbered:Other", b"{}")])
        # Bounded on either dialect (SQLite keeps the numbers themselves).
        assert len(rec._known) <= 3 and len(rec._numbers or {}) <= 3
        for oid in streams:
            rows = _numbers(db, oid)
            assert [v for _, v, _ in rows] == [1, 2, 3] and len({s for s, _, _ in rows}) == 1
    finally:
        rec.close()


def test_each_session_is_numbered_once_and_reads_only_its_own_events(db: SqlDatabase) -> None:
    rec = SqlRecorder(db)
    try:
        a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
        streams = {a: uuid.uuid4(), b: uuid.uuid4()}
        for version in (1, 2):
            for session in (a, b):
                event = StoredEvent(streams[session], version, "tests.numbered:Other", b"{}")
                rec.insert_events([event], session_id=session)
        with db.writer.connect() as conn:
            n = schema.session_numbers.c
            numbers = dict(
                conn.execute(sa.select(n.session_id, n.id).where(n.session_id.in_([a, b]))).all()
            )
            e = schema.events.c
            held = conn.execute(
                sa.select(e.session_number, sa.func.count())
                .where(e.session_number.in_(list(numbers.values())))
                .group_by(e.session_number)
            ).all()
        assert len(numbers) == 2 and sorted(held) == sorted((m, 2) for m in numbers.values())
        for session in (a, b):
            found = rec.select_session_events(session, after=0, limit=10)
            assert [(ev.originator_id, ev.originator_version) for _, ev in found] == [
                (streams[session], 1),
                (streams[session], 2),
            ]
            assert rec.count_session_events(session, after=0) == 2
            assert rec.last_session_position(session) == found[-1][0]
        assert rec.select_session_events("no-such-session", after=0, limit=10) == []
    finally:
        rec.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def own_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own (a test that deletes a shared topic row must not
    share the PostgreSQL test database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'a.db'}"
        return
    with scratch_postgres("tampering with numbers") as url:
        yield url


@pytest.mark.parametrize("table", ["pico_streams", "pico_topics"])
async def test_an_event_whose_number_names_no_row_is_reported_at_its_position(
    own_url: str, table: str
) -> None:
    url = own_url
    h = await pico.Harness.open(url, session="s")
    c = await h.root()
    await c.append("user", "one")
    await h.close()
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        # The last entry's event, its stream or topic row deleted behind pico's back.
        position = conn.execute(
            sa.text(
                "SELECT max(id) FROM pico_events WHERE topic_id IN "
                "(SELECT id FROM pico_topics WHERE topic LIKE '%EntryAppended')"
            )
        ).scalar_one()
        column = "stream_id" if table == "pico_streams" else "topic_id"
        number = conn.execute(
            sa.text(f"SELECT {column} FROM pico_events WHERE id = :p"), {"p": position}
        ).scalar_one()
        conn.execute(sa.text(f"DELETE FROM {table} WHERE id = :n"), {"n": number})
    engine.dispose()
    # Check: the chain breaks at that event's batch and the check names its position. A
    # missing topic makes a load of the stream refuse (the event cannot be decoded); a
    # missing stream row hides the stream's events from a load by stream id, as deleted
    # events would be, which is what the two checks are for.
    chain = await pico.verify(url, session="s")
    assert not chain.ok and chain.breaks[0].position <= position
    report = await pico.check(url, session="s")
    assert not report.ok
    assert any(f"position {position}" in str(f) for f in report.findings), report.findings
    if table == "pico_streams":
        return
    with pytest.raises(pico.StorageCorruptError):
        h = await pico.Harness.open(url, session="s")
        try:
            await (await h.root()).entries()
        finally:
            await h.close()


def test_a_batch_sqlite_rolled_back_by_itself_is_lost_and_no_row_lands_on_its_numbers(
    tmp_path: Path,
) -> None:
    """SQLite may roll an open transaction back by itself (an I/O, disk-full or
    out-of-memory error in a statement inside it). The deferred batch is then lost: the
    next command must not run outside it, on the numbers the lost batch gave rows that
    another writer may since have been given."""
    url = f"sqlite:///{tmp_path / 'rolled.db'}"
    db, other_db = SqlDatabase(url), SqlDatabase(url)
    rec, other = SqlRecorder(db), SqlRecorder(other_db)
    try:
        a, x, y = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        x_topic, y_topic = _topic(), _topic()
        rec.insert_events([StoredEvent(a, 1, _topic(), b"{}")], session_id="s")
        rec.insert_events([StoredEvent(x, 1, x_topic, b"{}")], session_id="s", defer=True)
        rec.writer.connection().execute("ROLLBACK")  # what SQLite does after such an error
        # Another writer numbers a new stream and topic: it is given the lost numbers.
        other.insert_events([StoredEvent(y, 1, y_topic, b"{}")], session_id="o")
        with pytest.raises(RuntimeError, match="rolled back"):
            rec.insert_events([StoredEvent(x, 2, x_topic, b'{"v":2}')], session_id="s")
        # Check: nothing was written on the lost numbers; the other stream is intact.
        assert [(e.originator_id, e.topic) for e in other.select_events(y)] == [(y, y_topic)]
        assert _numbers(db, x) == []
        # The writer starts afresh: X, numbered again, gets rows of its own.
        rec.insert_events([StoredEvent(x, 1, x_topic, b"{}")], session_id="s")
        assert [(e.originator_version, e.topic) for e in rec.select_events(x)] == [(1, x_topic)]
        assert [e.originator_id for e in other.select_events(y)] == [y]
    finally:
        rec.close()
        other.close()
        db.close()
        other_db.close()


def test_a_lost_batch_is_refused_even_inside_a_read_transaction_begun_since(
    tmp_path: Path,
) -> None:
    """The same loss, then a read snapshot on the writer's connection begins a
    transaction of its own (``idle_connection`` lends it) and is still open when the
    next command writes: the connection is in a transaction, but not the batch's, and
    the write refuses instead of landing alone on the lost batch's numbers."""
    url = f"sqlite:///{tmp_path / 'rolled.db'}"
    rec = SqlRecorder(SqlDatabase(url))
    try:
        a, x = uuid.uuid4(), uuid.uuid4()
        x_topic = _topic()
        rec.insert_events([StoredEvent(a, 1, _topic(), b"{}")], session_id="s")
        rec.insert_events([StoredEvent(x, 1, x_topic, b"{}")], session_id="s", defer=True)
        conn = rec.writer.connection()
        conn.execute("ROLLBACK")  # what SQLite does after such an error
        lent = rec.writer.idle_connection()
        assert lent is not None and lent is conn  # a read snapshot takes it ...
        conn.execute("BEGIN")  # ... and begins its own transaction
        conn.execute("SELECT 1").fetchall()
        with pytest.raises(RuntimeError, match="rolled back"):
            rec.insert_events([StoredEvent(x, 2, x_topic, b'{"v":2}')], session_id="s")
        assert _numbers(rec.db, x) == []
    finally:
        rec.close()
