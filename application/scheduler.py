"""The scheduler (§6): executes durable task records inside drive scopes.

One scheduler per open session; overlapping drives share it, so each task has at most one
local execution (its *claim*). A pass reads live tasks only (bounded, indexed), signals
every marked execution first, then claims and launches: ready tasks whose dependencies are
terminal, whose ``not_before`` has passed and whose permit the covering drive supplies;
inflight tasks to recover; waiting tasks to re-arm once per waiting phase; marked tasks to
run their definition's ``abort`` under the same claim that joined their execution. It never
awaits an effect inside the scan, and an unexpected exception from an effect faults the
handle instead of relaunching forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from opentelemetry.trace import INVALID_SPAN

from pico.application.clock import Clock
from pico.application.command import Command
from pico.application.ports import ReadPort
from pico.application.state import WorkingScope
from pico.application.tasks import Reconcile, StopSignal
from pico.domain.errors import PicoError
from pico.domain.values import TaskSnapshot

if TYPE_CHECKING:
    from pico.application.line import CommandLine

__all__ = ["DriveOutcome", "Execution", "Scheduler", "StaleExecutionError"]

T = TypeVar("T")
DriveOutcome = Literal["idle", "suspended", "closed"]
Mode = Literal["execute", "recover", "abort"]


class StaleExecutionError(PicoError):
    """An effect wrote after its execution ended (claim released, task settled or marked)."""


@dataclass
class _Claim:
    task_id: int
    mode: Mode
    signal: asyncio.Event = field(default_factory=StopSignal)
    job: asyncio.Task[None] | None = None


@dataclass
class _Observer:
    """A live-phase subscription of one waiting task (§9.3); not another executor."""

    task_id: int
    phase: int  # the task's updated_seq when installed: a new phase needs a new observer
    reconcile: Reconcile
    unsubscribe: Callable[[], None]
    events: list[Any] = field(default_factory=list)
    initial: bool = True  # the initial reconcile (event None) is still owed
    sealed: bool = False
    # The event is certain to come without anyone acting (a running process's exit): a
    # drive that needs this task waits for it instead of reporting ``suspended``.
    promised: bool = False


class Execution:
    """What a definition receives (§9.3): the signal, a working scope, command access that
    is refused once this execution is no longer the task's claim."""

    def __init__(self, scheduler: Scheduler, task: TaskSnapshot, claim: _Claim) -> None:
        self._scheduler = scheduler
        self._claim = claim
        self.task_id = task.id
        self.mode: Mode = claim.mode

    @cached_property
    def working_scope(self) -> WorkingScope:
        """This execution's working scope (made when first asked: a join never is)."""
        return WorkingScope(f"task/{self.task_id}")

    @property
    def signal(self) -> asyncio.Event:
        """Set when this execution should stop (abort, close, shutdown)."""
        return self._claim.signal

    @property
    def cancelled(self) -> bool:
        return self._claim.signal.is_set()

    @property
    def definitions(self) -> Any:
        return self._scheduler.line.definitions

    @property
    def reads(self) -> ReadPort:
        """Committed conversation and entry reads."""
        return self._scheduler.line.storage.reads

    def task(self, task_id: int) -> TaskSnapshot | None:
        """Any committed task record (e.g. a dependency's outcome)."""
        return self._scheduler.line.storage.tasks.get_tasks([task_id]).get(task_id)

    def current(self) -> TaskSnapshot:
        """The committed task record, re-read."""
        found = self._scheduler.line.storage.tasks.get_tasks([self.task_id]).get(self.task_id)
        assert found is not None
        return found

    async def command(
        self, build: Callable[[Command], T | Awaitable[T]], *, defer: bool = False
    ) -> T:
        """Run a command as this execution; refused when the claim is gone.

        ``defer=True`` (group commit, ``CommandLine.run``) is for a settlement that no
        effect waits on; an intent before a provider call or tool run must stay durable."""
        if self._scheduler.executing.get(self.task_id) is not self._claim:
            raise StaleExecutionError(
                f"task {self.task_id}: this {self.mode} execution has ended; a late callback "
                "cannot write through it"
            )
        # Durable unless deferred, before whatever this execution does next; executions
        # launched in the same pass share the commit (``CommandLine.run``'s ``group``).
        return await self._scheduler.line.run(
            build, defer=defer, group=not defer, task=self.task_id
        )

    def observe(
        self,
        subscribe: Callable[[Callable[[Any], None]], Callable[[], None]],
        reconcile: Reconcile,
        *,
        promised: bool = False,
    ) -> None:
        """Install a live-phase observer for this waiting task: ``subscribe(notify)`` is
        registered BEFORE an initial ``reconcile(None, ctx)``, so a condition already
        satisfied is not lost; later events queue and each reconciliation runs under the
        task's claim with a fresh context. Phase exit, settlement or close seals it.

        ``promised=True`` says the event will come without anyone acting (a running
        process's exit, not a human's decision): a drive that needs this task — required
        foreground work of the driven conversation, or foreground work for a session
        drive — waits for it instead of returning ``suspended``."""
        self._scheduler.install_observer(self.task_id, subscribe, reconcile, promised=promised)

    async def working(self, build: Callable[[Any], T | Awaitable[T]]) -> T:
        """A working-scope command in this execution's own scope."""
        if self._scheduler.executing.get(self.task_id) is not self._claim:
            raise StaleExecutionError(f"task {self.task_id}: this execution has ended")
        return await self._scheduler.line.run(build, working=self.working_scope, task=self.task_id)


