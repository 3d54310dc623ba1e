"""``pico migrate``: copy one session between persistent backends and prove the copy equal
(issue 13, "Migration between backends"; DESIGN "the stored body of an event is
byte-identical on every backend, so a session migrates unchanged").

The stored events are copied EXACTLY, batch by batch in their original boundaries (a batch
ends with its ``Session.Committed`` or ``Session.Claimed``): same stream ids, versions,
topics and body bytes. Each batch is written through the target's own recorder
(``insert_events``) with its projection ops, in one transaction, so the target's read
model is built as the copy goes. Snapshots are not copied (an optimisation only: the
target's first long reload writes its own).

``as_name`` copies the session under another name. Stream ids are derived from (session,
kind, number) (``domain/ids.py``), so they are rewritten for the new name; so is every
boundary's hash-chain link, which covers the stream ids (the source's chain is verified
batch by batch first, so a broken source chain is never re-sealed as a good one). Every
other byte of every body is kept: the ``Created`` events still carry the name the session
was created under, which only error messages read.

Then equality is proved: the two logs are streamed side by side and compared body by body;
the hash chain is verified on the target; the two read models are compared table by
table, row by row (working-scope rows left out).

Working scopes (streaming frames, checkpoints) are not history: a session with a live
working scope (a model turn in flight, or one a crash left open) is refused
(``LiveWorkError``) before anything is written; let its owner finish or recover it first.

An existing target session is refused (``ConfigurationError``), except a partial copy an
interrupted migrate of the SAME source left: the target then holds a migration note (a
sidecar file next to a SQLite file or in a JSONL directory; a row of
``pico_migration_notes`` on PostgreSQL) naming the source, and its events are a prefix of
the source's (each batch is atomic, so the prefix ends at a boundary). A rerun checks the
prefix event by event and resumes after it; the note is removed once the copy is proved.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import StoredEvent
from sqlalchemy.engine import Connection

from pico.domain.errors import (
    ConfigurationError,
    LiveWorkError,
    StorageCorruptError,
    UnknownSessionError,
)
from pico.domain.ids import conversation_uuid, session_uuid, stream_uuid, task_uuid
from pico.infrastructure.chain import (
    chain_link,
    seal_boundary,
    stored_link,
    unlinked,
    verify_chain,
)
from pico.infrastructure.container import open_storage
from pico.infrastructure.jsonl.journal import file_name
from pico.infrastructure.jsonl.store import JsonlStore
from pico.infrastructure.replay import TableDiff, _reading, _require_session, _table_diff
from pico.infrastructure.settings import mask_url, settings_for
from pico.infrastructure.sql import schema as t
from pico.infrastructure.storage import BATCH_END, EventSourcedStorage, aggregate_name, make_mapper
from pico.infrastructure.verify import (
    READ_MODEL,
    Replica,
    session_events,
    sql_engine,
    table_rows,
)
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import project

__all__ = ["MigrationReport", "Progress", "migrate"]

#: ``progress(copied, total)``: events copied so far (this run and any run it resumes),
#: of the source's total. Called after every batch; an exception raised there stops the
#: migration after that batch (the partial copy resumes on the next run).
Progress = Callable[[int, int], None]

_PERSISTENT = ("sqlite:///", "postgresql://", "postgres://", "jsonl:///")


@dataclass(frozen=True)
class MigrationReport:
    """What ``migrate`` copied and proved. ``ok`` when every proof held."""

    source: str  # the source URL, password masked
    target: str
    session: str  # the source session
    target_session: str
    events: int  # events the target holds
    batches: int  # batches copied by this run
    resumed_after: int  # events a previous, interrupted run had copied (0: a fresh copy)
    seconds: float
    #: None when equal; else the first event where the target's log differs.
    bodies: str | None
    chain: str  # the target's verify summary
    chain_ok: bool
    read_model: tuple[TableDiff, ...]  # tables whose rows differ

    @property
    def ok(self) -> bool:
        return self.bodies is None and self.chain_ok and not self.read_model

    def lines(self) -> list[str]:
        out = [
            f"copied session {self.session!r} from {self.source} to {self.target} as "
            f"{self.target_session!r}: {self.events} events"
            + (f" (resumed after {self.resumed_after})" if self.resumed_after else "")
            + f" in {self.seconds:.2f} s",
            "stored bodies: "
            + (
                self.bodies
                if self.bodies is not None
                else "byte-identical"
                if self.session == self.target_session
                else "byte-identical apart from the stream ids and links the new name re-derives"
            ),
            "hash chain: " + self.chain,
        ]
        for diff in self.read_model:
            out.extend(str(row) for row in diff.rows)
        out.append(
            "read models: equal in all tables"
            if not self.read_model
            else "read models: "
            + ", ".join(f"{d.table} {d.differing} row(s) differ" for d in self.read_model)
        )
        out.append("proved equal" if self.ok else "NOT equal: see above")
        return out


async def migrate(
    source_url: str,
    target_url: str,
    *,
    session: str = "main",
    as_name: str | None = None,
    progress: Progress | None = None,
) -> MigrationReport:
    """Copy one session to another backend (or another database of the same kind) and
    prove the copy equal. See the module docstring for what is copied and how.

    Args:
        source_url: where the session is (sqlite, postgresql or jsonl).
        target_url: where to copy it (sqlite, postgresql or jsonl; created if new).
        session: the session to copy.
        as_name: the target session's name (default: the same name).
        progress: called with (events copied, events in all) after every batch.

    Returns:
        The report: what was copied, and each proof (``ok`` when all hold).

    Raises:
        ConfigurationError: a URL or name pico does not take, a memory:// side, the same
            place as source and target, or a target that already holds the session (pick
            ``as_name`` or delete it) and is not a partial copy of this source.
        UnknownSessionError: the source holds no such session.
        LiveWorkError: the source session has a live working scope; nothing was written.
        StorageUnavailableError: a side cannot be reached, read or written (a partial copy
            is resumed by the next run).
        StorageCorruptError: a source event does not decode or replay, or its hash chain
            is broken under ``as_name`` (the copy stops before that batch).
    """
    name = session if as_name is None else as_name
    settings_for(source_url, session=session, read_only=True)
    settings_for(target_url, session=name)
    for url in (source_url, target_url):
        if not url.startswith(_PERSISTENT):
            raise ConfigurationError(
                f"migrate copies between persistent backends (sqlite:///, postgresql://, "
                f"jsonl:///); {mask_url(url)} is not one"
            )
    if _same_place(source_url, target_url) and name == session:
        raise ConfigurationError(
            f"the source and the target are the same storage and session {session!r}: give "
            "another target, or a new name with --as NAME"
        )
    return await asyncio.to_thread(_migrate, source_url, target_url, session, name, progress)


def _same_place(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        for prefix in ("sqlite:///", "jsonl:///"):
            if url.startswith(prefix):
                return prefix + str(Path(url[len(prefix) :]).resolve())
        return url.replace("postgres://", "postgresql://", 1)

    return norm(a) == norm(b)


# --------------------------------------------------------------------- the backends


class SourceReader(Protocol):
    """What migrate reads from a source backend (one consistent view for its lifetime)."""

    location: str

    def events(self) -> Iterator[tuple[int, StoredEvent]]:
        """The session's stored events in storage order (a new pass each call)."""
        ...

    def count(self) -> int: ...

    def working_scopes(self) -> list[str]:
        """Working scopes that hold rows now (live: not retired)."""
        ...

    def rows(self, table: sa.Table) -> Iterator[tuple[Any, ...]]:
        """The read model's rows of ``table``, keyed order, working scopes left out."""
        ...


