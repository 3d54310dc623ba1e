"""Schema migrations (Alembic): a database written by an older release upgrades in place,
an older schema is refused unless the open opts in, a newer one is refused, and the model
and the revisions never drift apart.

The oldest released schema is built from the exact DDL release 1 ran
(``release1_<dialect>.sql``, generated once from that release's ``schema.py``), then
given a session written through pico's own tables.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import pico
from pico.infrastructure.sql import bodies, schema
from tests.backends import require_postgres
from tests.bodies import store_as_json
from tests.taskdefs import definitions

HERE = Path(__file__).parent
HEAD = schema.head_revision()
V1_TABLES = [
    "pico_events",
    "pico_snapshots",
    "pico_sessions",
    "pico_commits",
    "pico_conversations",
    "pico_entries",
    "pico_context_elements",
    "pico_context_edits",
]


@contextmanager
def scratch_postgres(what: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database on the test server, dropped after: a
    schema test changes the schema, so never the shared test database."""
    base = require_postgres(what)
    name = f"pico_schema_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with scratch_postgres("the upgrade") as url:
        yield url


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(
        url.replace("postgresql://", "postgresql+psycopg://", 1), poolclass=sa.pool.NullPool
    )


def run_script(url: str, script: str) -> None:
    """Apply a SQL script the way a DBA would: sqlite3's executescript, or psycopg."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///") :])
        conn.executescript(script)
        conn.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(script.encode())


OLD_MESSAGES = ("written by the old release", "an answer")
#: pico_events as release 1 (to 0007) stored it: the stream id and topic in each row.
RELEASE1_EVENTS = sa.Table(
    "pico_events",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("session_id", sa.String(200)),
    sa.Column("originator_id", sa.String(32)),
    sa.Column("originator_version", sa.Integer),
    sa.Column("topic", sa.Text),
    sa.Column("state", sa.LargeBinary),
)
#: A current database's events in that form (``schema.event_log`` joins the numbers back,
#: and the session's number is joined here).
EVENT_LOG = schema.event_log.join(
    schema.session_numbers, schema.session_numbers.c.id == schema.events.c.session_number
)
EVENT_ROW = (
    schema.events.c.id,
    schema.session_numbers.c.session_id,
    schema.streams.c.originator_id,
    schema.events.c.originator_version,
    schema.topics.c.topic,
    schema.events.c.state,
)


async def _written_session(tmp_path: Path, messages: tuple[str, ...]) -> Path:
    """Session ``old`` with ``messages`` in its root, in a scratch database (the rows to
    carry over)."""
    path = tmp_path / f"scratch-{uuid.uuid4().hex[:8]}.db"
    h = await pico.Harness.open(f"sqlite:///{path}", session="old")
    c = await h.root()
    for i, text in enumerate(messages):
        await c.append("user" if i % 2 == 0 else "assistant", text)
    await h.close()
    return path


def _as_text(name: str) -> sa.Table:
    """The model's table ``name`` with its deflated columns as JSON text, as before 0008."""
    deflated = bodies.DEFLATED_COLUMNS.get(name, {})
    columns = [
        sa.Column(c.name, sa.Text if c.name in deflated else c.type, primary_key=c.primary_key)
        for c in schema.metadata.tables[name].columns
    ]
    return sa.Table(name, sa.MetaData(), *columns)


async def _release1_database(
    url: str, tmp_path: Path, messages: tuple[str, ...] = OLD_MESSAGES
) -> None:
    """The database release 1 created (its DDL, its ``pico_schema`` row) holding session
    ``old``: every row of the tables release 1 had."""
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    run_script(url, (HERE / f"release1_{dialect}.sql").read_text())
    source = _engine(f"sqlite:///{await _written_session(tmp_path, messages)}")
    target = _engine(url)
    with source.connect() as src, target.begin() as dst:
        for name in V1_TABLES:
            table = RELEASE1_EVENTS if name == "pico_events" else _as_text(name)
            query = (
                sa.select(*EVENT_ROW).select_from(EVENT_LOG)
                if name == "pico_events"
                else schema.metadata.tables[name].select()
            )
            rows = [dict(r) for r in src.execute(query).mappings()]
            for row in rows if name in ("pico_events", "pico_snapshots") else ():
                row["state"] = bodies.decode(row["state"])  # release 1 stored JSON
            for column in bodies.DEFLATED_COLUMNS.get(name, {}):
                for row in rows:  # and JSON text in the read model
                    if row[column] is not None:
                        row[column] = bodies.stored_text(row[column])
            if rows:
                dst.execute(table.insert(), rows)
        if dialect == "postgresql":  # rows inserted with their ids: move the identity on
            dst.execute(
                sa.text(
                    "SELECT setval(pg_get_serial_sequence('pico_events', 'id'), "
                    "(SELECT max(id) FROM pico_events))"
                )
            )
    source.dispose()
    target.dispose()