class Scheduler:
    def __init__(self, line: CommandLine, clock: Clock) -> None:
        self.line = line
        self.clock = clock
        self.executing: dict[int, _Claim] = {}
        self._armed: set[tuple[int, int]] = set()  # (task, updated_seq) waiting phases
        self.observers: dict[int, _Observer] = {}
        # Called on every task change or finished execution (e.g. a parked collapse's
        # editable-context predicate); they may only record events, never await commands.
        self.listeners: set[Callable[[], None]] = set()
        self._notifying = False
        self._waiters: set[asyncio.Future[None]] = set()
        self.closed = False
        self.error: BaseException | None = None
        # The resume gate (gate.py): while it returns an error (a blocking configuration
        # change not yet acknowledged), a drive raises it and runs nothing.
        self.gate: Callable[[], PicoError | None] | None = None

    # ------------------------------------------------------------------ notifications
    def committed(self, tx: Command | None) -> None:
        """A commit landed. Drives wake for every change except an execution's own
        progress: a command that created no task, changed no session state and touched only
        tasks executing right now, each left live, unmarked and unobserved (an intent before
        an effect, a status while it runs). A pass can find nothing new in it: the pass
        skips executing tasks, and their end notifies anyway. Listeners still hear it."""
        if tx is not None and not tx.session_ops and tx.touched_tasks:
            executing, observers = self.executing, self.observers
            for i, t in tx.touched_tasks.items():  # a loop, not all(...): no generator
                if (
                    i not in executing
                    or t.role == "terminal"
                    or t.abort_requested
                    or i in observers
                ):
                    break
            else:
                if self.listeners:
                    self._tell_listeners()
                return
        self.notify()

    def _tell_listeners(self) -> None:
        if not self._notifying:
            self._notifying = True
            try:
                for listener in list(self.listeners):
                    listener()
            finally:
                self._notifying = False

    def notify(self) -> None:
        """A commit landed or an execution ended: wake every waiting drive."""
        if self.listeners:
            self._tell_listeners()
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def install_observer(
        self,
        task_id: int,
        subscribe: Callable[[Callable[[Any], None]], Callable[[], None]],
        reconcile: Reconcile,
        *,
        promised: bool = False,
    ) -> None:
        task = self.line.storage.tasks.get_tasks([task_id]).get(task_id)
        if task is None or self.closed:
            return
        old = self.observers.pop(task_id, None)
        if old is not None:
            self._seal(old)
        observer = _Observer(task_id, task.updated_seq, reconcile, lambda: None)
        observer.promised = promised

        def notify(event: Any) -> None:
            if observer.sealed:
                return  # a late notification after phase exit or close is dropped
            observer.events.append(event)
            self.notify()

        self.observers[task_id] = observer
        observer.unsubscribe = subscribe(notify)
        self.notify()

    def _seal(self, observer: _Observer) -> None:
        if not observer.sealed:
            observer.sealed = True
            observer.unsubscribe()

    async def next_change(self) -> None:
        """Returns at the next commit, finished execution or observer event."""
        future = self.subscribe()
        try:
            await future
        finally:
            self.unsubscribe(future)

    def subscribe(self) -> asyncio.Future[None]:
        """A future resolved at the next commit, finished execution or observer event,
        subscribed at once (no await needed, so nothing can slip in before it). Pass it to
        ``unsubscribe`` when no longer waited for."""
        return self._subscribe()

    def unsubscribe(self, future: asyncio.Future[None]) -> None:
        self._waiters.discard(future)
        future.cancel()

    def _subscribe(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(future)
        return future

    # ------------------------------------------------------------------ scope
    def live_tasks(self, conversation_id: int | None) -> list[TaskSnapshot]:
        return self._live(conversation_id)[0]

    def _live(
        self, conversation_id: int | None, *, state: bool = True
    ) -> tuple[list[TaskSnapshot], set[int]]:
        """The live tasks in scope, and the ids of every live task of the session."""
        out = self.line.storage.tasks.live_tasks(state=state)  # never terminal history
        ids = {t.id for t in out}
        if conversation_id is None:
            return out, ids
        cache: dict[int, bool] = {}
        return [t for t in out if self.in_tree(t.conversation_id, conversation_id, cache)], ids

    def due_in(self, observed: Iterable[int] = (), permits: Iterable[str] = ()) -> float | None:
        """Seconds until this session next has work for an owner (0: now), or None when
        it has none: what a worker advertises when it releases the session (``pico_work``,
        docs/workers.md). Work: an inflight task (recovery), a task marked for
        cancellation, a waiting task whose phase no drive has armed yet or whose observer
        is installed (``observed``: a running job's exit needs an owner), and a ready task
        whose dependencies are all terminal and whose permit (if any) is in ``permits``,
        at its ``not_before``. A task waiting for outside input (an approval, a held call)
        is not work: the input arrives through the inbox, which advertises the session."""
        watched, allowed = set(observed), frozenset(permits)
        live, ids = self._live(None, state=False)
        now = self.clock.now()
        due: float | None = None
        for task in live:
            if (
                task.role == "inflight"
                or task.abort_requested
                or (
                    task.role == "waiting"
                    and (task.id in watched or (task.id, task.updated_seq) not in self._armed)
                )
            ):
                return 0.0
            if (
                task.role == "ready"
                and not any(d in ids for d in task.after)
                and (task.required_permit is None or task.required_permit in allowed)
            ):
                wait = 0.0 if task.not_before is None else max(0.0, task.not_before - now)
                due = wait if due is None else min(due, wait)
        return due

    def in_tree(self, conversation_id: int, root: int, cache: dict[int, bool]) -> bool:
        """Is ``conversation_id`` ``root`` or owned (transitively) by work in it? Ancestor
        point reads, shared within one pass; fork provenance never counts."""
        return self._reaches(conversation_id, root, cache, foreground_only=False)

    def required(self, task: TaskSnapshot, root: int, cache: dict[int, bool]) -> bool:
        """Is ``task`` (in ``root``'s tree) required foreground work of ``root`` (§5.6)? A
        foreground task whose conversation is ``root``, or is owned through foreground
        owners only. Below a detached (background) owner, foreground work is that owner's
        business: a drive or abort of ``root`` neither waits for it nor selects it."""
        return task.foreground and self.owned_through_foreground(task.conversation_id, root, cache)

    def owned_through_foreground(
        self, conversation_id: int, root: int, cache: dict[int, bool]
    ) -> bool:
        """Is ``conversation_id`` ``root``, or owned from it through foreground owners only?"""
        return self._reaches(conversation_id, root, cache, foreground_only=True)

    def _reaches(
        self, conversation_id: int, root: int, cache: dict[int, bool], *, foreground_only: bool
    ) -> bool:
        """Walk the owners from ``conversation_id`` up towards ``root`` (one cache per
        question: the answers of the two walks differ)."""
        path: list[int] = []
        conv: int | None = conversation_id
        result = False
        while conv is not None:
            if conv in cache:
                result = cache[conv]
                break
            path.append(conv)
            if conv == root:
                result = True
                break
            owner = self.line.owner_of(conv)
            task = None if owner is None else self.line.storage.tasks.get_tasks([owner]).get(owner)
            if task is None or (foreground_only and not task.foreground):
                break
            conv = task.conversation_id
        for c in path:
            cache[c] = result
        return result

    def marked_owner(self, conversation_id: int) -> TaskSnapshot | None:
        """The live owner of ``conversation_id`` if it is marked for cancellation: a drive
        of the owned child may finish that owner's cancellation once the child's selected
        work is terminal (§6.5), though the owner lives in the parent."""
        owner = self.line.owner_of(conversation_id)
        if owner is None:
            return None
        task = self.line.storage.tasks.get_tasks([owner]).get(owner)
        return task if task is not None and task.live and task.abort_requested else None

    # ------------------------------------------------------------------ drive
    async def drive(
        self,
        conversation_id: int | None = None,
        *,
        permits: Iterable[str] = (),
        cancellation_only: bool = False,
    ) -> DriveOutcome:
        """``cancellation_only`` drains the selected cancellation in scope and starts no
        other effect: only marked tasks are run (their cleanup), and the drive is idle once
        none remains (a rewind drains its source this way, §9.1).

        Raises ``ConfigurationMismatchError`` (nothing is run) while the session waits for
        a blocking configuration change to be acknowledged (the resume gate); a
        cancellation-only drive still runs, as it starts no request."""
        blocked = None if self.gate is None or cancellation_only else self.gate()
        if blocked is not None:
            raise blocked
        try:
            return await self._drive(conversation_id, permits, cancellation_only)
        finally:
            # What a drive returns to its caller is durable: deferred settlements commit.
            if not self.line.closed:
                self.line.flush()

    async def _drive(
        self, conversation_id: int | None, permits: Iterable[str], cancellation_only: bool
    ) -> DriveOutcome:
        allowed = frozenset(permits)
        while True:
            if self.closed:
                return "closed"
            if self.error is not None:
                raise self.error
            self.line.check_usable(write=True)  # a read-only handle executes nothing
            changed = self._subscribe()
            with self.line.storage.snapshot():  # one snapshot for the whole pass
                # A dependency is satisfied when terminal (§5.3): in this snapshot, exactly
                # when it is not among the session's live tasks, so no dependency is read.
                # Metadata only: a pass decodes no task state; a launch reads its task.
                live, session_live = self._live(conversation_id, state=False)
                if conversation_id is not None:
                    owner = self.marked_owner(conversation_id)
                    if owner is not None:
                        live.append(owner)
                owners_live = {
                    t.id for t in live if t.abort_requested and self._owns_live_work(t, live)
                }
            now = self.clock.now()
            next_timer: float | None = None
            # Signal every affected execution before joining any (§6.5).
            for task in live:
                claim = self.executing.get(task.id)
                if task.abort_requested and claim is not None and claim.mode != "abort":
                    claim.signal.set()
            by_id = {t.id: t for t in live}
            for observer in list(self.observers.values()):
                watched = by_id.get(observer.task_id)
                if watched is None:  # outside this scope, or no longer live: read it
                    watched = self.line.storage.tasks.get_tasks([observer.task_id]).get(
                        observer.task_id
                    )
                if watched is None or watched.role != "waiting" or watched.abort_requested:
                    self._seal(observer)  # phase exit: settlement, new status, cancellation
                    del self.observers[observer.task_id]
            for task in live:
                if task.id in self.executing or (cancellation_only and not task.abort_requested):
                    continue
                installed = self.observers.get(task.id)
                if (
                    installed is not None
                    and not task.abort_requested
                    and (installed.initial or installed.events)
                ):
                    self._reconcile(task, installed)
                    continue
                if task.abort_requested:
                    if task.id in owners_live:
                        continue  # a marked owner settles after its child work (§6.5)
                    self._launch(task, "abort")
                elif task.role == "ready":
                    if not session_live.isdisjoint(task.after):  # a dependency still live
                        continue
                    if task.required_permit is not None and task.required_permit not in allowed:
                        continue
                    if task.not_before is not None and task.not_before > now:
                        next_timer = (
                            task.not_before
                            if next_timer is None
                            else min(next_timer, task.not_before)
                        )
                        continue
                    self._launch(task, "execute")
                elif task.role == "inflight":
                    self._launch(task, "recover")
                elif task.role == "waiting" and (task.id, task.updated_seq) not in self._armed:
                    self._armed.add((task.id, task.updated_seq))
                    self._launch(task, "recover")
            # Loops, not any(...) over a generator (a resumption an item, every pass).
            running = False
            for t in live:
                if t.id in self.executing:
                    running = True
                    break
            else:
                running = self._promised(conversation_id, live)
            drained = cancellation_only and not any(t.abort_requested for t in live)
            if drained or (
                self._finished(conversation_id, live)
                and (not running or conversation_id is not None)
            ):
                changed.cancel()
                return "idle"
            if not running and next_timer is None:
                changed.cancel()
                return "suspended"
            timer = None
            try:
                if next_timer is None:
                    await changed  # the common case: no timer to race
                else:
                    timer = asyncio.ensure_future(self.clock.sleep_until(next_timer))
                    await asyncio.wait([changed, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                if timer is not None and not timer.done():
                    timer.cancel()
                self._waiters.discard(changed)

    def _promised(self, conversation_id: int | None, live: list[TaskSnapshot]) -> bool:
        """Does an observer of needed work promise its event (a running process's exit)?
        Needed: required foreground work of the driven conversation, or any foreground
        work for a session drive. Detached background work is never waited for."""
        promised = [o.task_id for o in self.observers.values() if o.promised and not o.sealed]
        if not promised:
            return False
        by_id = {t.id: t for t in live}
        cache: dict[int, bool] = {}
        for task_id in promised:
            task = by_id.get(task_id)
            if task is None or not task.foreground:
                continue
            if conversation_id is None or self.required(task, conversation_id, cache):
                return True
        return False

    def _owns_live_work(self, task: TaskSnapshot, live: list[TaskSnapshot]) -> bool:
        """Does selected work remain in the conversation subtree this task owns (§6.5)?
        Marked work, and the child's required foreground work; detached work beneath the
        child (a grandchild started in the background, say) was not selected and does not
        hold the owner's settlement."""
        owned = task.owned_conversation_id
        if owned is None:
            return False
        # The drive's live set already covers every owned subtree of a task in scope.
        tree: dict[int, bool] = {}
        chain: dict[int, bool] = {}
        return any(
            t.id != task.id
            and self.in_tree(t.conversation_id, owned, tree)
            and (t.abort_requested or self.required(t, owned, chain))
            for t in live
        )

    def _finished(self, conversation_id: int | None, live: list[TaskSnapshot]) -> bool:
        if conversation_id is None:
            return not live  # a session drive is idle only with no live task anywhere
        # A conversation drive waits for required foreground work and selected
        # cancellation, not for detached background work (§6.2) nor the foreground work
        # of a detached child.
        cache: dict[int, bool] = {}
        for t in live:  # a loop, not any(...) over a generator: every pass asks
            if t.abort_requested or self.required(t, conversation_id, cache):
                return False
        return True

    # ------------------------------------------------------------------ executions
    def _reconcile(self, task: TaskSnapshot, observer: _Observer) -> None:
        event = None if observer.initial else observer.events.pop(0)
        observer.initial = False
        claim = _Claim(task.id, "recover")
        self.executing[task.id] = claim

        async def run() -> None:
            try:
                await observer.reconcile(event, Execution(self, task, claim))
            except Exception as exc:
                self.error = exc
                self.line.fault(f"task {task.id} observer raised {exc!r}")
            finally:
                if self.executing.get(task.id) is claim:
                    del self.executing[task.id]
                self.notify()

        claim.job = asyncio.ensure_future(run())

    def _launch(self, task: TaskSnapshot, mode: Mode) -> None:
        # The pass read metadata only: the definition gets the whole record, read now,
        # before anything awaits, so it is the record the pass decided on.
        full = self.line.storage.tasks.get_tasks([task.id]).get(task.id)
        if full is None:
            return
        task = full
        claim = _Claim(task.id, mode)  # claimed before launching (§6.3)
        self.executing[task.id] = claim
        claim.job = asyncio.ensure_future(self._run(task, claim))

    async def _run(self, task: TaskSnapshot, claim: _Claim) -> None:
        """One execution in its span (telemetry.py): its commands, model requests and tool
        calls nest in it (this asyncio task's context)."""
        telemetry = self.line.telemetry
        with telemetry.task(task, claim.mode) as span:
            before = self.error
            await self._execute(task, claim)
            if span is not INVALID_SPAN and span.is_recording():
                failed = self.error if self.error is not before else None
                telemetry.ended(span, self._status(task.id), failed)

    def _status(self, task_id: int) -> str | None:
        """The task's status as last committed (for a span; None when unreadable)."""
        cached = self.line.cached_task(task_id)
        if cached is not None:
            return cached.status
        try:
            found = self.line.storage.tasks.get_tasks([task_id]).get(task_id)
        except Exception:  # a closed or faulted storage: the span says nothing
            return None
        return None if found is None else found.status

    async def _execute(self, task: TaskSnapshot, claim: _Claim) -> None:
        definition = self.line.definitions.get(task.kind)
        try:
            ctx = Execution(self, task, claim)
            handler = getattr(definition, claim.mode)
            await handler(task, ctx)
            if (
                claim.mode != "abort"
                and not self.closed
                # A task this line just settled is terminal for good: nothing to check or
                # abort, and no need to re-read it (the common end of an execution).
                and self.line.committed_role(task.id) != "terminal"
            ):
                # Join, re-read, then abort under the SAME claim (§6.5).
                current = ctx.current()
                unchanged = (
                    current.updated_seq == task.updated_seq
                    and current.role in ("ready", "inflight")
                    and not current.abort_requested
                    and not claim.signal.is_set()
                )
                if unchanged:  # relaunching it would spin forever: a definition bug
                    raise StaleExecutionError(
                        f"task {task.id} ({task.kind}): {claim.mode} returned without "
                        f"committing a transition from {current.status!r}; a definition must "
                        "settle, park (waiting/not_before) or move the task before returning"
                    )
                if current.abort_requested and current.live:
                    claim.mode = "abort"
                    await definition.abort(current, Execution(self, current, claim))
        except Exception as exc:  # an effect's unexpected failure faults the handle
            if not (isinstance(exc, StaleExecutionError) and self.closed):
                self.error = exc
                self.line.fault(f"task {task.id} ({task.kind}) {claim.mode} raised {exc!r}")
        finally:
            if self.executing.get(task.id) is claim:
                del self.executing[task.id]
            self.notify()

    async def close(self) -> None:
        """Seal, signal local executions, wait for the cooperative ones; write nothing."""
        self.closed = True
        for observer in list(self.observers.values()):
            self._seal(observer)
        self.observers.clear()
        for claim in list(self.executing.values()):
            claim.signal.set()
        jobs = [c.job for c in self.executing.values() if c.job is not None]
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)
        self.notify()
