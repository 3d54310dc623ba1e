"""The ``Storage`` adapter: eventsourcing's mapper, event stores and repository over one
of our recorders, with projection rows computed by the pure projector and written in the
events' own transaction."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, cast
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Repository
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import AggregateRecorder, EventStore, IntegrityError, StoredEvent

from pico.application.chain import ChainBreak, ChainReport
from pico.application.events import aggregate_name, event_payload
from pico.application.ports import AuditRecord, ReadPort, StatePort, TaskPort
from pico.domain.errors import (
    PicoError,
    StaleWriterError,
    StorageCorruptError,
)
from pico.domain.session import BOUNDARIES
from pico.domain.state import StateWrite
from pico.infrastructure.chain import (
    PLACEHOLDER,
    anchor_of,
    paged,
    seal_boundary,
    verify_chain,
)
from pico.infrastructure.codec import make_mapper
from pico.projections.ops import project, project_working
from pico.projections.queries import Queries, ReadStore, StateQueries, TaskQueries

__all__ = ["BATCH_END", "SNAPSHOT_INTERVAL", "EventSourcedStorage", "aggregate_name", "make_mapper"]


log = logging.getLogger("pico.storage")

#: Every this many versions an aggregate's snapshot is written (after the commit), so a
#: reload replays at most this many events; times the aggregate's ``snapshot_scale`` where
#: it has one (a conversation's snapshot grows with its context).
SNAPSHOT_INTERVAL = 200


class SessionRecorder(Protocol):
    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]: ...
    def count_session_events(self, session_id: str, *, after: int) -> int: ...
    def last_session_position(self, session_id: str) -> int: ...


class EventSourcedStorage:
    def __init__(
        self,
        session_id: str,
        *,
        events: AggregateRecorder,
        snapshots: AggregateRecorder,
        read_store: ReadStore,
        on_close: Any = None,
        location: str = "",
        read_only: bool = False,
        leases: Callable[[], Any] | None = None,
    ) -> None:
        self.session_id = session_id
        #: Makes the session's ``LeaseStore`` (application/lease.py), where the backend
        #: has leases (PostgreSQL); None elsewhere: ``Harness.open(lease=...)`` refuses.
        self.leases = leases
        self.read_only = read_only  # a read-only storage writes no snapshots
        #: What messages name: the SQLite file, the masked URL, ``memory://...``.
        self.location = location or "this storage"
        self.mapper = make_mapper()
        self.recorder = events
        self._recorders = (events, snapshots)
        self._read_store = read_store
        self.events: EventStore[UUID] = EventStore(self.mapper, events)
        self.snapshots: EventStore[UUID] = EventStore(self.mapper, snapshots)
        self.repository: Repository[UUID] = Repository(self.events, snapshot_store=self.snapshots)
        self.queries = Queries(read_store)
        self.reads: ReadPort = self.queries
        self.state_queries = StateQueries(read_store)
        self.state: StatePort = self.state_queries
        self.task_queries = TaskQueries(read_store)  # the owner mirrors (own_tasks)
        #: Whether the owner mirrors (``own_tasks``): a save tells them its rows only then.
        self._mirrored = False
        #: Aggregates a load replayed long while the snapshot store was busy, by id: each
        #: is snapshotted after the next save if that save saved it (``save``).
        self._owed: dict[UUID, Aggregate] = {}
        self.tasks: TaskPort = self.task_queries
        self._on_close = on_close
        # A read-only handle follows another owner's commits: where the recorder can be
        # told of them (PostgreSQL LISTEN/NOTIFY) the watch hub waits on this instead of
        # sleeping its poll interval. Absent elsewhere (``getattr(storage, "wait_commit",
        # None)`` is None), so the hub polls.
        listen = getattr(events, "listen", None) if read_only else None
        wait_commit = listen(session_id) if listen is not None else None
        if wait_commit is not None:
            self.wait_commit: Callable[..., Awaitable[None]] = wait_commit

    def snapshot(self) -> AbstractContextManager[object]:
        return self._read_store.read()

    def load(self, aggregate_id: UUID) -> Aggregate | None:
        try:
            replayed = [0]

            def project(aggregate: Any, events: Iterable[Any]) -> Any:
                # The library's project_aggregate without its per-event runtime Protocol
                # isinstance (it costs more than the mutation: over a third of a reload).
                for event in events:
                    aggregate = event.mutate(aggregate)
                    replayed[0] += 1
                return aggregate

            aggregate: Any = self.repository.get(aggregate_id, projector_func=project)
        except AggregateNotFoundError:
            return None
        except PicoError:  # translated by the recorder (damaged page, server gone, no
            raise  # connection free in the pool: sql/store.py translate_error)
        except Exception as exc:
            raise StorageCorruptError(
                f"{self.location}: aggregate {aggregate_id} of session {self.session_id!r} "
                f"could not be reconstructed from its stored events ({_reason(exc)}); nothing "
                f"was changed. {_NEXT}"
            ) from exc
        if not isinstance(aggregate, Aggregate):
            raise StorageCorruptError(
                f"{self.location}: {aggregate_id} of session {self.session_id!r} holds "
                f"{type(aggregate).__name__}, not an aggregate; nothing was changed. {_NEXT}"
            )
        interval = SNAPSHOT_INTERVAL * int(getattr(aggregate, "snapshot_scale", 1))
        if replayed[0] > interval and not self.read_only:
            # A long replay (a store written before snapshots, or one whose snapshots were
            # dropped): snapshot it, so the next load replays a short tail. Not while the
            # snapshot store's connection has a transaction open (SQLite: a command's read
            # snapshot on the writer's connection, an open batch or a claim's lock, which
            # a write would end or commit): then after the next save that saves it.
            if self._snapshot_waits():
                self._owed[aggregate.id] = aggregate
            else:
                self._snapshot(aggregate)
        return aggregate

    def _snapshot_waits(self) -> bool:
        busy = getattr(self._recorders[1], "busy", None)
        return busy is not None and bool(busy())

    @property
    def shares_commits(self) -> bool:
        """Whether durable commands gain by sharing a commit (``CommandLine.groups``):
        SQLite, where each commit is a transaction's COMMIT of its own (an fsync under
        ``durability="fsync"``). PostgreSQL sends a command with its COMMIT in one round
        trip; the memory and JSONL stores write at the save."""
        writer = getattr(self.recorder, "writer", None)
        return writer is not None and bool(writer.sqlite)

    def own_tasks(self) -> bool:
        """The line that claimed this session for writing (the only writer of its tasks)
        mirrors its live tasks (``TaskQueries.own``) on SQLite, where each read is a
        statement and a change by anyone else is told cheaply (``PRAGMA data_version`` on
        the writer's connection). Not on the memory read model (memory, JSONL): it answers
        those reads as cheaply as a mirror would, and keeping one applied every task op
        twice (callgrind: a memory turn 0.9% more). Not on PostgreSQL: it has no such
        token, and a lease does not fence everyone (an open without ``lease=`` does not
        read the lease row, so its claim can supersede a leased owner, whose mirror would
        then serve rows the other changed until its next write is refused).
        Returns whether it mirrors."""
        writer = getattr(self.recorder, "writer", None)
        if writer is None or not writer.sqlite:
            return False
        # On SQLite the mirror also answers live scans and keeps the session's head,
        # which reads that page by it ask instead of the session row: each a statement.
        self.task_queries.own(writer.change_token)
        self.state_queries.known_head = self.task_queries.mirrored_head
        # And the entries it saved last: a turn's context projection reads them back.
        self.queries.own_entries(self.task_queries.fresh)
        # And, while the live-task mirror says nobody else changed the store, the context
        # tails a generation request projects and the input queues every placement checks
        # (projections/mirrors.py). Not on the memory read model: it answers those as
        # cheaply itself (callgrind: keeping them cost a memory turn 0.9% more).
        self.queries.own_tails(self.task_queries.fresh)
        self.state_queries.own_prefixes(self.task_queries.fresh)
        self._mirrored = True
        return True

    def disown_tasks(self) -> None:
        self._mirrored = False
        self.task_queries.disown()
        self.state_queries.known_head = None
        self.queries.disown_entries()
        self.queries.own_tails(None)
        self.state_queries.own_prefixes(None)

    def _forget_mirrors(self) -> None:
        """What the owner keeps of its own writes may be ahead of the store (a failed or
        rolled-back batch) or behind it (a claim): read it again from the store."""
        self.task_queries.forget()
        self.queries.forget_entries()

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold the session's write lock: no other writer commits until the next save
        (which runs inside it and releases it) or the end of the block. A claim reloads the
        Session aggregate in here, so it lands on the head it read (seed 000, "Claiming a
        run")."""
        self._forget_mirrors()  # a claim: whatever another owner wrote is read again
        exclusive = getattr(self.recorder, "exclusive", None)
        return nullcontext() if exclusive is None else exclusive(self.session_id)

    def _decode(self, position: int, stored: StoredEvent) -> Any:
        try:
            return self.mapper.to_domain_event(stored)
        except Exception as exc:
            raise StorageCorruptError(
                f"{self.location}: event {position} of session {self.session_id!r} (stream "
                f"{stored.originator_id} version {stored.originator_version}, "
                f"{stored.topic!r}) does not decode ({_reason(exc)}); nothing was changed. "
                f"{_NEXT}"
            ) from exc

    def save(
        self,
        aggregates: Sequence[Aggregate],
        *,
        working: Sequence[StateWrite] = (),
        defer: bool = False,
    ) -> None:
        # Collected directly rather than through ProcessingEvent, whose runtime Protocol
        # checks cost ~15% of a small command; our aggregates are known Aggregates.
        events: list[Any] = []
        counts: list[tuple[Aggregate, int]] = []
        for aggregate in aggregates:
            # The library's collect_events pops them one by one: the list is taken whole.
            pending = aggregate._pending_events
            aggregate._pending_events = []
            events.extend(pending)
            counts.append((aggregate, len(pending)))
        ops = project(events)
        if working:
            ops.extend(project_working(working))
        # The batch ends with its boundary (the Session aggregate is saved last): encode it
        # with a placeholder link, then seal the chain over the exact stored bodies.
        boundary = events[-1] if events and isinstance(events[-1], BATCH_END) else None
        if boundary is not None:
            object.__setattr__(boundary, "link", PLACEHOLDER)
        stored = self.mapper.to_stored_events(events)
        link = ""
        if boundary is not None:
            session = counts[-1][0]
            link = seal_boundary(getattr(session, "link", ""), stored)
            object.__setattr__(boundary, "link", link)
        try:
            self.recorder.insert_events(
                stored, session_id=self.session_id, ops=ops, defer=defer, working=working
            )
        except IntegrityError as exc:
            self._forget_mirrors()
            raise StaleWriterError(self.session_id) from exc
        except BaseException:
            self._forget_mirrors()  # a deferred batch may have been rolled back with it
            raise
        if self._mirrored:  # (three calls that would find nothing to keep, otherwise)
            self.task_queries.track(ops)
            self.queries.remember(ops)
            self.state_queries.track(ops)
        if boundary is not None:
            counts[-1][0].link = link  # type: ignore[attr-defined]
        due = [a for a, n in counts if _snapshot_due(a, a._version, n)]
        if self._owed:
            # Long replays loaded while a transaction was open (``load``): the very object
            # loaded, now saved, so it holds what is stored. Any other is dropped (a failed
            # command's aggregate holds events never saved); a later load owes it again.
            owed, self._owed = self._owed, {}
            for aggregate, _ in counts:
                if owed.get(aggregate.id) is aggregate and all(aggregate is not a for a in due):
                    due.append(aggregate)
        if due and defer:
            # A snapshot is written in its own transaction, after the batch it covers:
            # commit the batch here, where a failure reaches the caller (it is uncertain).
            self.flush()
        for aggregate in due:
            self._snapshot(aggregate)

    def flush(self) -> None:
        """Make deferred saves durable (recorders without group commit have none)."""
        flush = getattr(self.recorder, "flush", None)
        if flush is not None:
            try:
                flush()
            except BaseException:
                self._forget_mirrors()  # the deferred batch rolled back
                raise

    def abandon(self, reason: str) -> None:
        """The owner faulted: roll back deferred saves not yet durable, at once."""
        self._forget_mirrors()
        abandon = getattr(self.recorder, "abandon", None)
        if abandon is not None:
            abandon(reason)

    def _snapshot(self, aggregate: Aggregate) -> None:
        try:
            self.snapshots.put([aggregate.Snapshot.take(aggregate)])
        except Exception:  # an optimisation only: a reload replays more events instead
            log.warning(
                "snapshot of %s at %d failed", aggregate.id, aggregate.version, exc_info=True
            )

    def _recorder(self) -> SessionRecorder:
        rec = self.recorder
        if not (hasattr(rec, "select_session_events") and hasattr(rec, "count_session_events")):
            raise TypeError(f"{type(rec).__name__} cannot list a session's events")
        return cast(SessionRecorder, rec)

    def count_events(self, *, after: int = 0) -> int:
        """How many of the session's events are stored after ``after`` (one indexed count,
        nothing decoded)."""
        return self._recorder().count_session_events(self.session_id, after=after)

    def last_position(self) -> int:
        """The position of the session's newest stored event, 0 with none (an index seek,
        nothing decoded): where a watcher's cursor starts."""
        return self._recorder().last_session_position(self.session_id)

    def audit(self, *, after: int = 0, limit: int = 1000) -> list[AuditRecord]:
        out = []
        for position, stored in self._recorder().select_session_events(
            self.session_id, after=after, limit=limit
        ):
            event = self._decode(position, stored)
            out.append(
                AuditRecord(
                    position=position,
                    aggregate=aggregate_name(event),
                    version=stored.originator_version,
                    event=type(event).__qualname__,
                    timestamp=getattr(event, "timestamp", None),
                    payload=event_payload(event),
                )
            )
        return out

    def replay(self) -> Iterator[list[Any]]:
        """The session's events in storage order, grouped into the batches they were
        saved in (each batch ends with its Session event)."""
        after = 0
        batch: list[Any] = []
        while True:
            rows = self._recorder().select_session_events(self.session_id, after=after, limit=1000)
            if not rows:
                break
            for position, stored in rows:
                after = position
                event = self._decode(position, stored)
                batch.append(event)
                if isinstance(event, BATCH_END):
                    yield batch
                    batch = []
        if batch:
            yield batch

    def verify_chain(self) -> ChainReport:
        """Recompute the session's hash chain from its stored events (reading only).
        Every event is also decoded and checked against its type's schema: one that does
        not is a break at its position (the walk goes on to find the others)."""

        undecodable: list[ChainBreak] = []

        def decoded() -> Iterator[tuple[int, StoredEvent]]:
            for position, stored in paged(self._recorder().select_session_events, self.session_id):
                try:
                    self._decode(position, stored)
                except StorageCorruptError as exc:  # a break too: the walk goes on
                    undecodable.append(ChainBreak(position, position, str(exc), "decode"))
                yield position, stored

        report = verify_chain(self.session_id, decoded())
        if undecodable:
            report.breaks = sorted([*report.breaks, *undecodable], key=lambda b: b.position)
        return report

    def chain_anchor(self) -> tuple[str, int, bool]:
        """What ``Session.ChainStarted`` records: the chain recomputed over every stored
        event, their number, and whether any boundary predates the chain."""
        return anchor_of(paged(self._recorder().select_session_events, self.session_id))

    def close(self) -> None:
        self._owed.clear()
        closer = getattr(self._read_store, "close", None)
        if closer is not None:
            closer()
        for rec in self._recorders:
            closer = getattr(rec, "close", None)
            if closer is not None:
                closer()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None


_NEXT = (
    "Restore the database from a backup; pico check URL --session S lists every damaged "
    "event, and a read-only open still reads what is intact"
)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _snapshot_due(aggregate: Aggregate, version: int, new_events: int) -> bool:
    """Did a save of ``new_events`` that left ``aggregate`` at ``version`` (its
    ``_version``: the property is a Python call a save) cross a multiple of the
    aggregate's snapshot interval?"""
    if (
        not new_events
        or version // SNAPSHOT_INTERVAL == (version - new_events) // SNAPSHOT_INTERVAL
    ):
        # No multiple of the interval crossed, so none of a multiple of it (most saves:
        # the aggregate's scale, a conversation's context length, is not read).
        return False
    interval = SNAPSHOT_INTERVAL * int(getattr(aggregate, "snapshot_scale", 1))
    return version // interval != (version - new_events) // interval


#: A saved batch ends with its boundary: a command's Committed, or an opening's Claimed
#: (the audit replay and ``pico check`` both cut the log there).
BATCH_END = BOUNDARIES
