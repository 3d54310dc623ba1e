"""Fewer PostgreSQL round trips per command (issue 16): a command's write transaction is
ONE round trip (one simple-query string: BEGIN, its statements, the NOTIFY and COMMIT),
and an append serves its context's last position from what the session's writer
knows instead of reading it. Counted from libpq's protocol trace on the writer's real
connection; the positions are checked against a writer that reads them every time.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event as sa_event

import pico
from pico.infrastructure.sql import bodies
from pico.infrastructure.sql.store import SqlDatabase, SqlReadStore
from tests.backends import Backend, require_postgres


@contextmanager
def _traced(conn: Any) -> Iterator[list[tuple[str, str, str]]]:
    """The protocol messages ``conn`` sends and receives in the block: (who, kind, detail)."""
    import psycopg

    messages: list[tuple[str, str, str]] = []
    with tempfile.TemporaryFile() as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )
        try:
            yield messages
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            for line in f.read().decode(errors="replace").splitlines():
                parts = [*line.split("\t"), "", ""]
                messages.append((parts[0], parts[2], parts[3]))


def _writer_conn(h: pico.Harness) -> Any:
    return h._line.storage.recorder.writer.connection()  # type: ignore[attr-defined]


def _completed(messages: list[tuple[str, str, str]]) -> list[str]:
    return [d.strip().strip('"') for w, k, d in messages if w == "B" and k == "CommandComplete"]


def _round_trips(messages: list[tuple[str, str, str]]) -> int:
    return sum(1 for w, k, _ in messages if w == "B" and k == "ReadyForQuery")


async def test_an_append_is_one_round_trip_with_its_notify_last_before_commit() -> None:
    url = require_postgres("the round-trip tests")
    h = await pico.Harness.open(url, session=f"rt-{uuid.uuid4().hex[:12]}")
    c = await h.root()
    for i in range(8):  # past psycopg's prepare threshold: the steady state
        await c.append("user", f"warm {i}")
    conn = _writer_conn(h)
    with _traced(conn) as messages:
        entry = await c.append("user", "one round trip")
    done = _completed(messages)
    # Check: one round trip; BEGIN first, the session's write lock (SELECT
    # pg_advisory_xact_lock), then rows, NOTIFY, the commit mode (durability "process":
    # SET LOCAL synchronous_commit = off), COMMIT.
    assert _round_trips(messages) == 1, messages
    assert done[0] == "BEGIN" and done[1] == "SELECT 1" and done[-2:] == ["SET", "COMMIT"], done
    # The only other SELECT is the NOTIFY (SELECT pg_notify): no read of the last position.
    assert done[-3] == "SELECT 1" and done.count("SELECT 1") == 2, done
    assert (await c.snapshot()).context[-1] == entry
    await h.close()


async def test_a_command_of_several_mutations_is_one_round_trip() -> None:
    url = require_postgres("the round-trip tests")
    h = await pico.Harness.open(url, session=f"rt-{uuid.uuid4().hex[:12]}")
    c = await h.root()

    def build(tx: pico.Command) -> list[int]:
        ids = [tx.append_entry(c.id, "user", f"part {k}") for k in range(3)]
        tx.append_context(c.id, ids)
        return ids

    for _ in range(6):
        await h.command(build)
    with _traced(_writer_conn(h)) as messages:
        ids = await h.command(build)
    assert _round_trips(messages) == 1, messages
    assert _completed(messages).count("COMMIT") == 1
    assert (await c.snapshot()).context[-3:] == tuple(ids)
    await h.close()


async def test_a_refused_write_rolls_back_and_the_connection_writes_again() -> None:
    # A failing statement in the pipeline (a duplicate entry row, forced by a row written
    # behind pico's back) is raised at the Sync; COMMIT never ran, nothing of the batch is
    # stored, and the writer's connection is idle again for the next command.
    url = require_postgres("the round-trip tests")
    session = f"rt-{uuid.uuid4().hex[:12]}"
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    first = await c.append("user", "first")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO pico_entries (session_id, id, conversation_id, kind, content, "
                "commit_end) VALUES (:s, :i, :c, 'user', '\"squatter\"', 0)"
            ),
            {"s": session, "i": h.head() + 1, "c": c.id},
        )
    with pytest.raises(pico.PicoError):
        await c.append("user", "refused")
    with engine.connect() as conn:
        contents = conn.execute(
            sa.text("SELECT content FROM pico_entries WHERE session_id = :s ORDER BY id"),
            {"s": session},
        ).scalars()
        # The content column holds deflated JSON (or JSON too small to deflate).
        assert [bodies.stored_text(x) for x in contents] == ['"first"', '"squatter"']
    engine.dispose()
    assert _writer_conn(h).info.transaction_status == 0  # IDLE
    await h.close()
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    assert (await c.snapshot()).context == (first,)
    await h.close()


async def _script(h: pico.Harness) -> None:
    """Appends, a fork with a copied context, compactions that keep and that drop the
    suffix, resets to empty and to a list, a replacement of everything by nothing: every op
    that moves a context's last position."""
    c = await h.root()
    ids = [await c.append("user", f"m{i}") for i in range(4)]
    fork = await c.fork(at_entry=ids[1])
    await fork.append("user", "in the fork")
    await c.compact("summary of two", through=ids[1])
    await c.append("user", "after a compaction that kept a suffix")
    last = await c.append("user", "about to be compacted whole")
    await c.compact("summary of everything", through=last)
    await c.append("user", "after a compaction of the whole context")
    await c.reset_context()
    await c.append("user", "after a reset to nothing")
    await c.reset_context([ids[0], ids[2]])
    tail = await c.append("user", "after a reset to two")
    await c.replace_context_prefix(tail, [])  # the whole context, replaced by nothing
    await c.append("user", "after a replacement by nothing")

    def two_in_one(tx: pico.Command) -> None:
        a = tx.append_entry(c.id, "user", "first of a pair")
        tx.append_context(c.id, [a])
        b = tx.append_entry(c.id, "user", "second of a pair")
        tx.append_context(c.id, [b])

    await h.command(two_in_one)
    await fork.append("user", "the fork again")


