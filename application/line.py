"""The session owner's command line: one serialized writer per session (§1.2).

It keeps the aggregates it writes in memory, allocates from the Session aggregate, persists
each command as ONE atomic save and faults the handle when persistence is uncertain.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from eventsourcing.domain import Aggregate
from opentelemetry.trace import INVALID_SPAN

from pico.application.command import Command, WorkingCommand
from pico.application.command_lock import CommandLock
from pico.application.ports import Storage
from pico.application.state import WorkingScope
from pico.application.tasks import TaskRegistry
from pico.application.telemetry import Telemetry
from pico.domain.conversation import Conversation
from pico.domain.errors import (
    ClaimContendedError,
    ClosedError,
    HandleFaultedError,
    PersistenceUncertainError,
    ReadOnlyError,
    StaleWriterError,
    StorageCorruptError,
    UnknownConversationError,
    UnknownSessionError,
    UnknownTaskError,
)
from pico.domain.ids import conversation_uuid, session_uuid, task_uuid
from pico.domain.session import MAIN, Session
from pico.domain.task import Task
from pico.domain.trigger import stamp_command, unstamp_command
from pico.domain.values import TaskSnapshot

__all__ = ["CommandLine"]

T = TypeVar("T")

#: Conversations kept in memory by the owner; others reload (from snapshots) on demand.
CACHE_SIZE = 256
#: Address policies the line remembers before it starts over (see ``CommandLine.policies``).
POLICY_CACHE_SIZE = 4096

#: A deferred command (``run(..., defer=True)``) is committed at the latest this many
#: seconds after it, unless a durable command, a drive's return or ``close`` commits it first.
FLUSH_WINDOW = 0.002
#: Every this many commands a line lets the event loop run other coroutines: other work
#: waits at most this many commands behind a task running commands back to back.
YIELD_EVERY = 4


def _keep(cache: OrderedDict[int, Any], items: Iterable[tuple[int, Any]]) -> None:
    """Put ``items`` (id, aggregate) in ``cache`` as the most recently used; keep at most
    ``CACHE_SIZE`` (a save's touched aggregates go in with one call, not one each)."""
    for key, value in items:
        cache[key] = value
        cache.move_to_end(key)
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


class CommandLine:
    def __init__(
        self,
        storage: Storage,
        session: Session,
        *,
        read_only: bool,
        definitions: TaskRegistry | None = None,
    ) -> None:
        self.storage = storage
        self.session = session
        self.session_id = storage.session_id
        self.read_only = read_only
        self.faulted: str | None = None
        self.closed = False
        self._lock = CommandLock()
        self._cache: OrderedDict[int, Conversation] = OrderedDict()
        self._task_cache: OrderedDict[int, Task] = OrderedDict()
        # Address policies (rewind or not) of committed commands: established once and
        # never changed (§4), so a write to a known address reads no policy row (a stream
        # saving frames read one per frame). Bounded: keys can be per input, so the
        # cache starts over once it holds POLICY_CACHE_SIZE.
        self.policies: dict[tuple[str, str, str, str], bool] = {}
        self._building: Command | None = None
        self.definitions = definitions or TaskRegistry()
        # Called after every commit that changed tasks or session state, with its command
        # (the scheduler wakes its drives), and with None when a fault may need noticing.
        self.on_commit: Callable[[Command | None], None] | None = None
        # Called once everything saved so far is durable (a durable save, a flush), and
        # when the handle faults: where watchers read what became durable (watch.py).
        self.on_durable: Callable[[], None] | None = None
        # Called after each save with its batch and events (in storage order), before it
        # is durable; None when nobody listens (the events are then not collected).
        self.on_saved: Callable[[Command, list[Any]], None] | None = None
        self.on_fault: Callable[[str], None] | None = None
        # Called before a write is admitted (a lease: application/lease.py); it faults the
        # line when the lease's local deadline passed before its timer could run.
        self.admission: Callable[[], None] | None = None
        # Group commit: commands saved with defer=True and not yet flushed.
        self.pending = False
        # Deferred commands saved, and how many of them a commit has made durable
        # (``run(group=True)``).
        self._deferred = 0
        self._durable = 0
        # Whether durable commands gain by sharing a commit (``run(group=True)``): where a
        # commit is a transaction of its own to end (SQLite: a COMMIT, an fsync under
        # durability="fsync"). Not on PostgreSQL, whose command is one round trip with its
        # COMMIT (a shared one would add a round trip), nor where a save is the write.
        self.groups = bool(getattr(storage, "shares_commits", False))
        # The flush window's timer, armed for ``_flush_at`` (the time it asked the loop
        # for: the handle is gone once it fires), and the deadline of the pending
        # commands (``_flush_by``: the first one's save plus ``FLUSH_WINDOW``). A commit
        # leaves the timer armed: it fires, finds nothing pending or a later deadline, and
        # is done or armed again for that. One timer a window, not one armed and cancelled
        # for each run of deferred commands (~4 a turn, each a TimerHandle, a heap push and
        # a cancelled entry for the loop to pop).
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_at = 0.0
        self._flush_by = 0.0
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        # Commands run since one last yielded the event loop (``run``).
        self._unyielded = 0
        # One span per command (application/telemetry.py); the harness sets its own.
        self.telemetry = Telemetry()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        storage: Storage,
        *,
        read_only: bool,
        definitions: TaskRegistry | None = None,
        gate: Callable[[Session], None] | None = None,
    ) -> CommandLine:
        """Read the session's stored state and, for writing, then append a claim.

        Nothing is written before the stored state was read and decoded: the Session
        aggregate, the session row, the live tasks and the root conversation (all O(live),
        never a history scan), so a damaged file raises ``StorageCorruptError`` and stays
        byte-identical. Definitions are checked against live tasks only on a write open
        (they are needed to drive, not to read).

        The claim moves the session stream's version, so any previous owner is refused at
        its own next commit. It is taken under the storage's write lock against the head
        it reloads there, so an owner committing meanwhile cannot refuse it; a claim that
        still fails is fatal: no handle is returned.

        ``gate`` (the resume gate, ``gate.py``) is called with the Session aggregate the
        claim is about to land on (a new one for a new session), under the same lock and
        before the claim: when it raises (a hard configuration change), nothing is
        written; the first fingerprint it records lands in the claim's batch.

        Once claimed, the line mirrors the session's live tasks (``own_tasks``: it is their
        only writer).
        """
        sid = storage.session_id
        loaded = _load_session(storage)
        live: list[TaskSnapshot] = []
        root: Conversation | None = None
        if loaded is None:
            if read_only:
                raise UnknownSessionError(sid)
            session = Session(session_id=sid)
        else:
            session = loaded
            live, root = _read_stored_state(storage, session)
        registry = definitions or TaskRegistry()
        if loaded is not None and not read_only:
            # §5.2/§6.6: validate live definitions before claiming or executing anything;
            # only live rows are read (the partial index), never terminal history.
            registry.validate_live(live)
        head = session.head
        if not read_only:
            session = _claim(storage, session, gate)
            own = getattr(storage, "own_tasks", None)
            if own is not None:
                own()
        line = cls(storage, session, read_only=read_only, definitions=registry)
        if root is not None and not read_only and session.head == head:
            # No command committed between the root's load and the claim (every commit
            # moves the head): the aggregate is current, and the first command that writes
            # to the root does not replay it again.
            line._remember(root)
        return line

    # ------------------------------------------------------------------ state
    def check_usable(self, *, write: bool = False) -> None:
        if self.closed:
            raise ClosedError(self.session_id)
        if write and self.admission is not None and self.faulted is None:
            self.admission()
        if self.faulted is not None:
            raise HandleFaultedError(self.session_id, self.faulted)
        if write and self.read_only:
            raise ReadOnlyError(self.session_id)

    def owner_of(self, conversation_id: int) -> int | None:
        """The task owning a conversation: from the aggregate this line keeps when it has
        it (the owner link never changes after creation), else one indexed read."""
        conv = self._cache.get(conversation_id)
        if conv is not None:
            return conv.owner_task_id
        return self.storage.reads.owners([conversation_id]).get(conversation_id)

    def load_conversation(self, conversation_id: int) -> Conversation:
        conv = self._cache.get(conversation_id)
        if conv is not None:
            self._cache.move_to_end(conversation_id)
            return conv
        if not isinstance(conversation_id, int) or conversation_id < 1:
            raise UnknownConversationError(conversation_id)
        loaded = self.storage.load(conversation_uuid(self.session_id, conversation_id))
        if loaded is None:
            raise UnknownConversationError(conversation_id)
        if not isinstance(loaded, Conversation):
            raise StorageCorruptError(f"aggregate for conversation {conversation_id} is {loaded!r}")
        self._remember(loaded)
        return loaded

    def load_task(self, task_id: int) -> Task:
        task = self._task_cache.get(task_id)
        if task is not None:
            self._task_cache.move_to_end(task_id)
            return task
        if not isinstance(task_id, int) or task_id < 1:
            raise UnknownTaskError(task_id)
        loaded = self.storage.load(task_uuid(self.session_id, task_id))
        if loaded is None:
            raise UnknownTaskError(task_id)
        if not isinstance(loaded, Task):
            raise StorageCorruptError(f"aggregate for task {task_id} is {loaded!r}")
        self._remember_task(loaded)
        return loaded

    def cached_task(self, task_id: int) -> Task | None:
        """The task as this line last committed it, if cached and not being changed by an
        (async) build in progress; None means: read it."""
        building = self._building
        if building is not None and task_id in building.touched_tasks:
            return None  # an (async) build in progress holds uncommitted changes to it
        return self._task_cache.get(task_id)

    def committed_role(self, task_id: int) -> str | None:
        """The role of a task as this line last committed it, if it is cached (the owner is
        the only writer, so a cached terminal task is terminal in storage too)."""
        task = self.cached_task(task_id)
        return None if task is None else task.role

    def _remember_task(self, task: Task) -> None:
        _keep(self._task_cache, ((task.task_id, task),))

    def _remember(self, conv: Conversation) -> None:
        _keep(self._cache, ((conv.conversation_id, conv),))

    # ------------------------------------------------------------------ commands
    async def run(
        self,
        build: Callable[[Any], T | Awaitable[T]],
        *,
        working: WorkingScope | None = None,
        defer: bool = False,
        task: int | None = None,
        group: bool = False,
    ) -> T:
        """Build and persist one command atomically.

        ``task`` names the task whose execution runs the command; its boundary records it
        (``Session.Committed.task``), so an auditor sees which task wrote each batch.

        ``defer=True`` is group commit for commands nothing outside the process waits on
        (settlements the scheduler carries on from): the command is saved and published
        at once, and it becomes durable with the next durable command, ``flush``, a
        drive's return, or at the latest after ``FLUSH_WINDOW``. A crash before then
        loses it together with every later command, never alone (batches are prefixes).
        Commands that precede an effect (a provider call, a tool run) or answer a caller
        must not defer.

        ``group=True`` is group commit for such durable commands: the command is durable
        when ``run`` returns, as without ``defer``, but its commit is shared with the
        commands other executions save in the same pass of the event loop. Executions
        launched together (parallel tool calls) each commit their running intent before
        their effect: one commit, not one each (one fsync under ``durability="fsync"``).
        Where commits are not shared (``groups`` False) it is a plain durable command."""
        group = group and self.groups
        mine = 0  # with ``group``: the deferred commands that must be durable on return
        with self.telemetry.command(self.session_id) as span:
            lock = self._lock  # taken and given back inline (command_lock.py)
            if lock.held:
                await lock.wait()
            else:
                lock.held = True
            try:
                self.check_usable(write=True)
                stamp = stamp_command()  # one timestamp for the command's events
                try:
                    tx = self._building = Command(self, working=working)
                    tx.task = task
                    try:
                        # Every read of the builder sees one committed snapshot (§7.3).
                        with self.storage.snapshot():
                            result = build(WorkingCommand(tx) if working is not None else tx)
                            # Most builders return None: no awaitable check (~0.2 us).
                            if result is not None and inspect.isawaitable(result):
                                result = await result
                    except BaseException:
                        self._discard(tx)
                        raise
                    finally:
                        self._building = None
                        tx.seal()
                    if tx.first is None:
                        return result  # no mutations: nothing is committed
                    self._persist(
                        tx,
                        defer=defer or group,
                        span=None if span is INVALID_SPAN or not span.is_recording() else span,
                    )
                    mine = self._deferred
                finally:
                    unstamp_command(stamp)
            finally:
                if lock.waiters:
                    lock.release()
                else:
                    lock.held = False
        if group:
            await self._group_commit(mine)
            return result
        # A save blocks the loop and an uncontended lock never suspends: without a yield,
        # a task running commands in a loop would starve every other coroutine of the
        # process (other sessions, the lease heartbeats) until it stopped. Once per
        # YIELD_EVERY commands, not after each: a pass of the loop per command was ~3.5%
        # of an agent turn (10 commands), whose own awaits (provider, tools) yield anyway.
        # Counted, not timed, so the interleaving stays deterministic for a given script.
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY:
            self._unyielded = 0
            await asyncio.sleep(0)
        return result

    def run_sync(self, build: Callable[[Command], T]) -> T:
        """The same as ``run`` for synchronous builders, for use outside an event loop."""
        self.check_usable(write=True)
        tx = Command(self)
        stamp = stamp_command()
        try:
            try:
                result = build(tx)
            except BaseException:
                self._discard(tx)
                raise
            finally:
                tx.seal()
            if tx.first is not None:
                self._persist(tx)
        finally:
            unstamp_command(stamp)
        return result

    def _discard(self, tx: Command) -> None:
        # Touched aggregates hold the batch's unsaved changes: forget them so the next
        # command reloads committed state.
        for cid in tx.touched:
            self._cache.pop(cid, None)
        for tid in tx.touched_tasks:
            self._task_cache.pop(tid, None)

    def _persist(self, tx: Command, *, defer: bool = False, span: Any = None) -> None:
        first, last = tx.first, tx.last
        assert first is not None and last is not None
        scope = MAIN if tx.working is None else tx.working.scope_id
        try:
            for op in tx.session_ops:
                op(self.session)
            self.session.commit(first=first, last=last, scope=scope, task=tx.task)
        except BaseException:
            self._discard(tx)
            self._reload_session()
            raise
        # Session last: in storage order a batch ends with its boundary event.
        aggregates: list[Aggregate] = [
            *tx.touched.values(),
            *tx.touched_tasks.values(),
            self.session,
        ]
        saved = self.on_saved
        events = [e for a in aggregates for e in a.pending_events] if saved is not None else []
        if span is not None:  # a recording command span: the batch it commits
            self.telemetry.committed(span, tx, sum(len(a.pending_events) for a in aggregates))
        try:
            self.storage.save(aggregates, working=tx.working_writes, defer=defer)
        except StaleWriterError:
            self._fault("another owner claimed the session")
            raise
        except BaseException as exc:
            self._fault(f"uncertain persistence: {exc!r}")
            raise PersistenceUncertainError(self.session_id, exc) from exc
        if saved is not None:
            saved(tx, events)
        _keep(self._cache, tx.touched.items())  # by id, as _remember keeps one
        _keep(self._task_cache, tx.touched_tasks.items())
        if len(self.policies) + len(tx.policies) > POLICY_CACHE_SIZE:
            self.policies.clear()
        self.policies.update(tx.policies)
        if defer:
            if not self.pending:
                self.pending = True
                loop = asyncio.get_running_loop()
                self._flush_by = loop.time() + FLUSH_WINDOW
                if self._flush_timer is None or self._flush_loop is not loop:
                    # (A timer left on another loop, one that ran the line before, may
                    # never fire.)
                    self._disarm()
                    self._arm(loop, self._flush_by)
            self._deferred += 1
        else:
            self._settled()
            if self.on_durable is not None:
                self.on_durable()
        if self.on_commit is not None and (tx.touched_tasks or tx.session_ops):
            self.on_commit(tx)  # only task changes can change what a drive may run

    async def _group_commit(self, mine: int) -> None:
        """``run(group=True)``: make the first ``mine`` deferred commands durable, after
        one pass of the event loop in which other executions save theirs (one of them
        may commit them all). Raises as ``flush`` does, or ``HandleFaultedError`` when a
        fault rolled the batch back in the meantime."""
        self._unyielded = 0
        if self._durable < mine:
            await asyncio.sleep(0)  # the other executions of this pass save theirs
        if self.faulted is not None:
            raise HandleFaultedError(self.session_id, self.faulted)
        if self._durable < mine:  # not yet committed by another execution's commit
            # After a command another coroutine is building (it joins the commit), as the
            # flush window waits for one.
            async with self._lock:
                if self.faulted is not None:
                    raise HandleFaultedError(self.session_id, self.faulted)
                if self._durable < mine:
                    self.flush()

    def flush(self) -> None:
        """Make every deferred command durable; a failure faults the handle (they are
        uncertain) and raises ``PersistenceUncertainError``."""
        if not self.pending:
            return
        self._settled()
        try:
            self.storage.flush()
        except BaseException as exc:
            self._fault(f"uncertain persistence: {exc!r}")
            raise PersistenceUncertainError(self.session_id, exc) from exc
        if self.on_durable is not None:
            self.on_durable()

    def _settled(self) -> None:
        self.pending = False
        self._durable = self._deferred

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._flush_at = when
        self._flush_loop = loop
        self._flush_timer = loop.call_at(when, self._flush_due)

    def _disarm(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _flush_due(self) -> None:
        self._flush_timer = None
        if not self.pending or self.closed or self.faulted is not None:
            return
        loop = asyncio.get_running_loop()
        if self._flush_by > self._flush_at:
            # Armed for commands a commit made durable since: these are due later.
            self._arm(loop, self._flush_by)
            return
        if self._lock.locked():  # a command is building: try again after the window
            self._arm(loop, loop.time() + FLUSH_WINDOW)
            return
        try:
            self.flush()
        except PersistenceUncertainError:
            if self.on_commit is not None:
                self.on_commit(None)  # wake drives: they find the handle faulted

    def _reload_session(self) -> None:
        loaded = self.storage.load(session_uuid(self.session_id))
        if not isinstance(loaded, Session):
            self._fault("the session stream could not be reloaded")
            return
        self.session = loaded

    def _fault(self, reason: str) -> None:
        if self.pending:
            # Deferred commands still open (a fault from outside a save: a lost lease):
            # none of them may commit now, and their batch must not keep the session's
            # locks from the next owner.
            abandon = getattr(self.storage, "abandon", None)
            if abandon is not None:
                with contextlib.suppress(Exception):
                    abandon(reason)
        self._settled()  # the failed save or flush rolled back every deferred command
        self.faulted = reason
        self._cache.clear()
        self._task_cache.clear()
        self.policies.clear()
        disown = getattr(self.storage, "disown_tasks", None)
        if disown is not None:
            disown()  # what it held may be ahead of the store, or another owner's now
        if self.on_fault is not None:
            self.on_fault(reason)

    def fault(self, reason: str) -> None:
        self._fault(reason)

    def close(self) -> None:
        if not self.closed:
            if self.faulted is None:
                with contextlib.suppress(PersistenceUncertainError):  # faulted; closing anyway
                    self.flush()
            self._settled()
            self._disarm()
            self.closed = True
            self._cache.clear()
            self.storage.close()


#: An opening claim retries this many times when a save still finds the session moved
#: (only storage without a write lock can lose the race at all), with this backoff.
CLAIM_ATTEMPTS = 8
CLAIM_BACKOFF = 0.005


def _load_session(storage: Storage) -> Session | None:
    loaded = storage.load(session_uuid(storage.session_id))
    if loaded is not None and not isinstance(loaded, Session):
        raise StorageCorruptError(
            f"session {storage.session_id!r}: the session stream holds "
            f"{type(loaded).__name__}, not the Session aggregate; nothing was changed. Restore "
            "the database from a backup"
        )
    return loaded


def _read_stored_state(
    storage: Storage, session: Session
) -> tuple[list[TaskSnapshot], Conversation | None]:
    """Read (and so decode) what an owner starts from: the session row, the live tasks and
    the root conversation's row and aggregate (returned). Damage there raises before any
    write."""
    root = session.root_id
    with storage.snapshot():
        meta = storage.reads.meta()
        live = storage.tasks.live_tasks()
        # The root's row, never its context: an open costs the same however long it is.
        roots = {} if root is None else storage.reads.owners([root])
    if meta is None or meta.head < session.head or (root is not None and root not in roots):
        raise StorageCorruptError(
            f"session {storage.session_id!r}: the read model (session row {meta}, root "
            f"conversation {root}) does not match the event stream (head {session.head}); "
            "nothing was changed. Restore the database from a backup, or rebuild the read "
            "model from the events"
        )
    conversation = None
    if session.root_id is not None:
        conversation = storage.load(conversation_uuid(storage.session_id, session.root_id))
    return live, conversation if isinstance(conversation, Conversation) else None


def _claim(
    storage: Storage, session: Session, gate: Callable[[Session], None] | None = None
) -> Session:
    """Append the claim against the head it lands on: reload the Session aggregate under
    the storage's write lock, let the resume gate refuse it (``gate``), claim, save.
    Without a lock a lost race is retried."""
    owner, host, pid = uuid.uuid4().hex, socket.gethostname(), os.getpid()
    exclusive = getattr(storage, "exclusive", None)
    for attempt in range(CLAIM_ATTEMPTS):
        with exclusive() if exclusive is not None else contextlib.nullcontext():
            current = _load_session(storage)
            if current is not None:
                session = current
            elif attempt:  # the failed save consumed the new session's pending events
                session = Session(session_id=storage.session_id)
            if gate is not None:
                gate(session)  # raises before anything is written
            # The claim's batch takes its own reading, never that of a command this open
            # may run inside (an async builder opening another session).
            stamp = stamp_command()
            try:
                session.claim(owner=owner, host=host, pid=pid)
                storage.save([session])
                return session
            except StaleWriterError:
                pass
            finally:
                unstamp_command(stamp)
        time.sleep(CLAIM_BACKOFF * (attempt + 1))
    raise ClaimContendedError(storage.session_id, CLAIM_ATTEMPTS)