class TargetWriter(Protocol):
    """What migrate writes to a target backend: batches through its recorder, and the
    migration note kept outside the session's history."""

    location: str

    def events(self) -> Iterator[tuple[int, StoredEvent]]: ...

    def write(self, batch: list[StoredEvent], ops: list[Any]) -> None: ...

    def rows(self, table: sa.Table) -> Iterator[tuple[Any, ...]]: ...

    def note(self) -> dict[str, Any] | None: ...

    def set_note(self, note: dict[str, Any]) -> None: ...

    def clear_note(self) -> None: ...


class _SqlSource:
    """A SQLite or PostgreSQL source: one read-only transaction for the whole migration."""

    def __init__(self, url: str, session: str, stack: ExitStack) -> None:
        engine, self.location = sql_engine(url, what="migrate")
        stack.callback(engine.dispose)
        self.conn: Connection = stack.enter_context(_reading(engine, self.location))
        self.session = session
        _require_session(self.conn, session, self.location)

    def events(self) -> Iterator[tuple[int, StoredEvent]]:
        return session_events(self.conn, self.session)

    def count(self) -> int:
        q = sa.select(sa.func.count()).where(t.of_session(self.session))
        return int(self.conn.execute(q).scalar_one())

    def working_scopes(self) -> list[str]:
        return _sql_working_scopes(self.conn, self.session)

    def rows(self, table: sa.Table) -> Iterator[tuple[Any, ...]]:
        return table_rows(self.conn, table, self.session, commits=False)


