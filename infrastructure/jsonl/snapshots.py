"""Aggregate snapshots of a JSONL session (``S.snapshots.jsonl``): an optimisation only.

Without them every open would replay the Session aggregate's whole stream (one event per
batch) and each long conversation's: most of a large journal's open time. A snapshot line is
``[id, version, topic, body]``, appended after the batch it covers is durable; the newest
per aggregate wins. The file holds nothing a replay of the journal cannot rebuild, so it is
never authoritative: a torn or unparsable line, or a snapshot ahead of its stream (a
journal cut back by a crash in process durability), is dropped with a warning and that
aggregate simply replays more events. A writer's open rewrites the file to the newest
snapshot per aggregate once it holds mostly superseded ones (a new file renamed over the
old, so a crash leaves one or the other).
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

from pico.infrastructure.jsonl.journal import file_name
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
        self.path: Path = journal.directory / f"{file_name(store.session_id)}.snapshots.jsonl"
        self._fd: int | None = None

    def load(self) -> None:
        """Read the file (after the journal: a snapshot must not be ahead of its stream)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        newest: dict[UUID, StoredEvent] = {}
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        for number, raw in enumerate(complete, start=1):
            try:
                oid_text, version, topic, body = json.loads(raw)
                oid = UUID(oid_text)
                stored = StoredEvent(oid, int(version), str(topic), str(body).encode())
            except (ValueError, TypeError) as exc:
                log.warning("%s line %d: unreadable snapshot dropped (%s)", self.path, number, exc)
                continue
            stream = self.db.streams.get(oid)
            if not stream or stored.originator_version > stream[-1].originator_version:
                log.warning(
                    "%s line %d: a snapshot ahead of its stream was dropped", self.path, number
                )
                continue
            current = newest.get(oid)
            if current is None or stored.originator_version >= current.originator_version:
                newest[oid] = stored
        for key, snapshot in newest.items():
            self.streams[key] = [snapshot]
        if self.store.read_only:
            return
        if tail or len(complete) > COMPACT_RATIO * max(len(newest), 8):
            self._rewrite(list(newest.values()))

    def _rewrite(self, snapshots: Sequence[StoredEvent]) -> None:
        fresh = self.path.with_suffix(".jsonl.new")
        with open(fresh, "wb") as f:
            f.write(b"".join(_line(s) for s in snapshots))
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, self.path)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        data = b"".join(_line(e) for e in stored_events)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:  # whole lines: a short write continues where it stopped
            view = view[os.write(self._fd, view) :]
        return super().insert_events(stored_events, **kwargs)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(stored: StoredEvent) -> bytes:
    record = [str(stored.originator_id), stored.originator_version, stored.topic]
    record.append(stored.state.decode())
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
