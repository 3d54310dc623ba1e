"""``pico replay`` and ``pico rebuild``: the read model is derived, the events are the
truth (issue 13, "Rebuild and replay"; seed 003 §7.6, §10.1).

``replay`` projects a session's events, in their original batches, through the pure
projector into FRESH tables (a private in-memory SQLite database holding the same §7.6
tables, written by the same projection writer the recorder uses) and compares them with
the live read model table by table, row by row. It only reads: SQLite is opened
``mode=ro``, PostgreSQL in a ``READ ONLY`` repeatable-read transaction (one snapshot for
the events and the rows), a JSONL journal without its lock.

``rebuild`` replaces one session's read model with the replay, atomically: in ONE
transaction that holds the session's write lock (SQLite ``BEGIN IMMEDIATE``, the file's;
PostgreSQL the session's advisory lock, the one an opening claim takes),
it reads the events, deletes the session's rows and inserts the rebuilt ones. No writer
commits in between: an owner that is running waits for the lock and its next commit lands
on the rebuilt rows. A failure anywhere rolls back and leaves the old read model.
Working-scope rows (streaming frames, checkpoints: values and list elements of
``working/...`` scopes and their addresses) are not history and no event produces them:
they are kept as they are. A JSONL session keeps no read model on disk (every open
rebuilds it from the journal), so ``rebuild`` there replaces nothing and only verifies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from pico.domain.errors import (
    ConfigurationError,
    StorageCorruptError,
    StorageUnavailableError,
    UnknownSessionError,
)
from pico.infrastructure.jsonl.store import JsonlStore, live_writer
from pico.infrastructure.memory import named_database
from pico.infrastructure.settings import mask_url, settings_for
from pico.infrastructure.sql import schema as t
from pico.infrastructure.sql.bodies import DEFLATED_COLUMNS, encode_text
from pico.infrastructure.sql.store import SESSION_LOCK
from pico.infrastructure.storage import make_mapper
from pico.infrastructure.verify import (
    READ_MODEL,
    EventReplay,
    Findings,
    Replica,
    RowDiff,
    diff_rows,
    has_session,
    jsonl_journal,
    memory_diffs,
    require_head,
    session_events,
    sql_engine,
    table_rows,
    working_rows,
)
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import project

__all__ = ["MAX_ROWS", "RebuildReport", "ReplayReport", "TableDiff", "rebuild", "replay"]

#: How long a rebuild waits for the database's write lock (a writing owner) before it gives
#: up with ``StorageUnavailableError``.
LOCK_TIMEOUT_S = 30

#: At most this many differing rows are listed per table; the rest are counted.
MAX_ROWS = 20

#: JSONL's read model: what both reports say about it.
JSONL_NOTE = (
    "a JSONL session keeps no read model on disk: every open rebuilds it from the journal, "
    "so the comparison is with the read model an open builds (its live owner's, when that "
    "owner is in this process)"
)


@dataclass(frozen=True)
class TableDiff:
    """The differences found in one table: how many rows differ, the first ``MAX_ROWS``."""

    table: str
    differing: int
    rows: tuple[RowDiff, ...]


@dataclass(frozen=True)
class ReplayReport:
    """What ``replay`` compared. ``equal`` when the live read model is the replay's."""

    session: str
    events: int  # events replayed
    tables: tuple[str, ...]  # tables compared
    differences: tuple[TableDiff, ...] = ()  # only tables with differences
    #: Event-level problems the replay met and went past (a version gap, a batch without
    #: its boundary): ``pico check`` says more.
    warnings: tuple[str, ...] = ()
    note: str = ""

    @property
    def equal(self) -> bool:
        return not self.differences

    @property
    def differing(self) -> int:
        """Rows that differ, in all tables."""
        return sum(d.differing for d in self.differences)

    def lines(self) -> list[str]:
        """The report as text: every listed row, then a count per table, then a summary."""
        out: list[str] = []
        for diff in self.differences:
            out.extend(str(row) for row in diff.rows)
            if diff.differing > len(diff.rows):
                out.append(f"{diff.table}: {diff.differing - len(diff.rows)} more row(s) differ")
        out.extend(f"warning: {w}" for w in self.warnings)
        if self.note:
            out.append(f"note: {self.note}")
        if self.equal:
            out.append(
                f"session {self.session!r}: {self.events} events replayed; the read model "
                f"equals the replay in all {len(self.tables)} tables"
            )
        else:
            per = ", ".join(f"{d.table} {d.differing}" for d in self.differences)
            out.append(
                f"session {self.session!r}: {self.events} events replayed; {self.differing} "
                f"row(s) differ ({per})"
            )
        return out