def _sql_working_scopes(conn: Connection, session: str) -> list[str]:
    scopes: set[str] = set()
    for table in (t.values, t.list_elements):
        c = table.c
        q = (
            sa.select(c.scope)
            .where(c.session_id == session, c.scope.startswith("working/", autoescape=True))
            .distinct()
        )
        scopes.update(str(r[0]) for r in conn.execute(q))
    return sorted(scopes)


class _JsonlSource:
    """A JSONL source: the journal read whole (how every JSONL open reads it), no lock."""

    def __init__(self, url: str, session: str, stack: ExitStack) -> None:
        directory = Path(url[len("jsonl:///") :])
        store = JsonlStore(directory, session, durability="process", read_only=True)
        self.location = store.location
        if not store.journal.main.exists():
            raise UnknownSessionError(f"{session} (no journal at {store.location})")
        store.open(make_mapper())
        store.close()
        self.session = session
        self.log = store.db.session_log(session)
        self.store = store.read_store
        self._replica: Replica | None = None
        self._stack = stack

    def events(self) -> Iterator[tuple[int, StoredEvent]]:
        return ((i + 1, e) for i, e in enumerate(self.log))

    def count(self) -> int:
        return len(self.log)

    def working_scopes(self) -> list[str]:
        return _memory_working_scopes(self.store)

    def rows(self, table: sa.Table) -> Iterator[tuple[Any, ...]]:
        if self._replica is None:
            self._replica = _replica_of(self.session, self.events(), self._stack)
        return self._replica.rows(table, commits=False)


def _memory_working_scopes(store: MemoryReadStore) -> list[str]:
    scopes: set[str] = set()
    for attr in ("_values", "_elements"):
        for key in getattr(store, attr, {}):
            if isinstance(key, tuple) and str(key[0]).startswith("working/"):
                scopes.add(str(key[0]))
    return sorted(scopes)


def _replica_of(
    session: str, events: Iterator[tuple[int, StoredEvent]], stack: ExitStack
) -> Replica:
    """The SQL-shaped read model of a JSONL journal: its events through the projector (the
    read model every open of the journal builds), into the replay tables."""
    replica = Replica(session)
    stack.callback(replica.close)
    mapper = make_mapper()
    batch: list[Any] = []
    for _, stored in events:
        event = mapper.to_domain_event(stored)
        batch.append(event)
        if isinstance(event, BATCH_END):
            replica.apply(batch)
            batch = []
    return replica


