"""The memory backend: an in-process recorder and the in-memory read model.

A batch's version checks run before anything is applied, and events plus read-model rows
are published under one lock, so a conflicting batch writes nothing and no reader sees
half a commit. ``memory://name`` databases live for the process; ``memory://`` is private.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent

from pico.domain.ids import stream_uuid
from pico.infrastructure.codec import stored_event
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import RowOp

__all__ = ["MemoryDatabase", "MemoryRecorder", "named_database"]


#: An event as the database keeps it: (stream id as an int, version, topic, body). The
#: same tuple is in its stream and in its session's log.
Kept = tuple[int, int, str, bytes]


class MemoryDatabase:
    """Every stored event in its stream (``streams``) and in its session's log (``log``),
    as one exact tuple of ints, strings and bytes, not a ``StoredEvent`` object:
    the garbage collector stops tracking such a tuple, and a memory session holds ~38
    events a turn (a ``StoredEvent`` and its attribute dict were two tracked objects
    each, which every full collection walked again: ~13% of a 2,000-turn memory run).
    ``session_log`` and ``MemoryRecorder.select_events`` hand out ``StoredEvent``s.
    Snapshots (the newest of a stream only) stay ``StoredEvent``s."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Keyed by the stream id's int: a UUID hashes in Python (``UUID.__hash__``), an
        #: int in C, and every saved event is looked up twice (its version check and its
        #: append): ~150 Python calls an agent turn.
        self.streams: dict[int, list[Kept]] = {}
        self.snapshots: dict[UUID, list[StoredEvent]] = {}
        self.log: dict[str, list[Kept]] = {}
        self.read_stores: dict[str, MemoryReadStore] = {}
        self._ids: dict[int, UUID] = {}  # each stream's id by its int, for the log

    def read_store(self, session_id: str) -> MemoryReadStore:
        # Every saved batch asks (``MemoryRecorder.publish``): a store once made is never
        # removed (a read-only JSONL store puts its own in when it opens, before anything
        # reads it), so a plain read finds it.
        store = self.read_stores.get(session_id)
        if store is not None:
            return store
        with self.lock:
            store = self.read_stores.get(session_id)
            if store is None:
                store = self.read_stores[session_id] = MemoryReadStore(session_id, self.lock)
            return store

    def append(self, session_id: str, stored_events: Iterable[StoredEvent]) -> None:
        """Add checked events to their streams and to the session's log (call under the
        lock)."""
        streams = self.streams
        log = self.log.setdefault(session_id, [])
        for e in stored_events:
            oid = e.originator_id
            if not isinstance(oid, UUID):
                oid = stream_uuid(oid)
            number = oid.int
            stream = streams.get(number)
            if stream is None:
                stream = streams[number] = []
                self._ids[number] = oid
            kept = (number, e.originator_version, e.topic, e.state)
            stream.append(kept)
            log.append(kept)

    def last_version(self, oid: UUID | str) -> int | None:
        """The newest version of a stream (None: no event)."""
        stream = self.streams.get(stream_uuid(oid).int)
        return stream[-1][1] if stream else None

    def session_log(
        self, session_id: str, start: int = 0, stop: int | None = None
    ) -> list[StoredEvent]:
        """The session's stored events ``start:stop`` of its log (call under the lock)."""
        ids = self._ids
        window = self.log.get(session_id, [])[start:stop]
        return [
            stored_event(ids[oid], version, topic, state) for oid, version, topic, state in window
        ]

    def log_length(self, session_id: str) -> int:
        return len(self.log.get(session_id, ()))


_named: dict[str, MemoryDatabase] = {}
_named_lock = threading.Lock()


def drop_database(name: str) -> None:
    """Forget the named memory database (``memory://name``); a later open starts empty."""
    with _named_lock:
        _named.pop(name, None)


def named_database(name: str) -> MemoryDatabase:
    if not name:
        return MemoryDatabase()
    with _named_lock:
        db = _named.get(name)
        if db is None:
            db = _named[name] = MemoryDatabase()
        return db


