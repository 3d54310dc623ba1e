"""Aggregate snapshots of a JSONL session (``S.snapshots.jsonl``): an optimisation only.

Without them every open would replay the Session aggregate's whole stream (one event per
batch) and each long conversation's: most of a large journal's open time. A snapshot line is
``[id, version, topic, body]``, appended after the batch it covers is durable; the newest
per aggregate wins. The file holds nothing a replay of the journal cannot rebuild, so it is
never authoritative: a snapshot ahead of its stream (a journal cut back by a crash in
process durability) is dropped, and an unreadable file is ignored with a warning: the
aggregates simply replay more events. A writer's open rewrites the file to the newest
snapshot per aggregate once it holds mostly superseded ones, or any ahead of its stream
(a new file renamed over the old, so a crash leaves one or the other); a file that does
not read as snapshots is left alone, and that handle neither reads nor writes it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from pico.domain.errors import StorageUnavailableError
from pico.infrastructure.jsonl.journal import Journal, file_name
from pico.infrastructure.jsonl.store import JsonlStore
from pico.infrastructure.memory import MemoryRecorder

__all__ = ["JsonlSnapshotRecorder"]

log = logging.getLogger("pico.jsonl")

#: Rewrite the file on open once it holds this many times more lines than aggregates.
COMPACT_RATIO = 4


class JsonlSnapshotRecorder(MemoryRecorder):
    """The memory snapshot recorder, with each snapshot appended to the session's
    snapshot file; ``load`` restores the newest valid ones after the journal is open."""

    def __init__(self, store: JsonlStore) -> None:
        super().__init__(store.db, snapshots=True)
        self.store = store
        journal = store.journal
        # "+" is escaped in every session's file name, so no session's journal can be
        # called like another session's snapshot file ("a.snapshots" is a session name).
        self.path: Path = journal.directory / f"{file_name(store.session_id)}+snapshots.jsonl"
        self._fd: int | None = None
        self._disabled = False  # a file we could not read is never written

    def load(self) -> None:
        """Read the file (after the journal: a snapshot must not be ahead of its stream).
        Anything wrong with it costs only speed: an unreadable file is left alone and no
        snapshot is written to it (nor read from it) by this handle."""
        try:
            if not self.path.exists():
                return
            data = self.path.read_bytes()
        except OSError as exc:
            self._give_up(f"cannot be read ({exc})")
            return
        newest: dict[UUID, StoredEvent] = {}
        ahead = False
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        for number, raw in enumerate(complete, start=1):
            try:
                oid, stored = _snapshot(raw)
            except Exception as exc:  # any damage (a huge number, deep nesting) is only a miss
                self._give_up(f"line {number} is not a snapshot ({type(exc).__name__}: {exc})")
                return
            last = self.db.last_version(oid)
            if last is None or stored.originator_version > last:
                ahead = True  # of a history the journal lost: never restore it
                continue
            current = newest.get(oid)
            if current is None or stored.originator_version >= current.originator_version:
                newest[oid] = stored
        for key, snapshot in newest.items():
            self.db.snapshots[key] = [snapshot]
        if self.store.read_only:
            return
        # A snapshot ahead of its stream must go before anything new is appended: once
        # the stream grows past it, it would look current. A torn tail is cut the same way.
        if ahead or tail or len(complete) > COMPACT_RATIO * max(len(newest), 8):
            try:
                self._rewrite(list(newest.values()))
            except OSError as exc:
                if ahead:  # left as it is, a later open would restore that snapshot
                    self._remove(exc)
                self._give_up(f"cannot be rewritten ({exc})")

    def _remove(self, why: OSError) -> None:
        """Remove a file holding a snapshot of a lost history that could not be rewritten
        (it is only a cache); one that cannot be removed either refuses the writer's open,
        before anything is appended past that snapshot."""
        try:
            self.path.unlink()
        except OSError as exc:
            raise StorageUnavailableError(
                f"{self.path} holds a snapshot of a history the journal lost, and can be "
                f"neither rewritten ({why}) nor removed ({exc}); remove it (it is only a "
                "cache of the journal) and open the session again"
            ) from exc

    def _give_up(self, why: str) -> None:
        log.warning("%s %s; this session opens without its snapshots", self.path, why)
        self.db.snapshots.clear()
        self._disabled = True

    def _rewrite(self, snapshots: Sequence[StoredEvent]) -> None:
        fresh = self.path.with_suffix(".jsonl.new")
        with open(fresh, "wb") as f:
            f.write(b"".join(_line(s) for s in snapshots))
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, self.path)
        # The rename must survive a power loss too: the old file may hold a stale snapshot.
        Journal.sync_dir(self.path.parent)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        if self._disabled:  # never write into a file we could not read
            return super().insert_events(stored_events, **kwargs)
        data = b"".join(_line(e) for e in stored_events)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fd = self._fd
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:  # whole lines: a short write continues where it stopped
                view = view[os.write(fd, view) :]
        except OSError:
            # A part of a line (a full disk): cut it off, or the file no longer reads as
            # snapshots; one that cannot be cut is never written again by this handle.
            try:
                os.ftruncate(fd, size)
            except OSError:
                self._disabled = True
            raise
        return super().insert_events(stored_events, **kwargs)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _snapshot(raw: bytes) -> tuple[UUID, StoredEvent]:
    """A snapshot line as written by ``_line`` (its stream id, and it as a stored event):
    an id, a version, a topic and a body that is a JSON object, each of its type; anything
    else raises."""
    oid_text, version, topic, body = json.loads(raw)
    if not (type(oid_text) is str and type(version) is int and version > 0):
        raise ValueError("no stream id and version")
    if not (type(topic) is str and type(body) is str):
        raise ValueError("no topic and body")
    if not isinstance(json.loads(body), dict):
        raise ValueError("its body is not a JSON object")
    oid = UUID(oid_text)
    return oid, StoredEvent(oid, version, topic, body.encode())


def _line(stored: StoredEvent) -> bytes:
    record = [str(stored.originator_id), stored.originator_version, stored.topic]
    record.append(stored.state.decode())
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