class _StorageTarget:
    """Any backend ``Harness.open`` takes, written through its own recorder."""

    def __init__(self, url: str, session: str, stack: ExitStack) -> None:
        self.url = url
        self.session = session
        storage = open_storage(url, session=session, durability=None, read_only=False)
        assert isinstance(storage, EventSourcedStorage)
        self.storage = storage
        stack.callback(storage.close)
        self.location = storage.location
        self._stack = stack
        self._replica: Replica | None = None
        self._conn: Connection | None = None

    def events(self) -> Iterator[tuple[int, StoredEvent]]:
        recorder: Any = self.storage.recorder
        after = 0
        while True:
            rows = recorder.select_session_events(self.session, after=after, limit=1000)
            if not rows:
                return
            yield from rows
            after = rows[-1][0]

    def write(self, batch: list[StoredEvent], ops: list[Any]) -> None:
        self.storage.recorder.insert_events(batch, session_id=self.session, ops=ops, working=())

    def rows(self, table: sa.Table) -> Iterator[tuple[Any, ...]]:
        self.storage.flush()
        if self.url.startswith("jsonl:///"):
            if self._replica is None:
                self._replica = _replica_of(self.session, self.events(), self._stack)
            return self._replica.rows(table, commits=False)
        if self._conn is None:
            engine, where = sql_engine(self.url, what="migrate")
            self._stack.callback(engine.dispose)
            self._conn = self._stack.enter_context(_reading(engine, where))
        return table_rows(self._conn, table, self.session, commits=False)

    # -- the migration note, outside the session's history
    def _note_path(self) -> Path | None:
        if self.url.startswith("sqlite:///"):
            path = Path(self.url[len("sqlite:///") :])
            return path.with_name(f"{path.name}.migrating-{quote(self.session, safe='')}.json")
        if self.url.startswith("jsonl:///"):
            return Path(self.url[len("jsonl:///") :]) / f"{file_name(self.session)}+migrating.json"
        return None

    def note(self) -> dict[str, Any] | None:
        path = self._note_path()
        if path is not None:
            if not path.exists():
                return None
            loaded: Any = json.loads(path.read_text())
            return loaded if isinstance(loaded, dict) else None
        with self._pg() as conn:
            c = _notes.c
            row = conn.execute(sa.select(c.note).where(c.session_id == self.session)).first()
        return None if row is None else dict(json.loads(row[0]))

    def set_note(self, note: dict[str, Any]) -> None:
        path = self._note_path()
        text = json.dumps(note, sort_keys=True)
        if path is not None:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            return
        with self._pg() as conn:
            conn.execute(_notes.delete().where(_notes.c.session_id == self.session))
            conn.execute(_notes.insert().values(session_id=self.session, note=text))

    def clear_note(self) -> None:
        path = self._note_path()
        if path is not None:
            path.unlink(missing_ok=True)
            return
        with self._pg() as conn:
            conn.execute(_notes.delete().where(_notes.c.session_id == self.session))

    @contextmanager
    def _pg(self) -> Iterator[Connection]:
        engine = sa.create_engine(
            "postgresql+psycopg://" + self.url.split("://", 1)[1], poolclass=sa.pool.NullPool
        )
        try:
            with engine.begin() as conn:
                _notes.create(conn, checkfirst=True)
                yield conn
        finally:
            engine.dispose()


#: PostgreSQL's migration notes: outside pico's schema metadata (not history, not read
#: model), created by the first migrate that needs one.
_notes = sa.Table(
    "pico_migration_notes",
    sa.MetaData(),
    sa.Column("session_id", sa.String(200), primary_key=True),
    sa.Column("note", sa.Text, nullable=False),
)


def _open_source(url: str, session: str, stack: ExitStack) -> SourceReader:
    if url.startswith("jsonl:///"):
        return _JsonlSource(url, session, stack)
    return _SqlSource(url, session, stack)


def _open_target(url: str, session: str, stack: ExitStack) -> TargetWriter:
    return _StorageTarget(url, session, stack)


# ------------------------------------------------------------------------ the copy


class _Ids:
    """Stream ids for the target name: derived again from (name, kind, number)."""

    def __init__(self, source: str, target: str) -> None:
        self.same = source == target
        self.target = target
        self._map: dict[UUID, UUID] = {session_uuid(source): session_uuid(target)}

    def __call__(self, oid: UUID, event: Any) -> UUID:
        if self.same:
            return oid
        new = self._map.get(oid)
        if new is None:
            kind, _, number = aggregate_name(event).partition("/")
            if kind == "conversation":
                new = conversation_uuid(self.target, int(number))
            elif kind == "task":
                new = task_uuid(self.target, int(number))
            else:
                raise StorageCorruptError(f"stream {oid} is not one of the session's streams")
            self._map[oid] = new
        return new


_CHAIN_STARTED = "pico.domain.session:Session.ChainStarted"


