"""The memory backend: an in-process recorder and the in-memory read model.

A batch's version checks run before anything is applied, and events plus read-model rows
are published under one lock, so a conflicting batch writes nothing and no reader sees
half a commit. ``memory://name`` databases live for the process; ``memory://`` is private.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent

from pico.domain.ids import stream_uuid
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import RowOp

__all__ = ["MemoryDatabase", "MemoryRecorder", "named_database"]


class MemoryDatabase:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.streams: dict[UUID, list[StoredEvent]] = {}
        self.snapshots: dict[UUID, list[StoredEvent]] = {}
        self.log: dict[str, list[StoredEvent]] = {}
        self.read_stores: dict[str, MemoryReadStore] = {}

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


class MemoryRecorder(AggregateRecorder):
    def __init__(self, db: MemoryDatabase, *, snapshots: bool = False) -> None:
        self.db = db
        self.streams = db.snapshots if snapshots else db.streams
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
        pending: dict[UUID, int] = {}
        streams = self.streams
        for e in stored_events:
            oid = e.originator_id
            if type(oid) is not UUID:
                oid = stream_uuid(oid)
            last = pending.get(oid)
            if last is None:
                # A new stream accepts any first version (the library's recorders take
                # version 0 too); after that versions must increase.
                stream = streams.get(oid)
                last = stream[-1].originator_version if stream else -1
            if e.originator_version <= last:
                raise IntegrityError(f"stream {oid} already has version {e.originator_version}")
            pending[oid] = e.originator_version

    def publish(
        self, stored_events: Sequence[StoredEvent], session_id: str, ops: Sequence[RowOp]
    ) -> None:
        """Apply a checked batch: streams, the session's log and read-model rows, at once
        for every reader (under the database lock)."""
        if not self.is_events:  # only the newest snapshot is ever read
            for e in stored_events:
                self.streams[stream_uuid(e.originator_id)] = [e]
        else:
            log = self.db.log.setdefault(session_id, [])
            for e in stored_events:
                self.streams.setdefault(stream_uuid(e.originator_id), []).append(e)
                log.append(e)
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
        with self.db.lock:
            stream = self.streams.get(stream_uuid(originator_id), [])
            start = 0 if gt is None else bisect.bisect_right(stream, gt, key=_version)
            end = len(stream) if lte is None else bisect.bisect_right(stream, lte, key=_version)
            if limit is not None and limit >= 0:  # only what is returned is copied
                if desc:
                    start = max(start, end - limit)
                else:
                    end = min(end, start + limit)
            out = stream[start:end]
        if desc:
            out.reverse()
        return out[:limit] if limit is not None and limit < 0 else out

    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]:
        with self.db.lock:
            log = self.db.log.get(session_id, [])
            window = log[after : after + limit]
        return [(after + i + 1, e) for i, e in enumerate(window)]

    def last_session_position(self, session_id: str) -> int:
        with self.db.lock:
            return len(self.db.log.get(session_id, []))

    def count_session_events(self, session_id: str, *, after: int) -> int:
        with self.db.lock:
            return max(0, len(self.db.log.get(session_id, [])) - after)