def _version(e: StoredEvent) -> int:
    return e.originator_version


def _kept_version(e: Kept) -> int:
    return e[1]


def _window(
    stream: Sequence[Any],
    key: Callable[[Any], int],
    gt: int | None,
    lte: int | None,
    desc: bool,
    limit: int | None,
) -> tuple[int, int]:
    """The slice of a stream (versions increasing) that ``select_events`` returns."""
    start = 0 if gt is None else bisect.bisect_right(stream, gt, key=key)
    end = len(stream) if lte is None else bisect.bisect_right(stream, lte, key=key)
    if limit is not None and limit >= 0:  # only what is returned is copied
        if desc:
            start = max(start, end - limit)
        else:
            end = min(end, start + limit)
    return start, end


class MemoryRecorder(AggregateRecorder):
    def __init__(self, db: MemoryDatabase, *, snapshots: bool = False) -> None:
        self.db = db
        self.is_events = not snapshots

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        session_id: str = kwargs.get("session_id", "")
        ops: Sequence[RowOp] = kwargs.get("ops", ())
        with self.db.lock:
            self.check_versions(stored_events)
            self.publish(stored_events, session_id, ops)
        return None

    def check_versions(self, stored_events: Sequence[StoredEvent]) -> None:
        """Refuse a batch whose versions do not extend their streams (``IntegrityError``),
        before anything is applied. Call under the database lock."""
        if not self.is_events:
            return
        pending: dict[int, int] = {}
        streams = self.db.streams
        for e in stored_events:
            # ``stream_uuid`` and ``last_version`` inline: ~4 events a command, and a
            # Python call is most of what checking one costs.
            oid = e.originator_id
            number = (oid if isinstance(oid, UUID) else stream_uuid(oid)).int
            last = pending.get(number)
            if last is None:
                # A new stream accepts any first version (the library's recorders take
                # version 0 too); after that versions must increase.
                stream = streams.get(number)
                last = stream[-1][1] if stream else -1
            if e.originator_version <= last:
                raise IntegrityError(
                    f"stream {stream_uuid(oid)} already has version {e.originator_version}"
                )
            pending[number] = e.originator_version

    def publish(
        self, stored_events: Sequence[StoredEvent], session_id: str, ops: Sequence[RowOp]
    ) -> None:
        """Apply a checked batch: streams, the session's log and read-model rows, at once
        for every reader (under the database lock)."""
        if not self.is_events:  # only the newest snapshot is ever read
            for e in stored_events:
                self.db.snapshots[stream_uuid(e.originator_id)] = [e]
        else:
            self.db.append(session_id, stored_events)
        if ops:
            self.db.read_store(session_id).apply(ops)

    @contextmanager
    def exclusive(self, session_id: str = "") -> Iterator[None]:
        """No other writer commits while an opening claim reloads and saves (one lock)."""
        with self.db.lock:
            yield

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """A stream's events in the version window, found by bisection (a stream's versions
        increase): a reload after a snapshot, or a read of the newest snapshot, copies
        only what it returns, however long the stream."""
        oid = stream_uuid(originator_id)
        with self.db.lock:
            if self.is_events:
                kept = self.db.streams.get(oid.int, [])
                start, end = _window(kept, _kept_version, gt, lte, desc, limit)
                out = [stored_event(oid, v, topic, state) for _, v, topic, state in kept[start:end]]
            else:
                stream = self.db.snapshots.get(oid, [])
                start, end = _window(stream, _version, gt, lte, desc, limit)
                out = stream[start:end]
        if desc:
            out.reverse()
        return out[:limit] if limit is not None and limit < 0 else out

    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]:
        with self.db.lock:
            window = self.db.session_log(session_id, after, after + limit)
        return [(after + i + 1, e) for i, e in enumerate(window)]

    def last_session_position(self, session_id: str) -> int:
        with self.db.lock:
            return self.db.log_length(session_id)

    def count_session_events(self, session_id: str, *, after: int) -> int:
        with self.db.lock:
            return max(0, self.db.log_length(session_id) - after)