def _elements(url: str, session: str) -> list[tuple[int, int, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT conversation_id, position, entry_id FROM pico_context_elements "
                    "WHERE session_id = :s ORDER BY conversation_id, position"
                ),
                {"s": session},
            )
            return [(int(a), int(b), int(e)) for a, b, e in rows]
    finally:
        engine.dispose()


async def test_context_positions_are_those_a_writer_reading_them_would_write(
    sql_backend: Backend,
) -> None:
    # Session "known" serves last positions from its writer; session "read" forgets them
    # before every transaction, so each append reads it (the old path). Same script, same
    # ids: the stored context rows must be identical, position for position.
    names = {"known": f"known-{uuid.uuid4().hex[:8]}", "read": f"read-{uuid.uuid4().hex[:8]}"}
    known = await sql_backend.open(session=names["known"])
    await _script(known)
    snapshot_known = await (await known.root()).snapshot()
    await known.close()
    read = await sql_backend.open(session=names["read"])
    recorder = read._line.storage.recorder  # type: ignore[attr-defined]
    real = recorder.insert_events

    def forgetting(*args: Any, **kwargs: Any) -> Any:
        recorder._lasts.clear()
        return real(*args, **kwargs)

    recorder.insert_events = forgetting
    await _script(read)
    snapshot_read = await (await read.root()).snapshot()
    await read.close()
    assert snapshot_known.context == snapshot_read.context
    rows = _elements(sql_backend.url, names["known"])
    assert rows == _elements(sql_backend.url, names["read"])
    assert len(rows) >= 5  # not vacuous