class _Copier:
    """Decodes source events, cuts them at boundaries, rewrites ids (and re-seals links)
    for another name, and writes each batch with its projection ops."""

    def __init__(self, target: TargetWriter, ids: _Ids, location: str, session: str) -> None:
        self.target = target
        self.ids = ids
        self.location = location
        self.session = session
        self.mapper = make_mapper()
        self.batch: list[tuple[int, StoredEvent, Any]] = []
        self.source_link = ""  # the source's last boundary link
        self.target_link = ""  # the target's
        self.batches = 0

    def decode(self, position: int, stored: StoredEvent) -> Any:
        try:
            return self.mapper.to_domain_event(stored)
        except Exception as exc:
            raise StorageCorruptError(
                f"{self.location}: event {position} of session {self.session!r} "
                f"({stored.topic}) does not decode ({type(exc).__name__}: {exc}); the copy "
                "stopped before its batch. pico check lists the damage"
            ) from exc

    def translate(self, batch: list[tuple[int, StoredEvent, Any]]) -> list[StoredEvent]:
        """The batch as the target stores it; advances both chains."""
        boundary = batch[-1][1]
        link = stored_link(boundary.state)
        if self.ids.same:
            self.source_link = self.target_link = link
            return [stored for _, stored, _ in batch]
        out = [
            StoredEvent(
                self.ids(UUID(str(s.originator_id)), e), s.originator_version, s.topic, s.state
            )
            for _, s, e in batch
        ]
        if link:
            expected = chain_link(self.source_link, [s for _, s, _ in batch])
            if expected != link:
                raise StorageCorruptError(
                    f"{self.location}: the hash chain of session {self.session!r} breaks at "
                    f"positions {batch[0][0]}-{batch[-1][0]}; a copy under another name would "
                    "re-seal it as good, so the copy stopped before this batch. pico verify "
                    "reports the break"
                )
            last = out[-1]
            out[-1] = StoredEvent(
                last.originator_id, last.originator_version, last.topic, unlinked(last.state)
            )
            self.target_link = seal_boundary(self.target_link, out)
        else:
            self.target_link = ""
        self.source_link = link
        return out

    def feed(self, position: int, stored: StoredEvent) -> bool:
        """Add one source event; True when it closed a batch that was written."""
        event = self.decode(position, stored)
        self.batch.append((position, stored, event))
        if not isinstance(event, BATCH_END):
            return False
        batch, self.batch = self.batch, []
        out = self.translate(batch)
        ops = project([e for _, _, e in batch])
        self.target.write(out, ops)
        self.batches += 1
        return True


def _identity(source: SourceReader) -> str:
    """The source session's identity: a digest of its first stored event (its creation:
    a timestamp and its name), whatever URL spelling reaches it."""
    for _, stored in source.events():
        return "sha256:" + hashlib.sha256(stored.state).hexdigest()
    return ""


def _migrate(
    source_url: str, target_url: str, session: str, name: str, progress: Progress | None
) -> MigrationReport:
    started = time.perf_counter()
    with ExitStack() as stack:
        source = _open_source(source_url, session, stack)
        scopes = source.working_scopes()
        if scopes:
            raise LiveWorkError(
                f"session {session!r} has live working scope(s) {', '.join(scopes)} (a model "
                "turn in flight, or one a crash left open); working rows are not history and "
                "are not copied, so nothing was written. Open the session and let it finish "
                "or recover that work, then migrate"
            )
        total = source.count()
        identity = _identity(source)
        if name != session and any(s.topic == _CHAIN_STARTED for _, s in source.events()):
            # Its anchor covers the source's stream ids, which another name re-derives.
            raise ConfigurationError(
                f"session {session!r} carries a hash chain anchor (Session.ChainStarted), which "
                "covers its stream ids; a copy under another name could not prove it, so "
                "nothing was written. Migrate it under its own name (without --as)"
            )
        target = _open_target(target_url, name, stack)
        note = target.note()
        existing = list(_take(target.events(), 1))
        if existing and (note is None or note.get("identity") != identity):
            raise ConfigurationError(
                f"{target.location} already holds session {name!r}"
                + ("" if note is None else ", a partial copy of another source")
                + "; nothing was written. Copy it under another name (--as NAME) or delete "
                "that session first"
            )
        if note is None or not existing:  # a note with nothing copied yet is stale
            target.set_note(
                {
                    "identity": identity,
                    "source": mask_url(source_url),
                    "session": session,
                    "started": datetime.now(UTC).isoformat(),
                }
            )
        copier = _Copier(target, _Ids(session, name), source.location, session)
        resumed = _resume(source, target, copier) if existing else 0
        copied = resumed
        events = source.events()
        for _ in _take(events, resumed):
            pass
        for position, stored in events:
            copied += 1
            if copier.feed(position, stored) and progress is not None:
                progress(copied - len(copier.batch), total)
        report = _prove(source, target, copier, session, name)
        elapsed = time.perf_counter() - started
        if report[0] is None and report[2] and not report[3]:
            target.clear_note()
        return MigrationReport(
            mask_url(source_url),
            mask_url(target_url),
            session,
            name,
            copied - len(copier.batch),
            copier.batches,
            resumed,
            elapsed,
            *report,
        )