def _stamp(url: str) -> str | None:
    engine = _engine(url)
    with engine.connect() as conn:
        found = schema.read_state(conn).revision
    engine.dispose()
    return found


def _drift(url: str) -> list[object]:
    """What autogenerate would write for the database at ``url`` (nothing, if it matches
    ``schema.metadata`` exactly)."""
    engine = _engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "version_table": schema.VERSION_TABLE,
                "include_name": schema.include_name,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        diff = list(compare_metadata(ctx, schema.metadata))
    engine.dispose()
    return diff


def _layout(url: str) -> tuple[set[str], bool]:
    """The task indexes, and whether ``pico_commits`` is keyed (WITHOUT ROWID on SQLite)."""
    engine = _engine(url)
    indexes = {str(i["name"]) for i in sa.inspect(engine).get_indexes("pico_tasks")}
    engine.dispose()
    return indexes, _keyed(url, ("pico_commits",))["pico_commits"]


def _fingerprint(url: str) -> bytes:
    """The SQLite file's bytes and its -wal's (SQLite's read-only inspection of a WAL
    file may leave an empty -wal and an -shm index: no content), or on PostgreSQL every
    pico table's rows, the version tables included."""
    if url.startswith("sqlite"):
        path = Path(url[len("sqlite:///") :])
        digest = hashlib.sha256(path.read_bytes())
        wal = path.with_name(path.name + "-wal")
        digest.update(wal.read_bytes() if wal.exists() else b"")
        return digest.digest()
    engine = _engine(url)
    digest = hashlib.sha256()
    with engine.connect() as conn:
        names = sorted(n for n in sa.inspect(conn).get_table_names() if n.startswith("pico_"))
        for name in names:
            rows = conn.execute(sa.text(f"SELECT * FROM {name} ORDER BY 1")).all()
            digest.update(f"{name}:{rows!r}".encode())
    engine.dispose()
    return digest.digest()


async def _session_works(url: str) -> None:
    h = await pico.Harness.open(url, session="old", definitions=definitions())
    c = await h.root()
    assert [e.content for e in (await c.entries()).items] == [
        "written by the old release",
        "an answer",
    ]
    plan = pico.conversation_value("plugin.plan", bool)
    await c.set_value(plan, True)
    tid = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
    assert await c.get_value(plan) is True and (await h.task(tid)) is not None
    await c.append("user", "after the upgrade")
    await h.close()