@dataclass(frozen=True)
class RebuildReport:
    """What ``rebuild`` replaced: per table, (rows deleted, rows inserted)."""

    session: str
    events: int
    #: The rows that differed from the replay before the rebuild (what it repaired).
    repaired: int
    replaced: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Tables that were missing and were created.
    created: tuple[str, ...] = ()
    note: str = ""

    def lines(self) -> list[str]:
        out = [f"note: {self.note}"] if self.note else []
        if self.created:
            out.append("created the missing table(s) " + ", ".join(self.created))
        rows = sum(inserted for _, inserted in self.replaced.values())
        what = (
            f"{self.repaired} row(s) differed and were repaired"
            if self.repaired
            else "nothing differed"
        )
        if self.replaced:
            out.append(
                f"session {self.session!r}: read model rebuilt from {self.events} events "
                f"({rows} rows in {len(self.replaced)} tables); {what}"
            )
        else:
            out.append(f"session {self.session!r}: {self.events} events verified; {what}")
        return out


async def replay(url: str, *, session: str = "main") -> ReplayReport:
    """Rebuild a session's read model from its events into fresh tables and compare it
    with the live read model, row by row. Reads only.

    Args:
        url: ``sqlite:///path.db``, ``postgresql://...``, ``jsonl:///dir`` or
            ``memory://name`` (a named database of this process).
        session: the session to replay.

    Returns:
        The report: equal, or the differing rows (at most ``MAX_ROWS`` listed per table,
        all counted).

    Raises:
        ConfigurationError: the URL or session name is not one pico takes.
        UnknownSessionError: no such file, no pico tables, or no such session.
        StorageUnavailableError: the server cannot be reached; the file or directory is
            missing.
        StorageCorruptError: an event does not decode or cannot be replayed (its
            position named); nothing is compared then.
    """
    settings_for(url, session=session, read_only=True)
    return await asyncio.to_thread(_replay, url, session)


async def rebuild(url: str, *, session: str = "main") -> RebuildReport:
    """Replace one session's read model with one rebuilt from its events, atomically,
    under the database's write lock (see the module docstring). Working-scope rows are
    kept. On JSONL nothing is replaced (there is no stored read model): the journal is
    replayed and verified.

    Raises:
        ConfigurationError: the URL is not sqlite, postgresql or jsonl.
        UnknownSessionError: no such file, no pico tables, or no such session.
        StorageUnavailableError: the server cannot be reached, the file cannot be
            written, or the write lock was not granted in time.
        StorageCorruptError: an event does not decode, cannot be replayed, or the log has
            a version gap or an unfinished batch: nothing is replaced (a rebuild from
            damaged events would bake the damage in; ``pico check`` lists it).
    """
    settings_for(url, session=session, read_only=True)
    if url.startswith("memory://"):
        raise ConfigurationError(
            "rebuild works on sqlite:///, postgresql:// and jsonl:/// storage; a memory:// "
            "read model lives and dies with its process (pico replay compares it)"
        )
    return await asyncio.to_thread(_rebuild, url, session)


# ---------------------------------------------------------------------------- replay


def _replay(url: str, session: str) -> ReplayReport:
    if url.startswith("memory://"):
        return _replay_memory(url, session)
    if url.startswith("jsonl:///"):
        return _replay_jsonl(Path(url[len("jsonl:///") :]), session)
    engine, where = sql_engine(url, what="replay")
    try:
        with _reading(engine, where) as conn:
            present = _require_session(conn, session, where)
            replica = Replica(session)
            try:
                count, warnings = _project_events(conn, session, replica, where)
                diffs = [
                    _table_diff(
                        table,
                        table_rows(conn, table, session, commits=False)
                        if table.name in present
                        else iter(()),
                        replica.rows(table, commits=False),
                    )
                    for table in READ_MODEL
                ]
            finally:
                replica.close()
    finally:
        engine.dispose()
    missing = [
        f"table {table.name} is missing" for table in READ_MODEL if table.name not in present
    ]
    return ReplayReport(
        session,
        count,
        tuple(table.name for table in READ_MODEL),
        tuple(d for d in diffs if d.differing),
        (*missing, *warnings),
    )


def _table_diff(
    table: sa.Table,
    live: Iterator[Any],
    rebuilt: Iterator[Any],
    *,
    ignore: frozenset[str] = frozenset(),
) -> TableDiff:
    rows: list[RowDiff] = []
    n = 0
    for diff in diff_rows(table, live, rebuilt, ignore=ignore):
        n += 1
        if n <= MAX_ROWS:
            rows.append(diff)
    return TableDiff(table.name, n, tuple(rows))