async def test_a_transaction_that_fails_teaches_the_writer_nothing(sql_backend: Backend) -> None:
    h = await sql_backend.open()
    c = await h.root()
    first = await c.append("user", "first")
    writer = h._line.storage.recorder.writer  # type: ignore[attr-defined]
    real = writer.transaction

    def failing(work: Any, **kwargs: Any) -> None:
        def inner(cur: Any) -> None:
            work(cur)  # the rows are written (queued), the position moved in this batch
            raise RuntimeError("fault after the rows")

        real(inner, **kwargs)

    writer.transaction = failing
    with pytest.raises(Exception, match="fault after the rows"):
        await c.append("user", "lost")
    writer.transaction = real
    await h.close()
    h = await sql_backend.open()
    c = await h.root()
    second = await c.append("user", "second")
    assert (await c.snapshot()).context == (first, second)
    positions = [p for _, p, _ in _elements(sql_backend.url, sql_backend.session)]
    assert positions == [0, 1]
    await h.close()


async def test_commands_open_no_connections_and_the_writer_returns_its_own_clean() -> None:
    url = require_postgres("the round-trip tests")
    opened: list[object] = []

    def count(dbapi_conn: Any, _rec: Any) -> None:
        opened.append(dbapi_conn)

    sa_event.listen(sa.pool.Pool, "connect", count)
    try:
        h = await pico.Harness.open(url, session=f"rt-{uuid.uuid4().hex[:12]}")
        c = await h.root()
        await c.append("user", "warm up")
        await c.snapshot()
        before = len(opened)
        for i in range(30):
            await c.append("user", f"{i}")
            await c.snapshot()
        # Check: the writer and the reader hold their connections; no command connects.
        assert len(opened) == before
        await h.close()
    finally:
        sa_event.remove(sa.pool.Pool, "connect", count)
    # The writer's connection runs in autocommit (its transactions are explicit); back in
    # the pool it must not be, or a later engine.begin() would commit statement by statement.
    db = SqlDatabase(url)
    try:
        writer = db.raw_writer()
        assert writer.connection().autocommit
        writer.close()
        with db.writer.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None and driver.autocommit is False
    finally:
        db.close()


async def test_a_read_opens_its_snapshot_with_its_first_query() -> None:
    # BEGIN REPEATABLE READ travels with the read's first query (one round trip); later
    # queries of the read share that snapshot; ROLLBACK ends it. A read that runs no query
    # costs nothing.
    url = require_postgres("the round-trip tests")
    session = f"rt-{uuid.uuid4().hex[:12]}"
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    await c.append("user", "one")
    db = SqlDatabase(url)
    store = SqlReadStore(db, session)
    try:
        with store.read():
            head = store.meta()
            conn = store._local.conn  # lent again to the next snapshot (most recent first)
        assert head is not None
        with _traced(conn) as messages, store.read():
            first = store.meta()
            await c.append("user", "two")  # committed between the read's two queries
            again = store.meta()
        assert first == again == head  # one snapshot
        done = _completed(messages)
        assert done == ["BEGIN", "SELECT 1", "SELECT 1", "ROLLBACK"], done
        assert _round_trips(messages) == 3, messages
        with _traced(conn) as messages, store.read():
            pass
        assert messages == []
        with store.read():
            moved = store.meta()
        assert moved is not None and moved.head > head.head
    finally:
        store.close()
        db.close()
        await h.close()


async def test_commit_notifications_can_be_turned_off_for_a_fleet_nobody_watches_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = require_postgres("the round-trip tests")
    monkeypatch.setenv("PICO_NOTIFY_COMMITS", "0")
    h = await pico.Harness.open(url, session=f"rt-{uuid.uuid4().hex[:12]}")
    c = await h.root()
    for i in range(8):
        await c.append("user", f"warm {i}")
    with _traced(_writer_conn(h)) as messages:
        await c.append("user", "no notify")
    done = _completed(messages)
    # Check: the session's lock is the only SELECT: no pg_notify before the COMMIT.
    assert done[0] == "BEGIN" and done[-1] == "COMMIT" and done.count("SELECT 1") == 1, done
    await h.close()
    monkeypatch.setenv("PICO_NOTIFY_COMMITS", "sometimes")
    with pytest.raises(pico.ConfigurationError, match="notify_commits"):
        await pico.Harness.open(url, session=f"rt-{uuid.uuid4().hex[:12]}")
