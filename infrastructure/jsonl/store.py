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

A read-only store follows the writer (of this process or another): ``refresh`` reads what
was appended after the bytes it has consumed — a ``stat`` first, nothing read when the
journal did not grow — and applies every new complete batch the way opening does, all of
them decoded and projected before any is applied; a torn tail is left for the next
refresh. Its reads refresh first (the read model's ``read()`` at its outermost level, the
recorder's session reads outside one), so a snapshot is never torn by a refresh inside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError, StoredEvent

from pico.domain.errors import (
    ConfigurationError,
    SessionLockedError,
    StorageCorruptError,
    StorageUnavailableError,
    UnknownSessionError,
)
from pico.domain.state import StateWrite
from pico.infrastructure.jsonl.journal import (
    NAME_MAX,
    SESSION_TOPIC,
    Batch,
    Cursor,
    Journal,
    Loaded,
    WorkingBatch,
    check_append,
    session_name_fits,
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


def _after_fork_in_child() -> None:
    """A forked child inherits every writer's lock and journal descriptors. An ``flock``
    belongs to the open file, so a child that kept its copy would hold the session's lock
    after its parent closed, until it exited. The child closes its copies (it never
    unlocks: that would drop its parent's lock too), and its handles write nothing."""
    for store in list(_writers.values()):
        store.inherited()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        self._inherited = False  # a forked child's copy of a writer: it writes nothing
        self._lifetimes: dict[str, Path] = {}  # live working scope -> its sidecar
        # A read-only store follows the journal: what it consumed, and which file it is.
        self._cursor = Cursor()
        self._identity: tuple[int, int] | None = None
        self._mapper: Any = None
        self._refreshing = threading.RLock()
        self._in_refresh = False
        self._broken: str | None = None  # a refresh failed while applying: no more reads
        self._reading = threading.local()  # per thread: read snapshots open (nesting depth)
        if read_only:
            self.db.read_stores[session_id] = _FollowingReadStore(session_id, self)

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
        if not session_name_fits(self.session_id):
            raise ConfigurationError(
                f"the session name {self.session_id!r} is too long for a JSONL store: its "
                f"files are named after it, percent-encoded, and would be longer than the "
                f"{NAME_MAX} bytes a file name may take (a non-ASCII character takes 9); "
                "choose a shorter name"
            )
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
        for batch in loaded.batches:
            self._publish(batch, self._prepare(mapper, batch, loaded, retired, missing))
        self._check_missing(retired, missing)
        self._mapper = mapper
        if self.read_only:
            self._cursor.advance(loaded)
            st = journal.main.stat()
            self._identity = (st.st_dev, st.st_ino)
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

    def _prepare(
        self,
        mapper: Any,
        batch: Batch,
        loaded: Loaded,
        retired: dict[str, list[int]],
        missing: list[tuple[str, int]],
    ) -> list[RowOp]:
        """A batch's read-model rows (its working writes' included), decoded and projected
        without touching the database; notes retirements and missing working records."""
        domain = [self._decode(mapper, e) for e in batch.events]
        try:
            ops: list[RowOp] = project(domain)
        except Exception as exc:  # decodable events that break an invariant
            raise StorageCorruptError(
                f"{self.journal.main}: batch {batch.lo}..{batch.hi} decodes but cannot be "
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
        return ops

    def _check_missing(self, retired: dict[str, list[int]], missing: list[tuple[str, int]]) -> None:
        journal = self.journal
        for scope, first in missing:  # a sidecar may go only once its lifetime retired
            if not any(seq >= first for seq in retired.get(scope, ())):
                raise StorageCorruptError(
                    f"{journal.main}: the working batch of scope {scope!r} at {first} is "
                    f"committed but its sidecar record is missing from {journal.scopes}; "
                    "nothing was changed. Restore the sidecar files from a backup"
                )

    def _publish(self, batch: Batch, ops: list[RowOp]) -> None:
        """Add a prepared batch to the database: streams, the session's log, rows."""
        self.db.append(self.session_id, batch.events)
        try:
            self.read_store.apply(ops)
        except Exception as exc:
            raise StorageCorruptError(
                f"{self.journal.main}: batch {batch.lo}..{batch.hi} cannot be applied to the "
                f"read model ({type(exc).__name__}: {exc}); nothing was changed. Restore "
                "the file from a backup; pico check lists what is damaged"
            ) from exc
        self.last = batch.hi

    # ------------------------------------------------------------------ follow
    def refresh(self, mapper: Any = None) -> int:
        """Read-only: apply the batches another writer appended since the last read, and
        return how many. A ``stat`` decides whether to read at all; only the bytes after
        the consumed offset are read, a torn tail is left for the next refresh, and every
        new batch is decoded and projected before the first is applied (then all of them
        at once, under the database lock: no reader sees part of one). A journal that is
        gone, shorter than what was consumed or replaced by another file, and a batch
        that does not decode, are ``StorageCorruptError`` (nothing applied); an
        unreadable file is ``StorageUnavailableError``. A no-op on a writing store (its
        database is the journal's source) and before the store is open."""
        if not self.read_only or self._identity is None:
            return 0
        with self._refreshing:
            if self._in_refresh:  # a read while applying: it sees the state before
                return 0
            self._in_refresh = True
            try:
                return self._refresh(mapper or self._mapper)
            except OSError as exc:
                raise StorageUnavailableError(
                    f"cannot read the JSONL journal {self.location}: {type(exc).__name__}: "
                    f"{exc}; check that the files are readable, then read again"
                ) from exc
            finally:
                self._in_refresh = False

    def _refresh(self, mapper: Any) -> int:
        journal = self.journal
        if self._broken is not None:
            raise StorageCorruptError(self._broken)
        cursor = self._cursor
        try:
            st = os.stat(journal.main)
        except FileNotFoundError:
            raise StorageCorruptError(
                f"{journal.main}: the journal this read-only handle follows is gone; nothing "
                "was changed. Restore it from a backup, then open the session again"
            ) from None
        if (st.st_dev, st.st_ino) != self._identity or st.st_size < cursor.main_length:
            raise StorageCorruptError(
                f"{journal.main}: the journal is {st.st_size} bytes long, or another file, "
                f"but this read-only handle already read {cursor.main_length} bytes of it "
                f"(through batch ..{cursor.last}): it was truncated or replaced (pico only "
                "appends); nothing was changed. Restore the file from a backup, then open the "
                "session again"
            )
        if st.st_size == cursor.main_length:
            return 0
        loaded = journal.load(cursor)
        if not loaded.batches:
            return 0  # only a torn tail: the writer is mid-append
        retired: dict[str, list[int]] = {}
        missing: list[tuple[str, int]] = []
        prepared = [
            (batch, self._prepare(mapper, batch, loaded, retired, missing))
            for batch in loaded.batches
        ]
        self._check_missing(retired, missing)
        with self.db.lock:
            try:
                for batch, ops in prepared:
                    self._publish(batch, ops)
            except StorageCorruptError as exc:
                # Part of the batches is applied: this handle's reads are wrong from here.
                self._broken = f"{exc} (this read-only handle stopped following; open again)"
                raise
            cursor.advance(loaded)
        return len(prepared)

    def follow(self) -> None:
        """Refresh, unless this thread is inside a read snapshot (which must not change)."""
        if self.read_only and not getattr(self._reading, "depth", 0):
            self.refresh()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A read snapshot: refreshed at its start (outermost only), then held."""
        depth: int = getattr(self._reading, "depth", 0)
        if depth == 0:
            self.refresh()
        with self.db.lock:
            self._reading.depth = depth + 1
            try:
                yield
            finally:
                self._reading.depth = depth

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
        if self._inherited:
            raise StorageUnavailableError(
                f"{self.journal.main}: this handle was opened by the process this one was "
                "forked from, which owns the session; open the session in this process"
            )
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

    def inherited(self) -> None:
        """In a forked child: close the copies of the lock and journal descriptors (see
        ``_after_fork_in_child``); every later write refuses."""
        self._inherited = True
        lock, self._lock_fd = self._lock_fd, None
        if lock is not None:
            with contextlib.suppress(OSError):
                os.close(lock)
        with contextlib.suppress(OSError):
            self.journal.close()

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

    # A read-only handle follows the journal: its session reads refresh first.
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        self.store.follow()
        return super().select_events(originator_id, gt=gt, lte=lte, desc=desc, limit=limit)

    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]:
        self.store.follow()
        return super().select_session_events(session_id, after=after, limit=limit)

    def last_session_position(self, session_id: str) -> int:
        self.store.follow()
        return super().last_session_position(session_id)

    def count_session_events(self, session_id: str, *, after: int) -> int:
        self.store.follow()
        return super().count_session_events(session_id, after=after)

    def close(self) -> None:
        self.store.close()


class _FollowingReadStore(MemoryReadStore):
    """A read-only store's read model: every read snapshot refreshes from the journal
    first (the outermost one only: a snapshot never changes under its reader)."""

    # A slot, not an instance attribute: ``pico check`` compares the instance's indexes
    # (its ``vars()``) with a replay's, and the store it follows is not one.
    __slots__ = ("_follows",)

    def __init__(self, session_id: str, store: JsonlStore) -> None:
        super().__init__(session_id, store.db.lock)
        self._follows = store

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._follows.reading():
            yield
