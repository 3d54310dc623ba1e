"""``pico check``: verify a stored session on demand, reading only (issue 10, "Damaged
files"; seed 003 §7.5 spirit: never silently lose or rewrite history).

Opens the storage read-only at the driver level (SQLite ``mode=ro``; a PostgreSQL read-only
transaction; a JSONL journal through its ordinary read-only open, which takes no lock and
writes nothing) and checks: SQLite's ``PRAGMA integrity_check``, that every event of the
session decodes, that event versions are contiguous per aggregate, that the log ends with
a batch boundary, that every commit matches its hash chain link (``chain``), and that the
read model equals a replay of the events through the pure projector into a fresh
in-memory read store, table by table. Damage a cheap open cannot
see (a read-model row changed behind pico's back, a deleted event row, an event body
changed to other valid JSON, a damaged snapshot) is found here. Working-scope rows are not
history (they are not events) and are left out of the comparison.

A JSONL session has no stored read model: it is rebuilt from the journal on every open. Its
journal is replayed and compared with the read model the session answers from: its live
owner's, when that owner is in this process (so an event changed in the file behind the
owner's back is found), else the one the read-only open built; without an owner an event
edited in the file is found by the hash chain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import StoredEvent
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from pico.domain.errors import (
    ConfigurationError,
    StorageCorruptError,
    StorageUnavailableError,
    UnknownSessionError,
)
from pico.infrastructure.chain import ChainWalk
from pico.infrastructure.jsonl.journal import Journal
from pico.infrastructure.jsonl.store import JsonlStore, live_writer
from pico.infrastructure.memory import MemoryDatabase, named_database
from pico.infrastructure.settings import mask_url, settings_for
from pico.infrastructure.sql import schema as t
from pico.infrastructure.sql.bodies import DEFLATED_COLUMNS, readable, stored_text
from pico.infrastructure.sql.recorder import event_from_row
from pico.infrastructure.sql.store import SqlProjectionWriter, read_only_connector
from pico.infrastructure.storage import BATCH_END, aggregate_name, make_mapper
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import project

__all__ = ["CheckReport", "Finding", "check", "replayed_read_store"]

#: At most this many findings of one kind are listed; the rest are counted.
MAX_PER_KIND = 10

# The read model (§7.6) in comparison order; each is compared row by row on its key.
READ_MODEL: tuple[sa.Table, ...] = (
    t.sessions,
    t.commits,
    t.conversations,
    t.entries,
    t.context_elements,
    t.context_edits,
    t.addresses,
    t.values,
    t.value_versions,
    t.list_elements,
    t.list_clears,
    t.tasks,
)


@dataclass(frozen=True)
class Finding:
    """One thing ``check`` found wrong.

    Attributes:
        kind: ``storage`` (the file cannot be read), ``integrity`` (SQLite's page check),
            ``decode`` (an event body does not decode or replay), ``versions`` (a gap in an
            aggregate's event versions), ``batch`` (events after the last boundary),
            ``snapshot`` (a stored snapshot does not decode or is newer than its events),
            or ``read model`` (a row differs from the replay of the events).
        message: what is wrong, with the position, aggregate or row ids involved.
        position: the event's storage position, where one is involved.
    """

    kind: str
    message: str
    position: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class CheckReport:
    """What ``check`` verified. ``ok`` when nothing was found."""

    session: str
    events: int  # events of the session that were read
    findings: tuple[Finding, ...]
    skipped: tuple[str, ...] = ()  # checks this backend cannot run, and why

    @property
    def ok(self) -> bool:
        return not self.findings


async def check(url: str, *, session: str = "main") -> CheckReport:
    """Verify one stored session without writing anything.

    Args:
        url: a storage URL (``sqlite:///path.db``, ``memory://name``, ``postgresql://...``,
            ``jsonl:///dir``).
        session: the session to verify.

    Returns:
        A report listing every finding; damage is a finding, not an exception.

    Raises:
        ConfigurationError: the URL is not one pico can check.
        UnknownSessionError: there is no such file, no pico tables, no such session, or
            (JSONL) no journal for the session in the directory.
        StorageUnavailableError: the PostgreSQL server cannot be reached; the SQLite file
            or the JSONL directory is missing or is not a file or directory.
    """
    # The one configuration gate: the same rules, and errors, as Harness.open.
    settings_for(url, session=session, read_only=True)
    return await asyncio.to_thread(_check, url, session)


def replayed_read_store(session_id: str, batches: Iterable[Sequence[Any]]) -> MemoryReadStore:
    """A fresh in-memory read model fed by replaying event batches through the pure
    projector: the §10.1 oracle, and what ``check`` compares a memory session with."""
    store = MemoryReadStore(session_id)
    for batch in batches:
        store.apply(project(batch))
    return store


# ---------------------------------------------------------------------------- the checks


@dataclass
class Findings:
    items: list[Finding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, message: str, position: int | None = None) -> None:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= MAX_PER_KIND:
            self.items.append(Finding(kind, message, position))

    def result(self) -> tuple[Finding, ...]:
        extra = [
            Finding(kind, f"{n - MAX_PER_KIND} more {kind} finding(s) not listed")
            for kind, n in self.counts.items()
            if n > MAX_PER_KIND
        ]
        return (*self.items, *extra)


class EventReplay:
    """Decodes the session's events in storage order, checks versions and boundaries, and
    hands each complete batch to ``sink`` (which projects it into the fresh store)."""

    def __init__(
        self, findings: Findings, sink: Callable[[list[Any]], None], *, chain: bool = False
    ) -> None:
        self.findings = findings
        self.sink = sink
        #: With ``chain``, the hash chain is recomputed in the same walk (``pico check``):
        #: a batch that does not match its link, or anchored history that changed, is a
        #: ``chain`` finding (a tail or an undecodable event is already its own finding).
        self.chain = ChainWalk("") if chain else None
        self.mapper = make_mapper()
        self.count = 0
        self.decodable = True  # False once an event failed: the replay is incomplete
        self._versions: dict[UUID, int] = {}
        self._names: dict[UUID, str] = {}
        self._batch: list[Any] = []
        self._batch_start: int | None = None
        self._last = 0

    def feed(self, position: int, stored: StoredEvent) -> None:
        if self.chain is not None:
            self.chain.feed(position, stored)
        self.count += 1
        self._last = position
        oid = UUID(str(stored.originator_id))
        version = stored.originator_version
        event: Any = None
        try:
            event = self.mapper.to_domain_event(stored)
            self._names[oid] = aggregate_name(event)
        except Exception as exc:
            self.decodable = False
            self.findings.add(
                "decode",
                f"the event at position {position} ({self._name(oid)}, version {version}, "
                f"{stored.topic}) does not decode: {_short(exc)}",
                position,
            )
        self._check_version(oid, version, position)
        if event is None:
            return
        if self._batch_start is None:
            self._batch_start = position
        self._batch.append(event)
        if isinstance(event, BATCH_END):
            start, batch = self._batch_start, self._batch
            self._batch, self._batch_start = [], None
            if self.decodable:
                try:
                    self.sink(batch)
                except Exception as exc:
                    self.decodable = False
                    self.findings.add(
                        "decode",
                        f"the batch at positions {start}..{position} decodes but cannot be "
                        f"replayed through the projector: {_short(exc)}",
                        start,
                    )

    def snapshot(self, oid: UUID, version: int, topic: str, body: bytes) -> None:
        """A stored snapshot must decode and must not be newer than its stream's events
        (a reload would start from it and silently skip the missing history)."""
        last = self._versions.get(oid, 0)
        if version > last:
            self.findings.add(
                "snapshot",
                f"{self._name(oid)}: a snapshot at version {version} is newer than its last "
                f"stored event (version {last}): events are missing",
            )
        try:
            self.mapper.to_domain_event(StoredEvent(oid, version, topic, body))
        except Exception as exc:
            self.findings.add(
                "snapshot",
                f"{self._name(oid)}: the snapshot at version {version} does not decode: "
                f"{_short(exc)}",
            )

    @property
    def streams(self) -> list[UUID]:
        return list(self._versions)

    def _name(self, oid: UUID) -> str:
        return self._names.get(oid, f"stream {oid.hex}")

    def _check_version(self, oid: UUID, version: int, position: int) -> None:
        before = self._versions.get(oid, 0)
        self._versions[oid] = max(version, before)
        if version == before + 1:
            return
        if version <= before:
            problem = f"repeats or goes back after version {before}"
        else:
            gap = _span(before + 1, version - 1)
            after = "is its first event" if before == 0 else f"follows version {before}"
            problem = f"{after}: {gap} missing"
        self.findings.add(
            "versions",
            f"{self._name(oid)}: version {version} at position {position} {problem}",
            position,
        )

    def finish(self) -> None:
        if self.chain is not None:
            for found in self.chain.finish().breaks:
                if found.kind in ("link", "anchor"):
                    self.findings.add("chain", str(found), found.position)
        if self._batch:
            self.findings.add(
                "batch",
                f"{len(self._batch)} event(s) at positions {self._batch_start}..{self._last} "
                "end without a Session.Committed or Session.Claimed boundary (a partial or "
                "cut batch)",
                self._batch_start,
            )


def _check(url: str, session: str) -> CheckReport:
    findings = Findings()
    skipped: tuple[str, ...] = ()
    if url.startswith("memory://"):
        return _check_memory(url, session, findings)
    if url.startswith("jsonl:///"):
        return _check_jsonl(Path(url[len("jsonl:///") :]), session, findings)
    engine, where = sql_engine(url)
    if engine.dialect.name == "postgresql":
        skipped = (
            "the page-level integrity check (PostgreSQL has none without the amcheck "
            "extension; every row of the session is still read and compared)",
        )
    try:
        count = _check_sql(engine, session, where, findings)
    finally:
        engine.dispose()
    return CheckReport(session, count, findings.result(), skipped)


def sql_engine(url: str, *, what: str = "check") -> tuple[Engine, str]:
    """A reading engine for a ``sqlite:///`` or PostgreSQL URL, and the place messages
    name: SQLite read-only at the driver (a missing file is refused, never created);
    PostgreSQL on a plain engine whose transactions the caller makes read-only."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if path.is_dir():
            raise StorageUnavailableError(f"{path} is a directory; give the SQLite file's path")
        if not path.exists():
            raise StorageUnavailableError(
                f"there is no SQLite file at {path}; check the path ({what} never creates one)"
            )
        return sqlite_read_only(path), str(path)
    engine = sa.create_engine(
        "postgresql+psycopg://" + url.split("://", 1)[1], poolclass=sa.pool.NullPool
    )
    return engine, mask_url(url)


def sqlite_read_only(path: Path) -> Engine:
    """A read-only SQLite engine: ``mode=ro`` at the driver, one read transaction per
    connection, nothing that writes (no journal-mode or schema change)."""
    engine = sa.create_engine(
        "sqlite://", creator=read_only_connector(path), poolclass=sa.pool.StaticPool
    )

    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # our BEGIN, below: one snapshot for the check

    @sa_event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def require_head(conn: Connection, where: str) -> None:
    """Refuse a database whose pico schema is not this pico's, as a read-only open does
    (an older one: ``SchemaOutdatedError`` naming ``pico db upgrade``; a newer one:
    ``ConfigurationError``): its tables are not the ones this code reads, and reading
    them would report damage that is not there. A database without pico's tables passes
    (its session is then unknown)."""
    dialect = conn.dialect.name
    url = f"sqlite:///{where}" if dialect == "sqlite" else where
    t.check(
        t.read_state(conn), upgrade=False, read_only=True, location=where, url=url, dialect=dialect
    )


def _check_sql(engine: Engine, session: str, where: str, findings: Findings) -> int:
    postgres = engine.dialect.name == "postgresql"
    try:
        conn = engine.connect()
    except sa.exc.OperationalError as exc:
        if postgres:
            raise StorageUnavailableError(
                f"cannot reach {where}: {_short(exc.orig)}; check that the server runs and "
                "the URL's host, port, user and database"
            ) from exc
        findings.add("storage", f"{where} cannot be opened: {_short(exc.orig)}")
        return 0
    replica = Replica(session)
    replay = EventReplay(findings, replica.apply, chain=True)
    try:
        with conn:
            if postgres:
                conn = conn.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            with conn.begin():
                if not postgres and not _integrity(conn, where, findings):
                    return 0
                require_head(conn, where)
                present = set(sa.inspect(conn).get_table_names())
                if t.events.name not in present:
                    raise UnknownSessionError(session)
                if not has_session(conn, session, present):
                    raise UnknownSessionError(session)
                for position, stored in session_events(conn, session):
                    replay.feed(position, stored)
                replay.finish()
                if t.snapshots.name in present:
                    _check_snapshots(conn, replay)
                if replay.decodable:
                    for table in READ_MODEL:
                        if table.name not in present:
                            findings.add("read model", f"table {table.name} is missing")
                            continue
                        _compare(
                            table,
                            table_rows(conn, table, session),
                            replica.rows(table),
                            findings,
                        )
                else:
                    findings.add(
                        "read model",
                        "not compared: the replay stopped at the first event that does not decode",
                    )
    except sa.exc.DatabaseError as exc:
        if postgres and isinstance(exc, sa.exc.OperationalError):
            raise StorageUnavailableError(
                f"{where} failed during the check: {_short(exc.orig)}; check the server"
            ) from exc
        findings.add("storage", f"{where} cannot be read: {_short(exc.orig)}")
    except StorageCorruptError as exc:
        findings.add("storage", str(exc))
    finally:
        replica.close()
    return replay.count


def session_events(
    conn: Connection, session: str, *, after: int = 0
) -> Iterator[tuple[int, StoredEvent]]:
    """The session's stored events after position ``after``, in storage order, streamed
    (``yield_per``) inside the caller's transaction."""
    ev = t.events.c
    # Per statement: a connection's execution_options change the connection itself.
    rows = conn.execute(
        sa.select(*t.event_columns)
        .select_from(t.event_log)
        .where(t.of_session(session), ev.id > after)
        .order_by(ev.id)
        .execution_options(yield_per=1000)
    )
    for r in rows:
        # Decompressed; one that does not decompress (or was rewritten as TEXT), or whose stream
        # or topic number names no row, is the codec's finding, at its position.
        yield event_from_row(r)


def _check_snapshots(conn: Connection, replay: EventReplay) -> None:
    sc = t.snapshots.c
    streams = replay.streams
    for i in range(0, len(streams), 500):
        q = sa.select(sc.originator_id, sc.originator_version, sc.topic, sc.state).where(
            sc.originator_id.in_([oid.hex for oid in streams[i : i + 500]])
        )
        for r in conn.execute(q):
            replay.snapshot(UUID(r[0]), r[1], r[2], readable(r[3]))


def _integrity(conn: Connection, where: str, findings: Findings) -> bool:
    """SQLite's full page check; False when the file is not readable at all."""
    try:
        result = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA integrity_check")]
    except sa.exc.DatabaseError as exc:
        findings.add("storage", f"{where} cannot be read: {_short(exc.orig)}")
        return False
    if result != ["ok"]:
        for line in result:
            findings.add("integrity", f"{where}: {line}")
    return True


def has_session(conn: Connection, session: str, present: set[str]) -> bool:
    ev = t.events.c
    if conn.execute(sa.select(ev.id).where(t.of_session(session)).limit(1)).first():
        return True
    if t.sessions.name not in present:
        return False
    s = t.sessions.c
    return conn.execute(sa.select(s.session_id).where(s.session_id == session)).first() is not None


class Replica:
    """The fresh in-memory read store: the same tables in a private SQLite memory
    database, written by the same projection writer the recorder uses."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)
        with self.engine.begin() as conn:
            t.metadata.create_all(conn, tables=list(READ_MODEL))
        self._raw: Any = self.engine.raw_connection()

    def apply(self, batch: list[Any]) -> None:
        cur = self._raw.cursor()
        try:
            SqlProjectionWriter(cur, lambda s: s, self.session, "sqlite").apply(project(batch))
            self._raw.commit()
        finally:
            cur.close()

    def rows(self, table: sa.Table, *, commits: bool = True) -> Iterator[tuple[Any, ...]]:
        with self.engine.connect() as conn:
            yield from table_rows(conn, table, self.session, commits=commits)

    def close(self) -> None:
        self._raw.close()
        self.engine.dispose()


def working_rows(table: sa.Table, *, commits: bool = True) -> sa.ColumnElement[bool] | None:
    """Which rows of ``table`` belong to working scopes (None: no row does). Working
    writes are not events: their rows are left out of every comparison with a replay and
    are never replaced by a rebuild. A working scope's commit boundaries ARE events
    (``Session.Committed``); ``commits=False`` counts them as history."""
    c = table.c
    if table is t.addresses:
        return c.scope_kind == "working"
    if table is t.commits and not commits:
        return None
    if "scope" in c:
        return c.scope.startswith("working/", autoescape=True)
    return None


def table_rows(
    conn: Connection, table: sa.Table, session: str, *, commits: bool = True
) -> Iterator[tuple[Any, ...]]:
    """The session's rows of one read-model table, keyed order, working scopes left out
    (``working_rows``)."""
    c = table.c
    q = sa.select(table).where(c.session_id == session)
    working = working_rows(table, commits=commits)
    if working is not None:
        q = q.where(~working)
    order: list[sa.ColumnElement[Any]] = []
    for col in table.primary_key.columns:
        if isinstance(col.type, sa.String):
            order.append(col.collate("C" if conn.dialect.name == "postgresql" else "BINARY"))
        else:
            order.append(col)
    rows = conn.execute(q.order_by(*order).execution_options(yield_per=1000))
    deflated = DEFLATED_COLUMNS.get(table.name)
    if deflated is None:
        for row in rows:
            yield tuple(row)
        return
    # A deflated column as its JSON text: the stored bytes are one encoding of it (another
    # zlib may deflate the same text otherwise), and a difference shows as the JSON.
    names = list(table.c.keys())
    columns = [names.index(name) for name in deflated]
    for row in rows:
        values = list(row)
        for i in columns:
            if values[i] is not None:
                values[i] = stored_text(values[i])
        yield tuple(values)


@dataclass(frozen=True)
class RowDiff:
    """One read-model row that differs between two row streams of the same table.

    Attributes:
        table: the table's name (``pico_entries`` ...).
        key: the row's key columns and values (``session_id`` left out unless it is the
            whole key).
        live: the row as the live read model holds it; None when it is missing there.
        rebuilt: the row as the events produce it; None when no event produces it.
    """

    table: str
    key: dict[str, Any]
    live: dict[str, Any] | None
    rebuilt: dict[str, Any] | None

    @property
    def kind(self) -> str:
        """``missing`` (the events produce it, the live model lacks it), ``extra`` (the
        live model holds it, no event produces it) or ``differs``."""
        if self.live is None:
            return "missing"
        return "extra" if self.rebuilt is None else "differs"

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns whose values differ (every column of a missing or extra row)."""
        if self.live is None or self.rebuilt is None:
            return tuple(self.live or self.rebuilt or {})
        return tuple(n for n, v in self.live.items() if self.rebuilt.get(n) != v)

    def describe(self, live: str = "live", rebuilt: str = "rebuilt") -> str:
        """One line naming the row and what differs, the two sides called ``live`` and
        ``rebuilt``."""
        ids = "(" + ", ".join(f"{k}={v!r}" for k, v in self.key.items()) + ")"
        if self.live is None:
            return f"{self.table} row {ids} is missing: the events produce it"
        if self.rebuilt is None:
            return f"{self.table} row {ids} is {live} but no event produces it"
        cols = ", ".join(
            f"{n} ({live} {self.live[n]!r}, {rebuilt} {self.rebuilt.get(n)!r})"
            for n in self.columns
        )
        return f"{self.table} row {ids} differs in {cols}"

    def __str__(self) -> str:
        return _clip(self.describe())


def diff_rows(
    table: sa.Table,
    live: Iterable[tuple[Any, ...]],
    rebuilt: Iterable[tuple[Any, ...]],
    *,
    ignore: frozenset[str] = frozenset(),
) -> Iterator[RowDiff]:
    """Walk two key-ordered row streams of ``table`` together (constant memory) and yield
    every row that differs. Columns in ``ignore`` are left out of keys and comparisons
    (``session_id``, to compare a session with its copy under another name)."""
    names = [c.name for c in table.columns]
    pk = [c.name for c in table.primary_key.columns]
    key_names = [n for n in pk if n not in ignore and (n != "session_id" or len(pk) == 1)]
    key_at = [names.index(n) for n in key_names]
    keep = [i for i, n in enumerate(names) if n not in ignore]

    def as_dict(row: tuple[Any, ...]) -> dict[str, Any]:
        return {names[i]: row[i] for i in keep}

    stored, replayed = iter(live), iter(rebuilt)
    a, b = next(stored, None), next(replayed, None)
    while a is not None or b is not None:
        ka = tuple(a[i] for i in key_at) if a is not None else None
        kb = tuple(b[i] for i in key_at) if b is not None else None
        if a is not None and b is not None and ka == kb:
            if [a[i] for i in keep] != [b[i] for i in keep]:
                key = dict(zip(key_names, ka or (), strict=True))
                yield RowDiff(table.name, key, as_dict(a), as_dict(b))
            a, b = next(stored, None), next(replayed, None)
        elif b is None or (a is not None and ka is not None and kb is not None and ka < kb):
            assert a is not None and ka is not None
            yield RowDiff(table.name, dict(zip(key_names, ka, strict=True)), as_dict(a), None)
            a = next(stored, None)
        else:
            assert kb is not None
            yield RowDiff(table.name, dict(zip(key_names, kb, strict=True)), None, as_dict(b))
            b = next(replayed, None)


def _compare(
    table: sa.Table,
    stored: Iterator[tuple[Any, ...]],
    replayed: Iterator[tuple[Any, ...]],
    findings: Findings,
) -> None:
    """``check``'s comparison: the first difference, and how many rows differ in all."""
    first: str | None = None
    differ = 0
    for diff in diff_rows(table, stored, replayed):
        differ += 1
        first = first or diff.describe("stored", "replay")
    if first is not None:
        more = f" ({differ} rows differ in all)" if differ > 1 else ""
        findings.add("read model", _clip(first) + more)


# ------------------------------------------------------------------------------ memory


def _check_memory(url: str, session: str, findings: Findings) -> CheckReport:
    name = url[len("memory://") :]
    if not name:
        raise ConfigurationError(
            "memory:// is private to the handle that opened it; check a named database "
            "(memory://name) from the same process instead"
        )
    db: MemoryDatabase = named_database(name)
    with db.lock:
        log = db.session_log(session)
        live = db.read_stores.get(session)
    if not log and live is None:
        raise UnknownSessionError(session)
    return _check_log(session, log, db, live, findings)


def _check_log(
    session: str,
    log: Sequence[StoredEvent],
    snapshots: MemoryDatabase,
    live: MemoryReadStore | None,
    findings: Findings,
) -> CheckReport:
    """Replay an in-memory log (position = index + 1, as its audit numbers it), check the
    snapshots kept in ``snapshots``, and compare the replay with ``live``."""
    replica = MemoryReadStore(session)
    replay = EventReplay(findings, lambda batch: replica.apply(project(batch)), chain=True)
    for i, stored in enumerate(log):
        replay.feed(i + 1, stored)
    replay.finish()
    with snapshots.lock:
        kept = [(oid, list(snapshots.snapshots.get(oid, []))) for oid in replay.streams]
    for oid, snaps in kept:
        for snap in snaps:
            replay.snapshot(oid, snap.originator_version, snap.topic, snap.state)
    if not replay.decodable:
        findings.add(
            "read model", "not compared: the replay stopped at the first event that does not decode"
        )
    elif live is not None:
        with live.lock:
            _compare_memory(live, replica, findings)
    return CheckReport(session, replay.count, findings.result(), ())


# ------------------------------------------------------------------------------- JSONL


def jsonl_journal(directory: Path, session: str, *, what: str) -> Journal:
    """The session's journal in a JSONL store that must already exist (``what`` reads it
    and never creates one): a missing directory or a file is ``StorageUnavailableError``,
    a directory without the session's journal ``UnknownSessionError``."""
    if not directory.exists():
        raise StorageUnavailableError(
            f"there is no JSONL directory at {directory}; check the path ({what} never creates one)"
        )
    if not directory.is_dir():
        raise StorageUnavailableError(f"{directory} is a file; give the JSONL store's directory")
    journal = Journal(directory, session, fsync=False)
    if not journal.main.exists():
        raise UnknownSessionError(f"{session} (no journal at {journal.main})")
    return journal


def _check_jsonl(directory: Path, session: str, findings: Findings) -> CheckReport:
    """Open the journal read-only (no lock, nothing written), replay its events and compare
    them with the read model the session answers from. While a writer of this process owns
    the session, its lock is held for the whole check, so no commit lands between reading
    the file and comparing with the owner's read model."""
    journal = jsonl_journal(directory, session, what="check")
    owner = live_writer(directory, session)
    with owner.db.lock if owner is not None else nullcontext():
        store = JsonlStore(directory, session, durability="process", read_only=True)
        try:
            store.open(make_mapper())
        except Exception as exc:  # damage is a finding: the journal is read line by line
            return _check_damaged_journal(journal, session, exc, findings)
        finally:
            store.close()
        kept = owner.db if owner is not None else store.db
        answering = owner.read_store if owner is not None else store.read_store
        return _check_log(session, store.db.session_log(session), kept, answering, findings)


def _check_damaged_journal(
    journal: Journal, session: str, error: Exception, findings: Findings
) -> CheckReport:
    """The ordinary open refused the journal. A line that does not parse is one ``storage``
    finding (the file, line and byte offset); otherwise the lines parse and the events are
    replayed one by one, so an event that does not decode (or replay) is named by its
    position."""
    try:
        loaded = journal.load()
    except StorageCorruptError as exc:
        findings.add("storage", str(exc))
        return CheckReport(session, 0, findings.result(), ())
    except OSError as exc:
        findings.add("storage", f"{journal.main} cannot be read: {_short(exc)}")
        return CheckReport(session, 0, findings.result(), ())
    events = [e for batch in loaded.batches for e in batch.events]
    replica = MemoryReadStore(session)
    replay = EventReplay(findings, lambda batch: replica.apply(project(batch)), chain=True)
    for i, stored in enumerate(events):
        replay.feed(i + 1, stored)
    replay.finish()
    if replay.decodable:  # every event replays: the open failed on something else
        findings.add(
            "storage",
            str(error)
            if isinstance(error, StorageCorruptError)
            else f"{journal.main} cannot be opened: {_short(error)}",
        )
    else:
        findings.add(
            "read model", "not compared: the replay stopped at the first event that does not decode"
        )
    return CheckReport(session, replay.count, findings.result(), ())


def _compare_memory(live: MemoryReadStore, replica: MemoryReadStore, findings: Findings) -> None:
    """Index by index (the first differing key of each); working-scope rows (not events)
    are left out of both sides."""
    reported: set[str] = set()
    for diff in memory_diffs(live, replica, attributes=True):
        if diff.table in reported:
            continue
        reported.add(diff.table)
        stored = None if diff.live is None else diff.live["value"]
        replay = None if diff.rebuilt is None else diff.rebuilt["value"]
        where = f" key {diff.key['key']!r}" if diff.key else ""
        findings.add(
            "read model", _clip(f"index {diff.table}{where}: stored {stored!r}, replay {replay!r}")
        )


def _no_working(value: Any) -> Any:
    """An index without its working-scope keys (``working/...`` scopes, ``working``
    addresses): those rows come from working writes, never from events."""

    def working(k: Any) -> bool:
        first = k[0] if isinstance(k, tuple) and k else k
        return isinstance(first, str) and first.startswith("working")

    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not working(k)}
    return value


# ------------------------------------------------------------------------------- helpers


def _span(first: int, last: int) -> str:
    return f"version {first} is" if first == last else f"versions {first}..{last} are"


def _short(exc: BaseException | None) -> str:
    text = " ".join(str(exc).split()) if exc is not None else ""
    return _clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)


def _clip(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def memory_diffs(
    live: MemoryReadStore, replica: MemoryReadStore, *, attributes: bool = False
) -> Iterator[RowDiff]:
    """Row-by-row differences of two in-memory read models, index by index and key by key
    (an index is the memory backend's table, named without its leading underscore, or
    by its attribute with ``attributes``); working-scope keys left out of both."""
    skip = {"lock", "session_id"}
    mine, theirs = vars(live), vars(replica)
    for attr in sorted(set(mine) | set(theirs)):
        if attr in skip:
            continue
        x, y = _no_working(mine.get(attr)), _no_working(theirs.get(attr))
        if x == y:
            continue
        name = attr if attributes else attr.lstrip("_")
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted({*x, *y}, key=repr):
                if k not in x:
                    yield RowDiff(name, {"key": k}, None, {"value": y[k]})
                elif k not in y:
                    yield RowDiff(name, {"key": k}, {"value": x[k]}, None)
                elif x[k] != y[k]:
                    yield RowDiff(name, {"key": k}, {"value": x[k]}, {"value": y[k]})
        else:
            yield RowDiff(name, {}, {"value": x}, {"value": y})