@contextmanager
def _reading(engine: Engine, where: str) -> Iterator[Connection]:
    """One read-only transaction (one snapshot) on ``engine``."""
    postgres = engine.dialect.name == "postgresql"
    try:
        conn = engine.connect()
    except sa.exc.OperationalError as exc:
        raise StorageUnavailableError(
            f"cannot open {where}: {_short(exc.orig)}; check that the server runs (or the "
            "file is readable) and the URL"
        ) from exc
    with conn:
        if postgres:
            conn = conn.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        with _translating(where), conn.begin():
            yield conn


@contextmanager
def _translating(where: str) -> Iterator[None]:
    try:
        yield
    except sa.exc.OperationalError as exc:
        raise StorageUnavailableError(
            f"{where} failed: {_short(exc.orig)}; check the server or the file"
        ) from exc
    except sa.exc.DatabaseError as exc:
        raise StorageCorruptError(
            f"{where} cannot be read: {_short(exc.orig)}; nothing was changed. pico check "
            "URL --session S reports what is damaged"
        ) from exc


def _require_session(conn: Connection, session: str, where: str) -> set[str]:
    require_head(conn, where)
    present = set(sa.inspect(conn).get_table_names())
    if t.events.name not in present or not has_session(conn, session, present):
        raise UnknownSessionError(session)
    return present


def _project_events(
    conn: Connection, session: str, replica: Replica, where: str
) -> tuple[int, tuple[str, ...]]:
    """Feed the session's events, batch by batch, into ``replica``. An event that does
    not decode (or a batch that does not replay) is ``StorageCorruptError`` naming its
    position; other event-level findings come back as warnings."""
    findings = Findings()
    replay = EventReplay(findings, replica.apply)
    for position, stored in session_events(conn, session):
        replay.feed(position, stored)
        if not replay.decodable:
            break
    replay.finish()
    return replay.count, _settle(findings, replay, where, session)


def _settle(findings: Findings, replay: EventReplay, where: str, session: str) -> tuple[str, ...]:
    found = findings.result()
    if not replay.decodable:
        first = next(f for f in found if f.kind == "decode")
        raise StorageCorruptError(
            f"{where}: session {session!r}: {first.message}; nothing was compared or "
            "changed. pico check URL --session S lists every damaged event"
        )
    return tuple(str(f) for f in found)


# ------------------------------------------------------------------- memory and JSONL


def _replay_memory(url: str, session: str) -> ReplayReport:
    name = url[len("memory://") :]
    if not name:
        raise ConfigurationError(
            "memory:// is private to the handle that opened it; replay a named database "
            "(memory://name) from the same process instead"
        )
    db = named_database(name)
    with db.lock:
        log = db.session_log(session)
        live = db.read_stores.get(session)
    if not log and live is None:
        raise UnknownSessionError(session)
    return _compare_log(session, url, log, live, "")


def _compare_log(
    session: str, where: str, log: list[Any], live: MemoryReadStore | None, note: str
) -> ReplayReport:
    replica = MemoryReadStore(session)
    findings = Findings()
    replay = EventReplay(findings, lambda batch: replica.apply(project(batch)))
    for i, stored in enumerate(log):
        replay.feed(i + 1, stored)
    replay.finish()
    warnings = _settle(findings, replay, where, session)
    diffs: dict[str, list[RowDiff]] = {}
    if live is not None:
        with live.lock:
            for diff in memory_diffs(live, replica):
                diffs.setdefault(diff.table, []).append(diff)
    tables = tuple(
        attr.lstrip("_") for attr in sorted(vars(replica)) if attr not in ("lock", "session_id")
    )
    return ReplayReport(
        session,
        replay.count,
        tables,
        tuple(TableDiff(k, len(v), tuple(v[:MAX_ROWS])) for k, v in diffs.items()),
        warnings,
        note,
    )


def _replay_jsonl(directory: Path, session: str) -> ReplayReport:
    journal = jsonl_journal(directory, session, what="replay")
    owner = live_writer(directory, session)
    with owner.db.lock if owner is not None else nullcontext():
        store = JsonlStore(directory, session, durability="process", read_only=True)
        try:
            store.open(make_mapper())
        finally:
            store.close()
        live = owner.read_store if owner is not None else store.read_store
        log = store.db.session_log(session)
        return _compare_log(session, str(journal.main), log, live, JSONL_NOTE)


# --------------------------------------------------------------------------- rebuild

#: Called inside the rebuild's transaction after the old rows are deleted and before the
#: new ones are inserted (tests force a crash there: the old read model must survive).
_between: Callable[[], None] | None = None