def _take(it: Iterator[Any], n: int) -> Iterator[Any]:
    """The next ``n`` items of ``it``, consuming no more than those."""
    return itertools.islice(it, n)


def _resume(source: SourceReader, target: TargetWriter, copier: _Copier) -> int:
    """Check, batch by batch, that the target's events are exactly what this migration
    writes for the source's first events, and return how many there are (the copier's
    chains are brought to their end)."""
    have = 0
    src = source.events()
    stored_batch: list[StoredEvent] = []
    for _, mine in target.events():
        row = next(src, None)
        if row is None:
            raise ConfigurationError(
                f"{target.location}: the partial copy of session {copier.session!r} holds more "
                "events than the source; nothing was written. Delete the target session and "
                "migrate again"
            )
        position, stored = row
        copier.batch.append((position, stored, copier.decode(position, stored)))
        stored_batch.append(mine)
        have += 1
        if isinstance(copier.batch[-1][2], BATCH_END):
            batch, copier.batch = copier.batch, []
            expected = copier.translate(batch)
            if [_key(s) for s in stored_batch] != [_key(s) for s in expected]:
                raise ConfigurationError(
                    f"{target.location}: the partial copy differs from the source in the "
                    f"batch ending at event {have}; it is not this source's copy, and nothing "
                    "was written. Delete the target session (or pick --as NAME) and migrate "
                    "again"
                )
            stored_batch = []
    if copier.batch:
        raise ConfigurationError(
            f"{target.location}: the partial copy ends inside a batch; nothing was written. "
            "Delete the target session and migrate again"
        )
    return have


def _key(s: StoredEvent) -> tuple[str, int, str, bytes]:
    oid = s.originator_id
    return (
        stream_uuid(oid).hex,
        s.originator_version,
        s.topic,
        bytes(s.state),
    )


def _prove(
    source: SourceReader, target: TargetWriter, copier: _Copier, session: str, name: str
) -> tuple[str | None, str, bool, tuple[TableDiff, ...]]:
    """Bodies, chain, read models (see the module docstring). The target's log is read
    once, compared with the source's as it streams into the chain walk: nothing of it is
    held beyond one event."""
    bodies: str | None = None
    ids = _Ids(session, name)
    mapper = make_mapper()
    src = source.events()

    def compared() -> Iterator[tuple[int, StoredEvent]]:
        nonlocal bodies
        count = 0
        for position, mine in target.events():
            yield position, mine
            theirs = next(src, None)
            count += 1
            if bodies is not None:
                continue
            if theirs is None:
                bodies = f"the target holds event {count}, the source has only {count - 1}"
                continue
            oid = UUID(str(theirs[1].originator_id))
            if not ids.same:
                oid = ids(oid, mapper.to_domain_event(theirs[1]))
            want = (oid.hex, theirs[1].originator_version, theirs[1].topic, bytes(theirs[1].state))
            got = _key(mine)
            if not ids.same:  # links re-sealed for the new stream ids
                want = (*want[:3], unlinked(want[3]))
                got = (*got[:3], unlinked(got[3]))
            if want != got:
                bodies = (
                    f"event {count} differs (target position {position}, source position "
                    f"{theirs[0]}, {theirs[1].topic})"
                )

    chain = verify_chain(name, compared())
    if bodies is None:
        left = sum(1 for _ in src)
        if left:
            bodies = (
                f"the source holds {left} event(s) after the last copied batch (events "
                "after the last boundary, or written while migrate ran)"
            )
    diffs = tuple(
        d
        for d in (
            _table_diff(
                table, source.rows(table), target.rows(table), ignore=frozenset({"session_id"})
            )
            for table in READ_MODEL
        )
        if d.differing
    )
    return bodies, chain.summary(), chain.ok, diffs
