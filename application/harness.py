"""The public API (§9.1): ``Harness``, one open session.

Storage calls are synchronous underneath; the surface is async because effects (model
calls, tools, jobs) run concurrently. Every command resolves only after its one batch is
durable and published. Commands for one conversation are on ``ConversationHandle``
(``conversation.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar, overload

from pico.application.chain import ChainReport
from pico.application.clock import Clock, SystemClock
from pico.application.command import Command, WorkingCommand
from pico.application.conversation import ConversationHandle
from pico.application.flows import AgentServices, agent_definitions
from pico.application.flows.approval import decide
from pico.application.flows.common import TOOL_EXECUTION
from pico.application.flows.inputs import cancel_every_queued_input
from pico.application.flows.job import JobDefinition, JobServices, default_job_directory
from pico.application.flows.schedule import ScheduleDefinition
from pico.application.flows.tool import answer_held_call
from pico.application.gate import ConfigurationGate, Fingerprint, fingerprint
from pico.application.hooks import Hooks
from pico.application.host import ProcessHost
from pico.application.lease import Heartbeat, Lease
from pico.application.line import CommandLine
from pico.application.model import ModelProvider
from pico.application.ports import AuditRecord, ReadPort, Storage
from pico.application.registry import get_host_factory, get_storage_opener
from pico.application.scheduler import DriveOutcome, Scheduler
from pico.application.state import (
    Address,
    ConversationValue,
    SessionList,
    SessionValue,
    WorkingList,
    WorkingScope,
    WorkingValue,
)
from pico.application.tasks import TaskDefinition, TaskRegistry
from pico.application.telemetry import Telemetry
from pico.application.tools import Tool, ToolRegistry
from pico.application.watch import PREVIEW_LISTS, Listener, WatchHub, WatchStream
from pico.domain.errors import (
    ClosedError,
    CommandRejectedError,
    ConfigurationError,
    InvalidArgumentError,
    ShuttingDownError,
    UnknownConversationError,
    UnknownTaskError,
)
from pico.domain.ids import check_choice, check_id, check_limit, check_position
from pico.domain.json import check_json
from pico.domain.values import (
    ConversationSnapshot,
    Entry,
    ListElement,
    Order,
    Page,
    SessionMeta,
    StoredValue,
    TaskSnapshot,
    ValuePage,
)

__all__ = ["Harness"]

# Leases live in PostgreSQL (docs/workers.md); a URL of any other backend is refused
# before anything is opened.
_LEASE_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")
_NO_LEASES = (
    "leases need PostgreSQL (a lease row renewed on the database's clock); {where} has "
    "none. Open a postgresql://user@host/db URL with lease=..., or drop lease= (SQLite "
    "and JSONL keep one writer by their own locks and claims)"
)

T = TypeVar("T")

log = logging.getLogger("pico.harness")


class Harness:
    """One open session. Open with ``await Harness.open("sqlite:///agent.db")``."""

    def __init__(self, line: CommandLine, clock: Clock | None = None) -> None:
        self._line = line
        self.scheduler = Scheduler(line, clock or SystemClock())
        self.services: AgentServices | None = None
        self.jobs: JobServices | None = None  # None: the job kinds are the caller's own
        line.on_commit = self.scheduler.committed
        self.watches = WatchHub(line)
        # Set when shutdown() starts (public admission sealed); set() once it has closed.
        self._shutdown: asyncio.Event | None = None
        # The resume gate of a write open for agent work (gate.py); None: not gated.
        self._gate: ConfigurationGate | None = None
        # The session's lease (lease.py) when opened with lease=...; None otherwise.
        self._heartbeat: Heartbeat | None = None
        # The permits of the last session drive: work they allow counts as due when the
        # lease is released (Scheduler.due_in).
        self._permits: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(
        cls,
        storage: str | Storage = "sqlite:///pico.db",
        *,
        session: str = "main",
        durability: str | None = None,
        read_only: bool = False,
        definitions: TaskRegistry | Iterable[TaskDefinition] | None = None,
        clock: Clock | None = None,
        provider: ModelProvider | None = None,
        tools: Iterable[Tool] = (),
        hooks: Hooks | None = None,
        initial_values: Iterable[tuple[Address[Any], Any]] = (),
        model: str = "default",
        system: str = "",
        tool_execution: str = "parallel",
        max_attempts: int = 3,
        retry_delay: float = 2.0,
        context_budget: int | None = None,
        resume_reminder: str = "",
        host: ProcessHost | None = None,
        job_directory: str | None = None,
        lease: Lease | None = None,
        telemetry: Telemetry | None = None,
    ) -> Harness:
        """Open (or create) a session.

        Args:
            storage: a URL (``sqlite:///path.db``, ``memory://``, ``postgresql://...``) or a
                ready ``Storage``.
            session: the session name; many sessions can share one database.
            durability: ``"process"`` (default: survives a crash of this process; SQLite
                ``synchronous=NORMAL``, PostgreSQL commits without waiting for the WAL flush,
                so a crash of the server's machine may lose its last ~0.6 s of commits) or
                ``"fsync"`` (flush every commit to disk: survives power loss).
            read_only: open for audit and reads only; appends no claim, writes nothing
                (SQLite ``mode=ro``, PostgreSQL read-only transactions) and needs no
                definitions or provider.
            tool_execution: ``"parallel"`` (default: a response's tool calls run at once) or
                ``"sequential"`` (each call after the one before it, in call order; §5.4).
                Captured by each generation when it is created.
            max_attempts: model requests per generation (and summaries per collapse) before
                a retryable failure or an interruption fails it; captured at creation.
            retry_delay: seconds before retry ``n`` is ``retry_delay * n`` unless the
                provider says when (``retry_after``).
            context_budget: estimated tokens of a request's context above which a
                generation collapses it first (``None``, the default: no automatic
                collapse); read at each request.
            resume_reminder: text appended to the system prompt (after a blank line) when
                this open resumes a session that has recorded a configuration already. It
                is added after the fingerprint is computed, so it never changes the
                comparison (docs/resume.md).

        The resume gate (docs/resume.md): a write open with a ``provider`` records the
        configuration fingerprint on the first open (``Session.ConfigurationRecorded``)
        and compares with it on every reopen. A hard change (the model) raises
        ``ConfigurationMismatchError`` before the claim, writing nothing; a blocking change
        (system prompt, tool_execution, provider options) opens, but every drive raises
        ``ConfigurationMismatchError`` until ``acknowledge_configuration()``; tools and
        budget changes are accepted and recorded (``Session.ConfigurationChanged``).
            definitions: the task definitions (a ``TaskRegistry`` or an iterable of
                definitions). Opening for writing rejects live tasks whose kind or status no
                definition knows, before anything runs. The built-in ``job`` and
                ``schedule`` definitions are always registered unless you pass your own of
                that kind.
            host: the ``ProcessHost`` that runs jobs (default: the POSIX host, made when
                the first job needs it; docs/jobs.md).
            job_directory: where job logs and status files go (default: beside a SQLite
                file, ``<db>.jobs/<session>``; in a JSONL directory, ``jobs/<session>``;
                else under the temporary directory). Captured by each job at creation.
            lease: hold the session under a lease renewed in the background
                (PostgreSQL only; docs/workers.md): acquired before the claim, so an open
                while another worker's lease is unexpired raises ``SessionLeasedError``
                and writes nothing; a lease not renewed by its local deadline faults the
                handle before the database lets another worker take it; released by
                ``close``. Without it (the default) nothing changes.
            telemetry: where spans go (``pico.Telemetry(tracer=...)``; docs/telemetry.md);
                default: the global OpenTelemetry tracer provider (nothing without an SDK).

        Raises ``InvalidArgumentError`` (an unknown ``tool_execution``; nothing opened),
        ``InvalidArgumentError`` (``max_attempts`` not an int of at least 1, ``retry_delay``
        not a finite number of at least 0; nothing opened),
        ``ConfigurationError`` (a bad URL, session name or durability),
        ``StorageUnavailableError`` (a database that cannot be reached or opened),
        ``StorageCorruptError`` (damage found while reading the session; nothing written),
        ``UnknownSessionError`` (read-only, no such session) and ``ClaimContendedError``
        (storage without a write lock lost every claim attempt),
        ``InvalidArgumentError`` (``context_budget`` not None or an int of at least 1,
        ``resume_reminder`` not text; nothing opened) and ``ConfigurationMismatchError``
        (a hard configuration change; nothing written).
        """
        check_choice(tool_execution, "tool_execution", TOOL_EXECUTION)
        if type(max_attempts) is not int or max_attempts < 1:
            raise InvalidArgumentError(
                f"max_attempts must be an int of at least 1, got {max_attempts!r}"
            )
        if (
            type(retry_delay) not in (int, float)
            or not math.isfinite(retry_delay)
            or retry_delay < 0
        ):
            raise InvalidArgumentError(
                f"retry_delay must be a finite number of seconds (at least 0), got {retry_delay!r}"
            )
        if context_budget is not None and (type(context_budget) is not int or context_budget < 1):
            raise InvalidArgumentError(
                f"context_budget must be None or an int of at least 1 (estimated tokens), got "
                f"{context_budget!r}"
            )
        if not isinstance(resume_reminder, str):
            raise InvalidArgumentError(
                f"resume_reminder must be text (a str), got {type(resume_reminder).__name__}"
            )
        registry = (
            definitions
            if isinstance(definitions, TaskRegistry)
            else TaskRegistry(definitions or ())
        )
        if job_directory is not None and (
            not isinstance(job_directory, str) or not job_directory or "\x00" in job_directory
        ):
            raise InvalidArgumentError(
                f"job_directory must be a non-empty path (a str without NUL), got {job_directory!r}"
            )
        if host is not None and not all(
            hasattr(host, name) for name in ("intend", "launch", "identify", "wait", "terminate")
        ):
            raise InvalidArgumentError(
                f"host must be a ProcessHost (pico.application.host), not {type(host).__name__}"
            )
        if lease is not None:
            if not isinstance(lease, Lease):
                raise InvalidArgumentError(
                    f"lease must be a pico.Lease(ttl=..., renew_every=...), not "
                    f"{type(lease).__name__}"
                )
            if read_only:
                raise InvalidArgumentError(
                    "a read-only open takes no lease (it writes nothing); drop lease= or "
                    "read_only=True"
                )
            if isinstance(storage, str) and not storage.startswith(_LEASE_SCHEMES):
                raise ConfigurationError(_NO_LEASES.format(where=storage.split("://")[0]))
        clock = clock or SystemClock()  # one clock for the scheduler and every flow
        if telemetry is not None and not isinstance(telemetry, Telemetry):
            raise InvalidArgumentError(
                f"telemetry must be a pico.Telemetry(tracer=...), not {type(telemetry).__name__}"
            )
        telemetry = telemetry or Telemetry()
        own = set(registry.kinds())
        jobs: JobServices | None = None
        if "job" not in own:
            jobs = JobServices(directory="", host=host, factory=get_host_factory())
            registry.register(JobDefinition(jobs))
        services: AgentServices | None = None
        if provider is not None:
            # The built-in agent flows: generation, tool, post_tools (§8).
            services = AgentServices(
                hooks=hooks or Hooks(),
                provider=provider,
                tools=ToolRegistry(tools),
                model=model,
                system=system,
                clock=clock,
                tool_execution=tool_execution,
                max_attempts=max_attempts,
                retry_delay=float(retry_delay),
                context_budget=context_budget,
                jobs=jobs,
                telemetry=telemetry,
            )
            for definition in agent_definitions(services):
                registry.register(definition)
        if "schedule" not in own and jobs is not None:
            registry.register(ScheduleDefinition(jobs, clock, lambda: services))
        if not isinstance(storage, str) and not all(
            hasattr(storage, name) for name in ("session_id", "load", "save", "snapshot")
        ):
            raise ConfigurationError(
                f"storage must be a URL such as sqlite:///pico.db or a Storage object, not "
                f"{type(storage).__name__} ({storage!r})"
            )
        # Computed from the configured prompt, before any resume reminder is appended.
        current = None if services is None or read_only else fingerprint(services)
        if isinstance(storage, str):
            opener = get_storage_opener()
            store = opener(storage, session=session, durability=durability, read_only=read_only)
        else:
            store = storage
        gate = None if current is None else ConfigurationGate(store.session_id, current)
        heartbeat: Heartbeat | None = None
        try:
            if lease is not None:
                leases = getattr(store, "leases", None)
                if leases is None:
                    raise ConfigurationError(_NO_LEASES.format(where=type(store).__name__))
                # Before the claim: a held lease refuses the open with nothing written.
                beat = Heartbeat(leases(), lease, store.session_id)
                try:
                    await beat.start()
                except BaseException:
                    beat.store.close()
                    raise
                heartbeat = beat
            line = CommandLine.open(
                store,
                read_only=read_only,
                definitions=registry,
                gate=None if gate is None else gate.check,
            )
            line.telemetry = telemetry
            harness = cls(line, clock)
            if heartbeat is not None:
                harness._hold(heartbeat)
            harness.services = services
            if jobs is not None:
                jobs.directory = job_directory or default_job_directory(storage, store.session_id)
                harness.jobs = jobs
            harness._gate = gate
            if gate is not None:
                harness.scheduler.gate = gate.pending
                if services is not None and gate.resumed and resume_reminder:
                    services.system = f"{system}\n\n{resume_reminder}"
            if not read_only and line.session.root_id is None:
                await line.run(lambda tx: _create_root(tx, initial_values))
            if gate is not None and gate.changes and not gate.blocking:
                live = line.storage.tasks.live_tasks  # in the command's snapshot
                await line.run(lambda tx: gate.record(tx, acknowledged=False, live=live()))
                gate.accepted()
        except BaseException:
            store.close()
            if heartbeat is not None:
                await heartbeat.stop()
            raise
        return harness

    def _hold(self, heartbeat: Heartbeat) -> None:
        self._heartbeat = heartbeat
        self._line.admission = heartbeat.check
        heartbeat.on_lost = self._lease_lost
        if heartbeat.lost is not None:
            self._lease_lost(heartbeat.lost)

    def _lease_lost(self, reason: str) -> None:
        """The lease is lost (or about to be): admit no further command, signal every
        local execution, wake the drives (they find the handle faulted)."""
        line = self._line
        if not line.closed and line.faulted is None:
            line.fault(reason)
        for claim in list(self.scheduler.executing.values()):
            claim.signal.set()
        self.scheduler.notify()

    @property
    def lease(self) -> Heartbeat | None:
        """The session's lease when opened with ``lease=``: ``owner``, ``expires_at``
        (the database's, at the last renewal), ``lost`` (why, once lost) and
        ``lost_event``; None without a lease."""
        return self._heartbeat

    async def close(self, *, backoff: float = 0.0) -> None:
        """Stop local executions cooperatively and release storage. Writes no outcome:
        unfinished durable tasks stay resumable by the next owner (§6.6). A lease is
        released last, once nothing can be written under it, advertising the session's
        remaining work to workers (``due_in``), no sooner than ``backoff`` seconds from
        now (a worker backs off a session whose drive failed)."""
        due: float | None = 0.0
        if not self._line.closed:
            observed = list(self.scheduler.observers)  # close() seals them
            await self.scheduler.close()
            if self._heartbeat is not None:
                due = self.due_in(observed)
        if due is not None and type(backoff) in (int, float) and backoff > due:
            due = float(backoff)
        self._line.close()
        self.watches.close()
        if self._heartbeat is not None:
            await self._heartbeat.stop(due)

    def due_in(self, observed: Iterable[int] | None = None) -> float | None:
        """Seconds until the session next has work for an owner (0: now; None: none; see
        ``Scheduler.due_in``): what closing under a lease advertises to workers. 0 when it
        cannot be read. ``observed``: the tasks whose observers are installed (default:
        the scheduler's, right now)."""
        watched = list(self.scheduler.observers) if observed is None else observed
        try:
            with self._line.storage.snapshot():
                return self.scheduler.due_in(watched, self._permits)
        except Exception:
            log.info("session %r: its pending work could not be read", self.session_id)
            return 0.0

    # ------------------------------------------------------------------ watch (§9.4)
    @overload
    def watch(
        self,
        conversation_id: int,
        listener: Listener,
        *,
        limit: int = 50,
        buffer: int = 10_000,
        previews: Sequence[str] = PREVIEW_LISTS,
    ) -> Callable[[], None]: ...
    @overload
    def watch(
        self,
        conversation_id: int,
        listener: None = None,
        *,
        limit: int = 50,
        buffer: int = 10_000,
        previews: Sequence[str] = PREVIEW_LISTS,
    ) -> WatchStream: ...
    def watch(
        self,
        conversation_id: int,
        listener: Listener | None = None,
        *,
        limit: int = 50,
        buffer: int = 10_000,
        previews: Sequence[str] = PREVIEW_LISTS,
    ) -> Callable[[], None] | WatchStream:
        """Follow a conversation's committed state without gaps (§9.4; docs/watch.md).

        In ONE step (no await): every saved command is made durable, the base is read —
        ``WatchBase``: the conversation, its newest ``limit`` entries, the admission
        entries its visible placements refer to, its live tasks, its queued inputs, the
        ``previews`` working lists of those tasks, ``as_of`` — and the binding registered.
        Then each durable main commit touching the conversation arrives whole as a
        ``WatchCommit``, each working commit of its tasks as a ``WatchPreview``, and
        ``WatchSignal`` says idle | fault | handler_error | rebind.

        With ``listener`` (called with each event; an exception becomes a
        ``handler_error`` signal and undoes nothing; a coroutine it returns runs after the
        delivery) returns the unsubscribe callable. Without, returns a ``WatchStream``:
        ``async for event in harness.watch(cid)``. More than ``buffer`` undelivered events
        retire the binding with a ``rebind`` signal. A read-only handle follows another
        owner's commits by polling the newest stored position.

        Raises:
            InvalidArgumentError: a malformed id, ``limit`` outside 1..1000, ``buffer``
                outside 1..1,000,000, a listener that is not callable.
            UnknownConversationError: no such conversation.
            ClosedError, HandleFaultedError: the handle is closed or faulted.
        """
        if listener is not None:
            return self.watches.watch(
                conversation_id, listener, limit=limit, buffer=buffer, previews=previews
            )
        stream = WatchStream()
        stream.buffer = check_limit(buffer, "buffer", maximum=1_000_000)
        stream._unsubscribe = self.watches.watch(
            conversation_id, stream._push, limit=limit, buffer=buffer, previews=previews
        )
        return stream

    # ------------------------------------------------------------------ scheduling (§6)
    async def drive(self, *, permits: Iterable[str] = ()) -> DriveOutcome:
        """Execute live work in every conversation tree until the session has no live task
        (``idle``), needs an outside event or permission (``suspended``), or closes."""
        allowed = frozenset(permits)
        self._permits = allowed
        return await self.scheduler.drive(None, permits=allowed)

    async def wait_for(
        self, task_id: int, *, timeout: float | None = None, permits: Iterable[str] = ()
    ) -> TaskSnapshot:
        """Supervise the session until task ``task_id`` is terminal, and return its record.

        Drives the whole session (as ``drive()``); while the drive is ``suspended`` because
        only an outside event can make progress (a background job's exit, a decision), it
        waits for one and drives again, so a job's exit is recorded as soon as it happens.
        With ``timeout`` (seconds), returns the still-live record once it passes.

        Raises:
            InvalidArgumentError: ``task_id`` is not an id, or ``timeout`` not None or a
                finite number >= 0.
            UnknownTaskError: no such task.
            ClosedError: the harness closed while waiting.
        """
        check_id(task_id, "task_id")
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout < 0
        ):
            raise InvalidArgumentError(
                f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}"
            )
        allowed = tuple(permits)
        first = await self.task(task_id)
        if first is None:
            raise UnknownTaskError(task_id)

        async def terminal() -> TaskSnapshot | None:
            current = await self.task(task_id)
            assert current is not None
            return None if current.live else current

        async def supervise() -> TaskSnapshot:
            while True:
                done = await terminal()
                if done is not None:
                    return done
                # The drive may sleep towards a timer of other work (a schedule's next
                # run) long after this task settled: it is watched commit by commit and
                # cancelled once the task is terminal (a drive's cancellation only ends
                # this caller's interest; executions go on).
                drive = asyncio.ensure_future(self.scheduler.drive(None, permits=allowed))
                changed = False
                try:
                    while not drive.done():
                        # Subscribed now (a next_change() task would subscribe only once
                        # it first ran): a commit after the drive's last pass, before this
                        # wait returns, wakes only this change; then drive again, not wait.
                        change = self.scheduler.subscribe()
                        waited: list[asyncio.Future[Any]] = [drive, change]
                        try:
                            await asyncio.wait(waited, return_when=FIRST_COMPLETED)
                        finally:
                            changed = change.done()
                            self.scheduler.unsubscribe(change)
                        done = await terminal()
                        if done is not None:
                            return done
                    outcome = drive.result()
                finally:
                    if not drive.done():
                        drive.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await drive
                if outcome == "closed":
                    raise ClosedError(self.session_id)
                if not changed:
                    await self.scheduler.next_change()

        if timeout is None:
            return await supervise()
        try:
            return await asyncio.wait_for(supervise(), timeout)
        except TimeoutError:
            found = await self.task(task_id)
            assert found is not None
            return found

    async def inspect(self) -> dict[str, list[TaskSnapshot]]:
        """Live tasks by role (ready / inflight / waiting)."""
        live = self.scheduler.live_tasks(None)
        return {
            role: [t for t in live if t.role == role] for role in ("ready", "inflight", "waiting")
        }

    async def shutdown(self) -> None:
        """Cancel ALL live session work, then close (§6.6).

        Seals public admission first: every new public command on this harness (and its
        conversation handles) raises ``ShuttingDownError`` while shutdown runs; shutdown's
        own commands and the settlements of executions still commit. Then ONE command, in
        one snapshot, marks every live task (foreground, background and owned descendants)
        and cancels every queued input of every mode in every conversation (result
        ``cancelled``, reason ``shutdown``; admission entries stay in the transcript). A
        session drive runs the cancellation to settlement, and the harness closes.

        A crash after the marks commit leaves them durable: the next owner's drive settles
        them. A second call joins the first (a no-op once it has finished); ``close()``
        meanwhile stops the drive and leaves the marks for the next owner.

        Raises:
            ReadOnlyError: the harness was opened read-only.
            HandleFaultedError: the handle faulted; reopen the session and shut it down.
            ClosedError: the harness was closed without a shutdown.
        """
        if self._shutdown is not None:
            await self._shutdown.wait()
            return
        self._line.check_usable(write=True)
        self._shutdown = asyncio.Event()
        try:
            await self._line.run(self._cancel_everything)
            # Every live task is marked. While a blocking configuration change waits for
            # acknowledgement (the resume gate) the drive runs ONLY their cancellation,
            # which starts no request; otherwise it is the ordinary drive.
            gate = self.scheduler.gate
            blocked = gate is not None and gate() is not None
            await self.scheduler.drive(None, cancellation_only=blocked)
        finally:
            await self.close()
            self._shutdown.set()

    def _cancel_everything(self, tx: Command) -> list[int]:
        """Shutdown's one cancellation command: mark every live task, cancel every queued
        input. Reads share the command's snapshot, so nothing created meanwhile escapes."""
        marked = [t.id for t in self.scheduler.live_tasks(None) if tx.request_abort(t.id)]
        cancel_every_queued_input(tx, self._line.storage.reads, reason="shutdown")
        return marked

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ properties
    @property
    def session_id(self) -> str:
        return self._line.session_id

    @property
    def reads(self) -> ReadPort:
        self._line.check_usable()
        return self._line.storage.reads

    @property
    def faulted(self) -> str | None:
        return self._line.faulted

    def head(self) -> int:
        """The global allocator high-water mark."""
        meta = self.reads.meta()
        return meta.head if meta else 0

    def main_head(self) -> int:
        """The last main commit boundary."""
        return self.reads.main_head()

    def meta(self) -> SessionMeta | None:
        return self.reads.meta()

    # ------------------------------------------------------------------ commands
    # Async builders first: for ``Callable[..., T | Awaitable[T]]`` mypy infers ``Never``
    # from an ``async def`` builder; separate overloads infer its result type.
    @overload
    async def command(self, build: Callable[[Command], Awaitable[T]], /) -> T: ...

    @overload
    async def command(self, build: Callable[[Command], T], /) -> T: ...

    @overload
    async def command(
        self, scope: WorkingScope, build: Callable[[WorkingCommand], Awaitable[T]], /
    ) -> T: ...

    @overload
    async def command(self, scope: WorkingScope, build: Callable[[WorkingCommand], T], /) -> T: ...

    async def command(self, *args: Any) -> Any:
        """Run a builder against committed state and persist its mutations as ONE batch.

        ``command(build)`` is a main command; ``command(scope, build)`` writes only the
        given working scope. Ids created inside the builder are final; they may leave the
        builder only through its return value, returned after the batch is durable.
        """
        if len(args) == 1:
            return await self._admitted(args[0])
        scope, build = args
        if not isinstance(scope, WorkingScope):
            raise TypeError("command(scope, build) takes a WorkingScope first")
        return await self._admitted(build, working=scope)

    async def _admitted(
        self,
        build: Callable[[Any], T | Awaitable[T]],
        *,
        working: WorkingScope | None = None,
        defer: bool = False,
    ) -> T:
        """A public command, refused once shutdown has sealed admission (§6.6); shutdown's
        own commands and executions' commands use the line directly."""
        if self._shutdown is not None and not self._line.closed:
            raise ShuttingDownError(self.session_id)
        return await self._line.run(build, working=working, defer=defer)

    # ------------------------------------------------------------------ session state
    async def get_value(
        self, address: SessionValue[T] | WorkingValue[T], *, default: T | None = None
    ) -> T | None:
        return self._reader().get_value(address, default=default)

    async def get_stored(self, address: SessionValue[T] | WorkingValue[T]) -> StoredValue[T] | None:
        return self._reader().get_stored(address)

    async def set_value(self, address: SessionValue[T], value: T) -> None:
        await self.command(lambda tx: tx.set_value(address, value))

    async def delete_value(self, address: SessionValue[Any]) -> None:
        await self.command(lambda tx: tx.delete_value(address))

    async def append_list(self, address: SessionList[T], value: T) -> int:
        return await self.command(lambda tx: tx.append_list(address, value))

    async def clear_list(self, address: SessionList[Any]) -> None:
        await self.command(lambda tx: tx.clear_list(address))

    async def read_list(
        self,
        address: SessionList[T] | WorkingList[T],
        *,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[ListElement[T]]:
        return self._reader().read_list(
            address, after=after, before=before, order=order, limit=limit
        )

    async def scan_values(
        self,
        *,
        working: WorkingScope | None = None,
        namespace: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> ValuePage:
        return self._reader().scan_values(
            working=working, namespace=namespace, after=after, limit=limit
        )

    def _reader(self) -> Command:
        """A read-only view of committed state (the command vocabulary's reads)."""
        self._line.check_usable()
        return Command(self._line)

    async def delete_conversation(self, conversation_id: int) -> None:
        await self.command(lambda tx: tx.delete_conversation(conversation_id))

    # ------------------------------------------------------------------ conversations
    async def root(self) -> ConversationHandle:
        meta = self.reads.meta()
        if meta is None or meta.root_id is None:
            raise UnknownConversationError(0, " (this session has no root yet)")
        return ConversationHandle(self, meta.root_id)

    async def conversation(self, conversation_id: int) -> ConversationHandle | None:
        check_id(conversation_id, "conversation_id")
        found = self.reads.get_conversations([conversation_id])
        return ConversationHandle(self, conversation_id) if conversation_id in found else None

    async def conversations(
        self,
        *,
        source_conversation_id: int | None = None,
        owner_task_id: int | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[ConversationSnapshot]:
        return self.reads.scan_conversations(
            source_conversation_id=source_conversation_id,
            owner_task_id=owner_task_id,
            after=after,
            before=before,
            order=order,
            limit=limit,
        )

    async def get_conversations(
        self, ids: Sequence[int], *, as_of: int | None = None
    ) -> dict[int, ConversationSnapshot]:
        return self.reads.get_conversations(ids, as_of)

    # ------------------------------------------------------------------ entries
    async def entry(self, entry_id: int) -> Entry | None:
        check_id(entry_id, "entry_id")
        return self.reads.get_entries([entry_id]).get(entry_id)

    async def get_entries(self, ids: Sequence[int], *, content: bool = True) -> dict[int, Entry]:
        return self.reads.get_entries(ids, content=content)

    async def entries(
        self,
        conversation_id: int,
        *,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        kind: str | None = None,
        key: str | None = None,
        as_of: int | None = None,
        content: bool = True,
    ) -> Page[Entry]:
        return self.reads.scan_entries(
            conversation_id,
            after=after,
            before=before,
            order=order,
            limit=limit,
            kind=kind,
            key=key,
            as_of=as_of,
            content=content,
        )

    # ------------------------------------------------------------------ tasks
    async def task(self, task_id: int) -> TaskSnapshot | None:
        self._line.check_usable()
        check_id(task_id, "task_id")
        return self._line.storage.tasks.get_tasks([task_id]).get(task_id)

    async def get_tasks(self, ids: Sequence[int]) -> dict[int, TaskSnapshot]:
        self._line.check_usable()
        return self._line.storage.tasks.get_tasks(ids)

    async def tasks(
        self,
        *,
        conversation_ids: Sequence[int] | None = None,
        live: bool | None = None,
        role: str | None = None,
        kind: str | None = None,
        foreground: bool | None = None,
        abort_requested: bool | None = None,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
    ) -> Page[TaskSnapshot]:
        """Task records filtered by indexed fields (filters before the limit)."""
        self._line.check_usable()
        return self._line.storage.tasks.scan_tasks(
            conversation_ids=conversation_ids,
            live=live,
            role=role,
            kind=kind,
            foreground=foreground,
            abort_requested=abort_requested,
            after=after,
            before=before,
            order=order,
            limit=limit,
        )

    # ------------------------------------------------------------------ outside answers
    async def answer_tool_call(self, task_id: int, content: str, *, is_error: bool = False) -> int:
        """Supply the result of a held tool call from outside. Validated before anything is
        written; writes one ordinary tool result (returned); a second answer raises
        ``ToolCallAnsweredError`` naming the entry where the first landed."""
        if not isinstance(content, str):
            raise CommandRejectedError("a tool answer is text (put structure in JSON text)")
        check_json(content, what="tool answer")  # before the task is even looked up
        return await self.command(lambda tx: answer_held_call(tx, task_id, content, is_error))

    async def decide_approval(self, task_id: int, decision: str) -> int:
        """Grant or deny a tool call held for approval by the ``before_tool`` hook (§8.6).

        ``task_id`` is the approval task (``pending_approvals()``); the held tool call's id
        is accepted too and decides its live approval. ONE command: grant settles the
        approval ``granted`` and makes the tool ready with the approved arguments (it runs
        without asking ``before_tool`` again); deny settles it ``denied`` and the tool
        finishes with the denial (``after_tool`` runs, the tool writes its own error
        result). Validated before anything is written. Returns the approval task's id.

        Raises:
            InvalidArgumentError: ``decision`` is not ``"grant"`` or ``"deny"``, or the id
                is not a task id.
            UnknownTaskError: no task has this id.
            CommandRejectedError: the task is not an approval (nor a held tool call); the
                approval was decided or cancelled already (the message names its status);
                the approval or its tool call is marked for cancellation.
        """
        return await self.command(lambda tx: decide(tx, task_id, decision))

    async def pending_approvals(self, conversation_id: int | None = None) -> list[TaskSnapshot]:
        """The approval tasks waiting for a decision, oldest first (all conversations, or
        one). The same as ``tasks(kind="approval", live=True)``, paged through."""
        if conversation_id is not None:
            check_id(conversation_id, "conversation_id")
        found: list[TaskSnapshot] = []
        after: int | None = None
        while True:
            page = await self.tasks(
                conversation_ids=None if conversation_id is None else [conversation_id],
                live=True,
                kind="approval",
                after=after,
                limit=1000,
            )
            found.extend(page.items)
            if page.next is None:
                return found
            after = page.next

    async def held_tool_calls(self, conversation_id: int | None = None) -> list[TaskSnapshot]:
        """Tool calls waiting for an outside answer (a deferred result, status ``held``);
        calls waiting for a decision are ``pending_approvals()``."""
        page = await self.tasks(
            conversation_ids=None if conversation_id is None else [conversation_id],
            live=True,
            kind="tool",
            limit=1000,
        )
        return [t for t in page.items if t.status == "held"]

    # ------------------------------------------------------------------ audit
    def audit(self, *, after: int = 0, limit: int = 1000) -> list[AuditRecord]:
        """Stored events of this session in storage order, for auditors."""
        self._line.check_usable()
        check_position(after, "after")
        check_limit(limit, maximum=1_000_000)  # a page is one list in memory: page on
        return self._line.storage.audit(after=after, limit=limit)

    def audit_count(self, *, after: int = 0) -> int:
        """How many stored events of this session follow position ``after`` (a count on
        the log's index; nothing is decoded): what is left to page through."""
        self._line.check_usable()
        check_position(after, "after")
        return self._line.storage.count_events(after=after)

    # ------------------------------------------------------------------ tamper evidence
    async def verify(self) -> ChainReport:
        """Recompute the session's hash chain from its stored events and compare it with
        the links its commit boundaries carry (reading only; any handle, read-only too).

        ``report.ok`` is False with ``report.breaks[0]`` at the first batch where an
        event was edited, removed, reordered or inserted; ``report.summary()`` says
        "verified N events through position P" otherwise. Events written before the chain
        are reported as unchained until ``start_chain`` anchors them. It reads the whole
        log on the event loop; for a large session prefer ``pico.verify(url)``."""
        self._line.check_usable()
        self._line.flush()
        # On the loop, not in a thread: this handle's storage is also its writer (a read
        # flushes group-committed work). ``pico.verify(url)`` reads a large log in a
        # thread on storage of its own while the owner goes on.
        return self._line.storage.verify_chain()

    async def start_chain(self) -> int:
        """Anchor a session written before the hash chain: ONE command recording
        ``Session.ChainStarted`` with the chain recomputed over every stored event, so a
        later change to that history is found. Nothing stored is rewritten. Returns the
        number of events anchored.

        Raises:
            InvalidArgumentError: no unchained history is left to anchor (the session
                was chained from its first event, or is anchored already); nothing is
                written.
            ReadOnlyError: the harness was opened read-only.
        """
        self._line.check_usable(write=True)
        self._line.flush()

        def build(tx: Command) -> int:
            anchor, events, unchained = self._line.storage.chain_anchor()
            if not unchained:
                raise InvalidArgumentError(
                    f"session {self.session_id!r} has no unchained history to anchor: it is "
                    "chained from its first event or already anchored; `pico verify` "
                    "checks it as it is"
                )
            tx.start_chain(anchor=anchor, events=events)
            return events

        return await self._admitted(build)

    # ------------------------------------------------------------------ the resume gate
    def configuration(self) -> Fingerprint | None:
        """The configuration fingerprint this session's agent work is recorded under (the
        Session aggregate holds it: no history is read), or None when it was never opened
        for agent work. The system prompt and each tool appear as sha256 hashes."""
        self._line.check_usable()
        recorded = self._line.session.configuration
        return None if recorded is None else dict(recorded)

    def pending_configuration(self) -> list[dict[str, Any]]:
        """The configuration changes waiting for ``acknowledge_configuration()`` (each
        ``{field, class, before, after}``); empty when drives may run."""
        gate = self._gate
        return [] if gate is None or not gate.blocking else [dict(c) for c in gate.changes]

    async def acknowledge_configuration(self) -> list[dict[str, Any]]:
        """Accept the configuration change this open found (a blocking one waits for
        this): ONE command records ``Session.ConfigurationChanged`` with every change
        (``acknowledged=True``), then drives run under the new configuration. Returns the
        changes recorded; empty (and writes nothing) when none is waiting.

        Raises ``ReadOnlyError`` (a read-only harness), ``ShuttingDownError``."""
        self._line.check_usable(write=True)
        gate = self._gate
        if gate is None or not gate.blocking:
            return []
        changes = [dict(c) for c in gate.changes]
        live = self._line.storage.tasks.live_tasks  # in the command's snapshot
        await self._admitted(lambda tx: gate.record(tx, acknowledged=True, live=live()))
        gate.accepted()
        return changes


def _create_root(tx: Command, values: Iterable[tuple[Address[Any], Any]] = ()) -> int:
    """Empty storage only: the root conversation and the initial values, in one commit."""
    root = tx.create_conversation()
    tx.session_ops.append(lambda session: session.designate_root(root))
    for address, value in values:
        if isinstance(address, ConversationValue):
            tx.set_value(address, value, conversation_id=root)
        else:
            tx.set_value(address, value)
    return root
