"""The JSONL backend (seed 003 §1.4, §4.6, §7.5): the memory backend's indexes, loaded
whole from plain files on open and kept in step with them by appending one line per batch.

A commit checks the batch against the in-memory streams, encodes it, writes the working
sidecar line (if any) and then the main line, each completely, fsynced in ``fsync``
durability — and only then publishes the batch to readers. The journal's last sequence
advances after the write (seed 000 CheckAppend). One writer per session: it holds an
exclusive ``flock`` on the lock file for the store's lifetime; a read-only open takes no
lock and writes nothing.

Opening replays every complete main line through the same projector the other backends
run at commit time (and each working batch through ``project_working``), so the read model
is what the memory backend would hold. A retirement batch in the main journal is
authoritative: it hides its scope's records through its sequence whether or not the
sidecar was unlinked afterwards; a sidecar whose lifetime a retirement ended is unlinked
by the next writer (each lifetime has its own file, so a reused scope name never meets the
old lifetime's file).
"""

from __future__ import annotations

import fcntl
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError, StoredEvent

from pico.domain.errors import (
    SessionLockedError,
    StorageCorruptError,
    StorageUnavailableError,
    UnknownSessionError,
)
from pico.domain.state import StateWrite
from pico.infrastructure.jsonl.journal import (
    SESSION_TOPIC,
    Batch,
    Journal,
    WorkingBatch,
    check_append,
)
from pico.infrastructure.memory import MemoryDatabase, MemoryRecorder
from pico.projections.memory import MemoryReadStore
from pico.projections.ops import PutCommit, RetireWorking, RowOp, project, project_working

__all__ = ["JsonlRecorder", "JsonlStore", "live_writer"]

log = logging.getLogger("pico.jsonl")

MAIN = "main"

#: The writers open in this process, by (resolved main file, session): ``pico check``
#: compares a journal's replay with the read model its live owner answers from.
_writers: weakref.WeakValueDictionary[tuple[str, str], JsonlStore] = weakref.WeakValueDictionary()


def live_writer(directory: Path, session_id: str) -> JsonlStore | None:
    """The store of this process that owns ``session_id`` in ``directory``, if any."""
    main = Journal(directory, session_id, fsync=False).main
    return _writers.get((str(main.resolve()), session_id))