def _rebuild(url: str, session: str) -> RebuildReport:
    if url.startswith("jsonl:///"):
        report = _replay_jsonl(Path(url[len("jsonl:///") :]), session)
        if not report.equal:  # the journal's replay IS the read model of every open
            raise StorageCorruptError(
                f"session {session!r}: the read model this process's owner answers from "
                f"differs from its journal in {report.differing} row(s): the journal "
                "changed behind the owner's back; close the owner and reopen (the journal "
                "is the truth)"
            )
        return RebuildReport(session, report.events, 0, note=JSONL_NOTE)
    engine, where = _writing_engine(url)
    try:
        with _writing(engine, where) as conn:
            return _rebuild_sql(conn, session, where)
    finally:
        engine.dispose()


def _rebuild_sql(conn: Connection, session: str, where: str) -> RebuildReport:
    present = _require_session(conn, session, where)
    if conn.dialect.name == "postgresql":  # SQLite's BEGIN IMMEDIATE already holds it
        # As long as SQLite's busy_timeout: a writer holding the lock longer makes this a
        # StorageUnavailableError, never an endless wait. The session's write lock (the
        # advisory lock its claim and every write transaction of its owner take first:
        # sql/writer.py SESSION_LOCK) holds off that session's owner for the rebuild's
        # length, and no other session.
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_S}s'")
        conn.exec_driver_sql(SESSION_LOCK, (session,))
    replica = Replica(session)
    try:
        count, warnings = _project_events(conn, session, replica, where)
        if warnings:
            raise StorageCorruptError(
                f"{where}: session {session!r}: {warnings[0]}; nothing was replaced (a "
                "rebuild from damaged events would keep the damage). pico check URL "
                "--session S lists every finding"
            )
        repaired = 0
        for table in READ_MODEL:
            if table.name in present:
                repaired += sum(
                    1
                    for _ in diff_rows(
                        table,
                        table_rows(conn, table, session, commits=False),
                        replica.rows(table, commits=False),
                    )
                )
            else:
                repaired += sum(1 for _ in replica.rows(table, commits=False))
        created = [table for table in READ_MODEL if table.name not in present]
        if created:
            t.metadata.create_all(conn, tables=created)
        deleted: dict[str, int] = {}
        for table in READ_MODEL:
            q = table.delete().where(table.c.session_id == session)
            working = working_rows(table, commits=False)
            if working is not None:
                q = q.where(~working)
            deleted[table.name] = conn.execute(q).rowcount
        if _between is not None:
            _between()
        replaced: dict[str, tuple[int, int]] = {}
        for table in READ_MODEL:
            names = [c.name for c in table.columns]
            inserted = 0
            chunk: list[dict[str, Any]] = []
            for row in replica.rows(table, commits=False):
                values = dict(zip(names, row, strict=True))
                # Rows read with their deflated columns as JSON text (table_rows).
                for name, topic in DEFLATED_COLUMNS.get(table.name, {}).items():
                    if values[name] is not None:
                        values[name] = encode_text(topic, values[name])
                chunk.append(values)
                if len(chunk) >= 1000:
                    conn.execute(table.insert(), chunk)
                    inserted += len(chunk)
                    chunk = []
            if chunk:
                conn.execute(table.insert(), chunk)
                inserted += len(chunk)
            replaced[table.name] = (deleted[table.name], inserted)
    finally:
        replica.close()
    return RebuildReport(session, count, repaired, replaced, tuple(x.name for x in created))


def _writing_engine(url: str) -> tuple[Engine, str]:
    """A writing engine that never creates a database: SQLite must be an existing file."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not path.is_file():
            raise StorageUnavailableError(
                f"there is no SQLite file at {path}; check the path (rebuild never creates one)"
            )
        engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)

        @sa_event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.isolation_level = None
            dbapi_conn.execute(f"PRAGMA busy_timeout={LOCK_TIMEOUT_S * 1000}")

        @sa_event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock, before any read

        return engine, str(path)
    engine = sa.create_engine(
        "postgresql+psycopg://" + url.split("://", 1)[1], poolclass=sa.pool.NullPool
    )
    return engine, mask_url(url)


@contextmanager
def _writing(engine: Engine, where: str) -> Iterator[Connection]:
    """One write transaction holding the database's write lock (see the module
    docstring); it commits when the block ends and rolls back on any failure."""
    try:
        conn = engine.connect()
    except sa.exc.OperationalError as exc:
        raise StorageUnavailableError(
            f"cannot open {where}: {_short(exc.orig)}; check that the server runs (or the "
            "file is writable) and the URL"
        ) from exc
    with conn, _translating(where), conn.begin():
        yield conn


def _short(exc: BaseException | None) -> str:
    text = " ".join(str(exc).split()) if exc is not None else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