async def test_a_release_1_database_is_refused_until_the_open_opts_in_then_upgrades_to_head(
    fresh_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _release1_database(fresh_url, tmp_path)
    before = _fingerprint(fresh_url)
    # Check: without the opt-in the open is refused, naming both revisions and the way
    # forward, and nothing changed (on SQLite: not a byte, no -wal created).
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    with pytest.raises(pico.SchemaOutdatedError) as refused:
        await pico.Harness.open(fresh_url, session="old")
    message = str(refused.value)
    assert "revision 0001" in message and f"revision {HEAD}" in message
    assert "pico db upgrade" in message and "PICO_UPGRADE_SCHEMA=1" in message
    assert (refused.value.current.split()[0], refused.value.required) == ("0001", HEAD)
    assert _fingerprint(fresh_url) == before
    # A read-only open (an audit) cannot upgrade either: refused, nothing changed.
    with pytest.raises(pico.SchemaOutdatedError, match="read-only"):
        await pico.Harness.open(fresh_url, session="old", read_only=True)
    assert _fingerprint(fresh_url) == before
    # Check: with the opt-in the open adopts (stamp 0001) and runs 0002..head, in order,
    # in one transaction; the session's history is intact and every later table works.
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    await _session_works(fresh_url)
    assert _stamp(fresh_url) == HEAD
    assert _layout(fresh_url) == (
        {"pico_tasks_by_conversation", "pico_tasks_live", "pico_tasks_live_conversation"},
        True,
    )
    # The upgraded database IS the model: autogenerate finds nothing to write.
    assert _drift(fresh_url) == []
    # The legacy table is left as it was (a record of the pre-Alembic history).
    engine = _engine(fresh_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version FROM pico_schema")).scalars().all() == [1]
    engine.dispose()


def _unnumbered(conn: sa.Connection) -> None:
    """Turn a head database into 0007's layout: the session id, stream id and topic in
    every event row, no ``pico_session_numbers``, ``pico_streams`` or ``pico_topics``
    (what revision 0008 numbers), task states and entry texts as JSON text."""
    query = sa.select(*EVENT_ROW).select_from(EVENT_LOG)
    rows = [dict(r) for r in conn.execute(query).mappings()]
    conn.execute(sa.text("DROP TABLE pico_events"))
    conn.execute(sa.text("DROP TABLE pico_topics"))
    conn.execute(sa.text("DROP TABLE pico_streams"))
    conn.execute(sa.text("DROP TABLE pico_session_numbers"))
    old = sa.MetaData()
    events = sa.Table(
        "pico_events",
        old,
        sa.Column("id", schema._Id, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("originator_id", sa.String(32), nullable=False),
        sa.Column("originator_version", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("originator_id", "originator_version", name="pico_events_stream"),
        sa.Index("pico_events_session", "session_id", "id"),
    )
    old.create_all(conn)
    if rows:
        conn.execute(events.insert(), rows)
    # 0007's task states and entry texts: JSON text (0008 deflates them, binary columns).
    for table, deflated in bodies.DEFLATED_COLUMNS.items():
        for column in deflated:
            found = conn.execute(sa.text(f"SELECT session_id, id, {column} FROM {table}"))
            rows = [
                {"s": r[0], "i": r[1], "v": None if r[2] is None else bodies.stored_text(r[2])}
                for r in found
            ]
            if conn.dialect.name == "postgresql":
                conn.execute(
                    sa.text(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT USING ''")
                )
            for row in rows:
                conn.execute(
                    sa.text(f"UPDATE {table} SET {column} = :v WHERE session_id = :s AND id = :i"),
                    row,
                )
    if conn.dialect.name == "postgresql":  # rows inserted with their ids: move the identity on
        conn.execute(
            sa.text(
                "SELECT setval(pg_get_serial_sequence('pico_events', 'id'), "
                "(SELECT max(id) FROM pico_events))"
            )
        )


def _as_0007(url: str) -> None:
    """Turn a head database into what a pico at 0007 left (``_unnumbered``), stamped 0007."""
    engine = _engine(url)
    with engine.begin() as conn:
        _unnumbered(conn)
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = '0007'"))
    engine.dispose()


def _as_legacy(url: str, versions: int) -> None:
    """Turn a database at head into what the pre-Alembic code left at ``versions``: its
    ``pico_schema`` rows and no Alembic stamp (version 3: the role-carrying task indexes
    and, on SQLite, a rowid commit table)."""
    engine = _engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {schema.VERSION_TABLE}"))
        schema.legacy_versions.create(conn)
        for v in range(1, versions + 1):
            conn.execute(schema.legacy_versions.insert().values(version=v, description=f"v{v}"))
        # 0005 (leases) and 0006 (workers): no pre-Alembic layout had them; 0007: it
        # stored JSON bodies.
        for table in ("pico_leases", "pico_work", "pico_inbox"):
            conn.execute(sa.text(f"DROP TABLE {table}"))
        store_as_json(conn.connection.driver_connection)
        _unnumbered(conn)
        if versions >= 4:
            return
        conn.execute(sa.text("DROP INDEX pico_tasks_by_conversation"))
        conn.execute(sa.text("CREATE INDEX pico_tasks_role ON pico_tasks (session_id, role, id)"))
        conn.execute(
            sa.text(
                "CREATE INDEX pico_tasks_conversation "
                "ON pico_tasks (session_id, conversation_id, role, id)"
            )
        )
        if engine.dialect.name == "sqlite":
            conn.execute(sa.text("ALTER TABLE pico_commits RENAME TO c_old"))
            conn.execute(
                sa.text(
                    "CREATE TABLE pico_commits (session_id VARCHAR(200) NOT NULL, "
                    "last BIGINT NOT NULL, first BIGINT NOT NULL, scope VARCHAR(200) NOT NULL, "
                    "PRIMARY KEY (session_id, last))"
                )
            )
            conn.execute(sa.text("INSERT INTO pico_commits SELECT * FROM c_old"))
            conn.execute(sa.text("DROP TABLE c_old"))
    engine.dispose()


async def test_a_pre_alembic_version_4_database_is_adopted_by_stamping_alone_and_logged(
    fresh_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    h = await pico.Harness.open(fresh_url, session="v4")
    c = await h.root()
    await c.append("user", "written before Alembic")
    await h.close()
    _as_legacy(fresh_url, 4)
    assert _stamp(fresh_url) is None
    # Check: the stamp says 0004 and the log says why; the revisions after 0004 (0005
    # leases, 0006 workers, 0007 deflated bodies) are an ordinary upgrade, behind the opt-in.
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    with caplog.at_level(logging.INFO, logger="pico.storage"):
        h = await pico.Harness.open(fresh_url, session="v4")
    assert any("adopting" in r.getMessage() and "0004" in r.getMessage() for r in caplog.records)
    c = await h.root()
    assert [e.content for e in (await c.entries()).items] == ["written before Alembic"]
    await h.close()
    assert _stamp(fresh_url) == HEAD == "0011"
    assert _drift(fresh_url) == []


async def test_a_pre_alembic_version_3_database_gets_the_v4_layout_and_keeps_its_tasks_and_commits(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await pico.Harness.open(fresh_url, session="v3", definitions=definitions())
    c = await h.root()
    done = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
    first = h.main_head()
    await h.command(lambda tx: tx.patch_task(done, status="killed"))
    live = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
    boundary = h.main_head()
    await h.close()
    _as_legacy(fresh_url, 3)
    assert _layout(fresh_url) == (
        {
            "pico_tasks_role",
            "pico_tasks_conversation",
            "pico_tasks_live",
            "pico_tasks_live_conversation",
        },
        fresh_url.startswith("postgresql"),
    )
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "true")
    h = await pico.Harness.open(fresh_url, session="v3", definitions=definitions())
    assert _stamp(fresh_url) == HEAD
    assert _layout(fresh_url) == (
        {"pico_tasks_by_conversation", "pico_tasks_live", "pico_tasks_live_conversation"},
        True,
    )
    # The commit boundaries survived the rebuild; a position inside no commit is none.
    assert h.reads.is_main_boundary(first) and h.reads.is_main_boundary(boundary)
    assert first < boundary and not h.reads.is_main_boundary(boundary + 1)
    assert [t.id for t in (await h.tasks(role="terminal")).items] == [done]
    assert [t.id for t in (await h.tasks(role="ready")).items] == [live]
    assert [t.id for t in (await h.tasks(conversation_ids=[c.id])).items] == [done, live]
    await h.command(lambda tx: tx.patch_task(live, status="killed"))
    assert [t.id for t in (await h.tasks(role="terminal")).items] == [done, live]
    await h.close()


def _at(url: str, revision: str) -> None:
    """A database created by running the revisions up to ``revision`` (as ``pico db
    upgrade --revision`` does)."""
    engine = _engine(url)
    with engine.begin() as conn:
        schema.upgrade(conn, revision, location=url)
    engine.dispose()


async def test_an_alembic_stamped_older_revision_is_refused_then_opened_with_the_opt_in(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _at(fresh_url, "0002")
    before = _fingerprint(fresh_url)
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    with pytest.raises(pico.SchemaOutdatedError, match=r"pico db sql --from 0002"):
        await pico.Harness.open(fresh_url, session="s")
    assert _fingerprint(fresh_url) == before
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    h = await pico.Harness.open(fresh_url, session="s")
    await (await h.root()).append("user", "hello")
    await h.close()
    assert _stamp(fresh_url) == HEAD and _drift(fresh_url) == []


async def test_a_schema_newer_than_this_pico_is_refused_naming_its_revision(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await pico.Harness.open(fresh_url, session="s")
    await h.close()
    engine = _engine(fresh_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = '0099'"))
    engine.dispose()
    before = _fingerprint(fresh_url)
    # Check: the opt-in does not help (pico never downgrades); read-only is refused too.
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    for read_only in (False, True):
        with pytest.raises(pico.ConfigurationError, match="Upgrade pico") as refused:
            await pico.Harness.open(fresh_url, session="s", read_only=read_only)
        assert "0099" in str(refused.value)
        assert not isinstance(refused.value, pico.SchemaOutdatedError)
    assert _fingerprint(fresh_url) == before


def _bodies(url: str) -> list[bytes]:
    engine = _engine(url)
    with engine.connect() as conn:
        found = [
            bytes(r[0]) for r in conn.execute(sa.text("SELECT state FROM pico_events ORDER BY id"))
        ]
    engine.dispose()
    return found


async def test_a_0006_database_upgrades_to_deflated_bodies_without_rewriting_its_json_rows(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await pico.Harness.open(fresh_url, session="s")
    await (await h.root()).append("user", "written by pico at 0006")
    await h.close()
    # What a pico at 0006 left: the same tables, JSON bodies, the stamp 0006.
    engine = _engine(fresh_url)
    with engine.begin() as conn:
        store_as_json(conn.connection.driver_connection)
        _unnumbered(conn)
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = '0006'"))
    engine.dispose()
    old = _bodies(fresh_url)
    assert old and all(b.startswith(b"{") for b in old)
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    with pytest.raises(pico.SchemaOutdatedError, match="revision 0006"):
        await pico.Harness.open(fresh_url, session="s")
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    h = await pico.Harness.open(fresh_url, session="s")
    c = await h.root()
    # Check: the upgrade rewrote no body; the old rows read as before, next to new ones.
    assert _bodies(fresh_url)[: len(old)] == old
    await c.append("assistant", "written by pico at 0007")
    assert [e.content for e in (await c.entries()).items] == [
        "written by pico at 0006",
        "written by pico at 0007",
    ]
    await h.close()
    new = _bodies(fresh_url)[len(old) :]
    assert new and all(b[0] in (bodies.DEFLATE, bodies.ZSTD) for b in new)
    assert _stamp(fresh_url) == HEAD and _drift(fresh_url) == []
    assert (await pico.verify(fresh_url, session="s")).ok


async def _note_task(h: pico.Harness, conversation_id: int) -> None:
    await h.command(lambda tx: tx.create_task(conversation_id, "note", state=None))


async def _entries(url: str, session: str) -> list[pico.Entry]:
    h = await pico.Harness.open(url, session=session, read_only=True)
    try:
        return list((await (await h.root()).entries()).items)
    finally:
        await h.close()


def _event_log(url: str) -> list[tuple[Any, ...]]:
    """Every stored event as (position, session, stream id, version, topic, body)."""
    engine = _engine(url)
    with engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        if "pico_streams" in names:
            query = sa.select(*EVENT_ROW).select_from(EVENT_LOG)
        else:
            query = sa.select(RELEASE1_EVENTS)
        found = [tuple(r) for r in conn.execute(query.order_by(sa.text("1")))]
    engine.dispose()
    return [(*r[:5], bytes(r[5])) for r in found]


async def test_a_0007_database_numbers_its_streams_and_topics_keeping_every_event_in_place(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revision 0008: the event rows name their stream and topic by number; every event
    keeps its position, stream, version, topic and body, the chain still verifies, and
    new commands carry on after the last position."""
    for session in ("a", "b"):
        h = await pico.Harness.open(fresh_url, session=session, definitions=definitions())
        c = await h.root()
        await c.append("user", f"first of {session}")
        await _note_task(h, c.id)
        await c.append("assistant", f"second of {session}")
        await h.close()
    _as_0007(fresh_url)
    before = _event_log(fresh_url)
    assert len({r[2] for r in before}) >= 4 and len({r[4] for r in before}) >= 4
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    with pytest.raises(pico.SchemaOutdatedError, match="revision 0007"):
        await pico.Harness.open(fresh_url, session="a")
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    h = await pico.Harness.open(fresh_url, session="a", definitions=definitions())
    c = await h.root()
    # Check: the same events at the same positions, read back through the numbers (the
    # open's claim and the append come after them).
    await c.append("user", "after the upgrade")
    await h.close()
    after = _event_log(fresh_url)
    assert after[: len(before)] == before and after[len(before)][0] > before[-1][0]
    assert [e.content for e in (await _entries(fresh_url, "a"))] == [
        "first of a",
        "second of a",
        "after the upgrade",
    ]
    assert _stamp(fresh_url) == HEAD and _drift(fresh_url) == []
    for session in ("a", "b"):
        assert (await pico.verify(fresh_url, session=session)).ok
    # The numbers follow the first events: the first stream and topic are number 1.
    engine = _engine(fresh_url)
    with engine.connect() as conn:
        first = conn.execute(sa.text("SELECT stream_id, topic_id FROM pico_events WHERE id = 1"))
        assert tuple(first.one()) == (1, 1)
    engine.dispose()


#: The read-model tables revision 0011 keys on SQLite (WITHOUT ROWID).
KEYED = (
    "pico_sessions",
    "pico_conversations",
    "pico_context_elements",
    "pico_context_edits",
    "pico_addresses",
    "pico_list_clears",
)
#: Tables with payloads of any size, which keep their rowid.
ROWID = ("pico_entries", "pico_tasks", "pico_values", "pico_value_versions", "pico_list_elements")


def _with_rowids(conn: sa.Connection) -> None:
    """SQLite: rebuild the keyed tables as revision 0010 had them (a rowid table beside
    its key's automatic index), rows and secondary indexes unchanged."""
    for name in KEYED:
        ddl = conn.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": name}
        ).scalar_one()
        indexes = (
            conn.execute(
                sa.text(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :n "
                    "AND sql IS NOT NULL"
                ),
                {"n": name},
            )
            .scalars()
            .all()
        )
        assert ddl.rstrip().upper().endswith("WITHOUT ROWID")
        rowid = ddl.rstrip()[: -len("WITHOUT ROWID")].rstrip()
        conn.execute(sa.text(f"ALTER TABLE {name} RENAME TO old_{name}"))
        conn.execute(sa.text(rowid))
        conn.execute(sa.text(f"INSERT INTO {name} SELECT * FROM old_{name}"))
        conn.execute(sa.text(f"DROP TABLE old_{name}"))
        for index in indexes:
            conn.execute(sa.text(index))


def _keyed(url: str, names: tuple[str, ...] = KEYED) -> dict[str, bool]:
    """Each table of ``names``: is it WITHOUT ROWID (SQLite; always True on PostgreSQL)?"""
    if not url.startswith("sqlite"):
        return dict.fromkeys(names, True)
    conn = sqlite3.connect(url[len("sqlite:///") :])
    ddl = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))
    conn.close()
    return {name: ddl[name].rstrip().upper().endswith("WITHOUT ROWID") for name in names}


def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the read-model tables, in key order."""
    engine = _engine(url)
    found: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for name in KEYED + ROWID:
            table = schema.metadata.tables[name]
            query = table.select().order_by(*table.primary_key.columns)
            found[name] = [tuple(r) for r in conn.execute(query)]
    engine.dispose()
    return found


async def test_a_0010_database_gets_keyed_read_model_tables_keeping_every_row(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revision 0011: on SQLite the read-model tables of small keyed rows are rebuilt
    WITHOUT ROWID (the key is the table), those with payloads of any size keep their
    rowid; every row of every one stays, the session reads and writes on. On PostgreSQL
    only the stamp moves."""
    plan = pico.conversation_value("plugin.plan", str)
    notes = pico.conversation_list("plugin.notes", str)
    flags = pico.session_list("plugin.flags", str, key="k")
    for session in ("a", "b"):
        h = await pico.Harness.open(fresh_url, session=session, definitions=definitions())
        c = await h.root()
        await c.append("user", f"first of {session}")
        await _note_task(h, c.id)
        await c.set_value(plan, f"plan of {session}")
        await c.append_list(notes, "a note")
        await c.clear_list(notes)
        await h.append_list(flags, "on")
        await h.set_value(pico.session_value("plugin.mode", str), "fast")
        await c.append("assistant", f"second of {session}")
        await h.close()
    engine = _engine(fresh_url)
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            _with_rowids(conn)
        conn.execute(sa.text(f"UPDATE {schema.VERSION_TABLE} SET version_num = '0010'"))
    engine.dispose()
    assert not any(_keyed(fresh_url).values()) or not fresh_url.startswith("sqlite")
    before = _rows(fresh_url)
    assert all(before.values()), {n: len(r) for n, r in before.items()}
    monkeypatch.delenv("PICO_UPGRADE_SCHEMA", raising=False)
    with pytest.raises(pico.SchemaOutdatedError, match="revision 0010"):
        await pico.Harness.open(fresh_url, session="a")
    assert _rows(fresh_url) == before
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "1")
    h = await pico.Harness.open(fresh_url, session="a", definitions=definitions())
    await h.close()
    assert _stamp(fresh_url) == HEAD and _drift(fresh_url) == []
    assert all(_keyed(fresh_url).values())
    rowid = _keyed(fresh_url, ROWID)
    assert not any(rowid.values()) or not fresh_url.startswith("sqlite"), rowid
    after = _rows(fresh_url)
    # Check: every row as it was (the open's claim moved only session a's head and owner).
    for name in KEYED + ROWID:
        if name == "pico_sessions":
            assert [r[0] for r in after[name]] == [r[0] for r in before[name]]
            assert after[name][1] == before[name][1]
        else:
            assert after[name] == before[name], name
    for session in ("a", "b"):
        assert (await pico.verify(fresh_url, session=session)).ok
        h = await pico.Harness.open(fresh_url, session=session, definitions=definitions())
        c = await h.root()
        assert await c.get_value(plan) == f"plan of {session}"
        await c.append("user", "after the upgrade")
        await h.close()
        assert [e.content for e in await _entries(fresh_url, session)] == [
            f"first of {session}",
            f"second of {session}",
            "after the upgrade",
        ]


async def test_check_replay_rebuild_and_migrate_refuse_an_older_schema_instead_of_reading_it(
    fresh_url: str, tmp_path: Path
) -> None:
    """The tools that read a database's tables directly refuse one at an older revision as
    an open does (``SchemaOutdatedError``, naming ``pico db upgrade``), rather than read
    the tables they expect and report their absence as damage; nothing is changed."""
    h = await pico.Harness.open(fresh_url, session="a")
    await (await h.root()).append("user", "one")
    await h.close()
    _as_0007(fresh_url)
    before = _fingerprint(fresh_url)
    target = f"jsonl:///{tmp_path / 'copy'}"
    for tool in (
        lambda: pico.check(fresh_url, session="a"),
        lambda: pico.replay(fresh_url, session="a"),
        lambda: pico.rebuild(fresh_url, session="a"),
        lambda: pico.migrate(fresh_url, target, session="a"),
    ):
        with pytest.raises(pico.SchemaOutdatedError, match="pico db upgrade") as refused:
            await tool()
        assert "0007" in str(refused.value)
    assert _fingerprint(fresh_url) == before


@pytest.mark.parametrize(
    ("newest", "marker", "dictionary"),
    # A pico at 0006 reads only JSON bodies; one at 0008 also deflate, not zstd (0009);
    # one at 0009 zstd with dictionaries 12-18, not 19-25 (0010).
    [("0006", bodies.DEFLATE, 0), ("0008", bodies.ZSTD, 0), ("0009", bodies.ZSTD, 19)],
)
async def test_an_older_pico_refuses_newer_bodies_as_newer_instead_of_calling_them_corrupt(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch, newest: str, marker: int, dictionary: int
) -> None:
    h = await pico.Harness.open(fresh_url, session="s")
    await (await h.root()).append("user", "compressed")
    await h.close()
    assert any(b[0] == marker and b[1] >= dictionary for b in _bodies(fresh_url))
    # The schema check of a pico whose newest revision is ``newest``.
    revisions = schema.REVISIONS
    monkeypatch.setattr(schema, "REVISIONS", revisions[: revisions.index(newest) + 1])
    for read_only in (False, True):
        with pytest.raises(pico.ConfigurationError, match="Upgrade pico") as refused:
            await pico.Harness.open(fresh_url, session="s", read_only=read_only)
        assert f"revision {HEAD}" in str(refused.value)
        assert not isinstance(refused.value, pico.StorageCorruptError)


def test_an_invalid_opt_in_value_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pico.infrastructure.settings import settings_for

    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "perhaps")
    with pytest.raises(pico.ConfigurationError, match="upgrade_schema"):
        settings_for(f"sqlite:///{tmp_path / 'x.db'}", session="s")
    monkeypatch.setenv("PICO_UPGRADE_SCHEMA", "yes")
    assert settings_for("memory://", session="s").upgrade_schema is True
    assert settings_for("memory://", session="s", upgrade_schema=False).upgrade_schema is False


def _replayed(url: str) -> None:
    """Every revision, 0001 to head, run by Alembic from an empty database. (``_at(url,
    "head")`` on an empty database creates the model and stamps it instead: a test of the
    revisions must first stop short of head.)"""
    _at(url, schema.REVISIONS[0])
    _at(url, "head")


def test_the_revisions_build_exactly_the_model(fresh_url: str) -> None:
    """A model change without a revision (or a revision without the model change) fails
    here: autogenerate finds no difference between head and ``schema.metadata``."""
    _replayed(fresh_url)
    assert _stamp(fresh_url) == HEAD
    assert _drift(fresh_url) == []
    assert _layout(fresh_url)[1] is True


def test_a_fresh_database_created_from_the_model_is_the_one_the_revisions_build(
    tmp_path: Path,
) -> None:
    """A fresh open creates the model and stamps head (faster than replaying every
    revision); on SQLite the stored DDL is the same text either way, so the two paths
    cannot drift (WITHOUT ROWID included, which autogenerate does not compare)."""
    replayed, created = f"sqlite:///{tmp_path / 'r.db'}", f"sqlite:///{tmp_path / 'c.db'}"
    _replayed(replayed)
    engine = _engine(created)
    with engine.begin() as conn:
        schema.ensure(conn, upgrade=False, location="c.db", url=created, dialect="sqlite")
    engine.dispose()

    def ddl(url: str) -> dict[str, str]:
        conn = sqlite3.connect(url[len("sqlite:///") :])
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        conn.close()
        # A table a revision rebuilt (batch mode's copy and rename: 0004, 0011) is stored
        # under its quoted name by SQLite's RENAME; the same table either way.
        return {
            name: " ".join(sql.replace(f'CREATE TABLE "{name}"', f"CREATE TABLE {name}").split())
            for name, sql in rows
        }

    assert ddl(replayed) == ddl(created)
    assert _stamp(replayed) == _stamp(created) == HEAD


def test_the_revision_list_an_open_compares_against_is_the_scripts_history() -> None:
    """Opening compares with ``schema.REVISIONS`` without importing Alembic; a revision
    script added without extending the list (or a list entry without a script) fails."""
    assert schema.script_revisions() == schema.REVISIONS
    assert schema.head_revision() == schema.REVISIONS[-1]
    assert [rev for rev, _, _ in schema.history()] == list(schema.REVISIONS)


def test_opening_a_database_at_head_does_not_import_alembic(tmp_path: Path) -> None:
    """Alembic costs hundreds of milliseconds to import: only a schema change pays it."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'head.db'}"
    code = (
        "import asyncio, sys, pico\n"
        "async def main():\n"
        f"    h = await pico.Harness.open({url!r}, session='s')\n"
        "    await (await h.root()).append('user', 'x')\n"
        "    await h.close()\n"
        "asyncio.run(main())\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", done.stdout


async def test_processes_opening_an_old_postgresql_database_at_once_upgrade_it_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both opens wait on the schema lock (held here until both are seen waiting); the
    first upgrades, the second finds head under the lock and changes nothing."""
    import threading
    import time

    from pico.infrastructure.sql.store import SqlDatabase

    with scratch_postgres("concurrent upgrades") as url:
        await _release1_database(url, tmp_path)
        errors: list[BaseException] = []

        def open_it() -> None:
            try:
                SqlDatabase(
                    url.replace("postgresql://", "postgresql+psycopg://", 1), upgrade_schema=True
                ).close()
            except BaseException as exc:
                errors.append(exc)

        with psycopg.connect(url, autocommit=True) as holder, caplog.at_level(logging.INFO):
            holder.execute("SELECT pg_advisory_lock(7305729)")
            threads = [threading.Thread(target=open_it) for _ in range(2)]
            for t in threads:
                t.start()
            for _ in range(600):
                waiting = holder.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND objid = 7305729 AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                ).fetchone()
                if waiting is not None and waiting[0] == 2:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the two opens never waited on the schema lock")
            holder.execute("SELECT pg_advisory_unlock(7305729)")
            for t in threads:
                t.join(timeout=60)
        assert errors == []
        assert _stamp(url) == HEAD and _drift(url) == []
        upgrades = [r for r in caplog.records if r.getMessage().startswith("upgrading")]
        adoptions = [r for r in caplog.records if r.getMessage().startswith("adopting")]
        assert (len(upgrades), len(adoptions)) == (1, 1)