class JsonlStore:
    """One session's JSONL files and the in-memory database built from them."""

    def __init__(
        self, directory: Path, session_id: str, *, durability: str, read_only: bool
    ) -> None:
        self.journal = Journal(directory, session_id, fsync=durability == "fsync")
        self.session_id = session_id
        self.read_only = read_only
        self.db = MemoryDatabase()
        self.last = 0  # the journal's last durable sequence
        self._lock_fd: int | None = None
        self._lifetimes: dict[str, Path] = {}  # live working scope -> its sidecar

    @property
    def location(self) -> str:
        return str(self.journal.main)

    @property
    def read_store(self) -> MemoryReadStore:
        return self.db.read_store(self.session_id)

    # ------------------------------------------------------------------ open
    def open(self, mapper: Any) -> None:
        """Load the session (see the module docstring). The directory being a file, or
        the files unreadable or not writable, is ``StorageUnavailableError`` (nothing
        created or changed)."""
        directory = self.journal.directory
        if directory.exists() and not directory.is_dir():
            raise StorageUnavailableError(
                f"the JSONL store {directory} is a file; a jsonl:/// URL names a directory "
                "(pico creates it and the session's files in it)"
            )
        try:
            self._open(mapper)
        except OSError as exc:
            raise StorageUnavailableError(
                f"cannot open the JSONL store {directory}: {type(exc).__name__}: {exc}; check "
                "that the directory and its files are readable (and writable, to write)"
            ) from exc

    def _open(self, mapper: Any) -> None:
        journal = self.journal
        if not journal.main.exists():
            if self.read_only:
                raise UnknownSessionError(f"{self.session_id} (no journal at {journal.main})")
            journal.directory.mkdir(parents=True, exist_ok=True)
        if not self.read_only:
            self._take_lock()
            if not journal.main.exists():
                journal.create()
        loaded = journal.load()
        retired: dict[str, list[int]] = {}
        missing: list[tuple[str, int]] = []
        events = self.db.streams
        log_ = self.db.log.setdefault(self.session_id, [])
        store = self.read_store
        for batch in loaded.batches:
            domain = [self._decode(mapper, e) for e in batch.events]
            try:
                ops: list[RowOp] = project(domain)
            except Exception as exc:  # decodable events that break an invariant
                raise StorageCorruptError(
                    f"{journal.main}: batch {batch.lo}..{batch.hi} decodes but cannot be "
                    f"replayed ({type(exc).__name__}: {exc}); nothing was changed. Restore "
                    "the file from a backup; pico check lists what is damaged"
                ) from exc
            commit = next((op for op in ops if isinstance(op, PutCommit)), None)
            for op in ops:
                if isinstance(op, RetireWorking):
                    retired.setdefault(op.scope, []).append(op.seq)
            working = loaded.working.get(batch.hi)
            if working is not None:
                ops.extend(project_working(working.writes))
            elif commit is not None and commit.scope != MAIN:
                missing.append((commit.scope, commit.first))
            for e in batch.events:
                oid = e.originator_id
                events.setdefault(oid if isinstance(oid, UUID) else UUID(str(oid)), []).append(e)
                log_.append(e)
            try:
                store.apply(ops)
            except Exception as exc:
                raise StorageCorruptError(
                    f"{journal.main}: batch {batch.lo}..{batch.hi} cannot be applied to the "
                    f"read model ({type(exc).__name__}: {exc}); nothing was changed. Restore "
                    "the file from a backup; pico check lists what is damaged"
                ) from exc
            self.last = batch.hi
        for scope, first in missing:  # a sidecar may go only once its lifetime retired
            if not any(seq >= first for seq in retired.get(scope, ())):
                raise StorageCorruptError(
                    f"{journal.main}: the working batch of scope {scope!r} at {first} is "
                    f"committed but its sidecar record is missing from {journal.scopes}; "
                    "nothing was changed. Restore the sidecar files from a backup"
                )
        if self.read_only:
            return
        # The files made consistent for the next append: a torn main tail and sidecar
        # records no main line confirmed are cut; sidecars of retired lifetimes go.
        if loaded.torn:
            journal.truncate(journal.main, loaded.main_length)
        for path, length in loaded.sidecars.items():
            lifetime = loaded.lifetimes.get(path)
            if lifetime is None:
                self._unlink(path)  # nothing committed in it
                continue
            first, scope = lifetime
            if any(seq >= first for seq in retired.get(scope, ())):
                self._unlink(path)  # a delayed cleanup of a retired lifetime
                continue
            if path.stat().st_size != length:
                journal.truncate(path, length)
            self._lifetimes[scope] = path
        _writers[(str(journal.main.resolve()), self.session_id)] = self

    def _decode(self, mapper: Any, stored: StoredEvent) -> Any:
        try:
            return mapper.to_domain_event(stored)
        except Exception as exc:
            raise StorageCorruptError(
                f"{self.journal.main}: event {stored.originator_id} version "
                f"{stored.originator_version} ({stored.topic!r}) does not decode "
                f"({type(exc).__name__}: {exc}); nothing was changed"
            ) from exc

    def _take_lock(self) -> None:
        fd = os.open(self.journal.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SessionLockedError(self.session_id, str(self.journal.lock)) from None
        self._lock_fd = fd

    def _unlink(self, path: Path) -> None:
        try:
            self.journal.unlink(path)
        except OSError:  # retirement already hides it; the next writer tries again
            log.warning("could not remove retired working file %s", path, exc_info=True)

    # ------------------------------------------------------------------ write
    def write(
        self, events: Sequence[StoredEvent], ops: Sequence[RowOp], working: Sequence[StateWrite]
    ) -> bool:
        """Make one batch durable in the files; False for a duplicate (already stored).
        Raises ``IntegrityError`` for a gap (another writer's batch is missing here)."""
        versions = [e.originator_version for e in events if e.topic.startswith(SESSION_TOPIC)]
        if not versions:
            raise IntegrityError("a batch without a session event cannot be journaled")
        lo, hi = min(versions), max(versions)
        verdict = check_append(self.last, lo, hi)
        if verdict == "duplicate":
            return False
        if verdict == "gap":
            raise IntegrityError(f"batch {lo}..{hi} does not follow the journal's {self.last}")
        commit = next((op for op in ops if isinstance(op, PutCommit)), None)
        scope = MAIN if commit is None else commit.scope
        if working:
            assert commit is not None
            path = self._lifetimes.get(scope)
            if path is None:
                path = self._lifetimes[scope] = self.journal.sidecar(scope, commit.first)
            self.journal.append_working(
                path, WorkingBatch(hi, commit.first, commit.last, list(working)), scope
            )
        self.journal.append(Batch(lo, hi, scope, list(events)))
        self.last = hi  # only after the line is durably written
        for op in ops:
            if isinstance(op, RetireWorking):
                retired = self._lifetimes.pop(op.scope, None)
                if retired is not None:
                    self._unlink(retired)  # after the authoritative main retirement
        return True

    def close(self) -> None:
        key = (str(self.journal.main.resolve()), self.session_id)
        if _writers.get(key) is self:
            del _writers[key]
        self.journal.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


class JsonlRecorder(MemoryRecorder):
    """The memory recorder, with every batch appended to the journal before it is
    published."""

    def __init__(self, store: JsonlStore) -> None:
        super().__init__(store.db)
        self.store = store

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        session_id: str = kwargs.get("session_id", "")
        ops: Sequence[RowOp] = kwargs.get("ops", ())
        working: Sequence[StateWrite] = kwargs.get("working", ())
        with self.db.lock:
            self.check_versions(stored_events)
            try:
                written = self.store.write(stored_events, ops, working)
            except OSError as exc:  # disk full, I/O error: nothing was published
                raise StorageUnavailableError(
                    f"cannot write the JSONL journal {self.store.location}: "
                    f"{type(exc).__name__}: {exc}; nothing of this batch is visible (a "
                    "partial line is cut by the next writer). Free space or fix the disk"
                ) from exc
            if written:
                self.publish(stored_events, session_id, ops)
        return None

    def close(self) -> None:
        self.store.close()
