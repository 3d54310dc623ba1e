"""Jobs (§5.1, §8.7): an OS process run in the background, adopted after a crash.

    status      role        transitions
    planned     ready       -> spawning | killed
    spawning    inflight    -> running | exited | lost | failed | killed
    running     waiting     -> exited | killed | lost
    exited, killed, lost, failed   terminal

``planned`` executes: ONE command records the launch intent (``{ spawning intent with a
durable adoption and log identity }``: the token, the log files and the status file the
host's wrapper will write) BEFORE the host starts anything; the process starts in its own
session and process group; ONE command records ``{ running with a verified process
identity }`` (the wrapper's pid, start time, boot and token: a pid alone is not identity).
``running`` is a waiting task: its recovery installs the exit observer (once per waiting
phase), and the exit — output drained — is ONE command ``{ immutable result: exit code or
signal, log references, bounded tails; terminal job }``.

Recovery never launches twice. ``spawning`` (the owner died between intent and identity):
the wrapper carrying the token is adopted if it runs; its status file is the outcome if it
exited; only an intent whose log files were never created (no process can exist) is
launched now; anything else is ``lost``. ``running``: the same process (pid + start time +
boot + token) is adopted; if it ended, the status file says how (``exited``); a pid now
held by another process, or no status, is ``lost`` with the reason.

Abort stops the process group through the host (SIGTERM, the job's grace period, SIGKILL),
drains output and records ``killed`` with the result; a job that had already ended records
``exited``; one cancelled before it started records ``killed`` with no process. ``failed``
(not in the seed's table) is a launch the host refused before anything ran (its working
directory vanished): the outcome is known, so it is not ``lost``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pico.application.command import Command
from pico.application.flows.common import task_state
from pico.application.host import (
    DEFAULT_GRACE,
    DEFAULT_LOG_CAP,
    ExitResult,
    LaunchIntent,
    LaunchSpec,
    ProcessHost,
    ProcessIdentity,
    check_grace,
    check_launch_spec,
)
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.errors import ConfigurationError, InvalidArgumentError, PicoError
from pico.domain.json import JsonObject, JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = [
    "JobDefinition",
    "JobServices",
    "create_job",
    "job_outcome_text",
    "job_spec",
]


@dataclass
class JobServices:
    """What the job flow runs with: the process host (made on first use by ``factory``
    when not given, so a harness that runs no job needs none) and the directory the logs
    and status files go to."""

    directory: str
    host: ProcessHost | None = None
    factory: Callable[[], ProcessHost] | None = None
    _made: ProcessHost | None = field(default=None, repr=False)

    def get_host(self) -> ProcessHost:
        if self.host is not None:
            return self.host
        if self._made is None:
            if self.factory is None:
                raise ConfigurationError(
                    "no process host is configured: import pico (which registers the POSIX "
                    "host) or pass Harness.open(host=...)"
                )
            self._made = self.factory()
        return self._made


def default_job_directory(storage: object, session: str) -> str:
    """Where a harness opened without ``job_directory=`` keeps job logs: beside a SQLite
    file (``<db>.jobs/<session>``), inside a JSONL directory (``jobs/<session>``), else
    under the system's temporary directory (``pico-jobs/<session>``: set it explicitly
    for PostgreSQL or memory storage if the logs must outlive a reboot). A session name
    that is not a plain file name is replaced by a hash of it."""
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}", session):
        session = "session-" + hashlib.sha256(session.encode("utf-8", "replace")).hexdigest()[:16]
    if isinstance(storage, str):
        for prefix, below in (("sqlite:///", None), ("jsonl:///", "jobs")):
            if storage.startswith(prefix):
                path = storage[len(prefix) :].split("?", 1)[0]
                if path and path != ":memory:":
                    base = os.path.join(path, below) if below else f"{path}.jobs"
                    return os.path.join(os.path.abspath(base), session)
    return os.path.join(tempfile.gettempdir(), "pico-jobs", session)


def job_spec(
    argv: object,
    *,
    cwd: object = None,
    env: object = None,
    log_cap: object = DEFAULT_LOG_CAP,
    grace: object = DEFAULT_GRACE,
) -> JsonObject:
    """A job's launch fields as the JSON its task stores, every one checked first
    (``InvalidArgumentError`` naming the field). ``cwd`` must be an existing directory now
    (stored absolute, so a later owner started elsewhere launches in the same place); the
    host checks it again at launch."""
    spec = LaunchSpec(argv, cwd, env, log_cap)  # type: ignore[arg-type]
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise InvalidArgumentError(
            f"cwd {spec.cwd!r} is not a directory; pass an existing directory or None for "
            "the harness's own"
        )
    return {
        "argv": list[JsonValue](spec.argv),
        "cwd": None if spec.cwd is None else os.path.abspath(spec.cwd),
        "env": None if spec.env is None else dict[str, JsonValue](spec.env),
        "log_cap": spec.log_cap,
        "grace": check_grace(grace),
    }


def create_job(
    tx: Command,
    services: JobServices,
    conversation_id: int,
    spec: JsonObject,
    *,
    foreground: bool = False,
    spawned_by: int | None = None,
) -> int:
    """Create a ``planned`` job from ``job_spec``'s fields in the caller's command."""
    return tx.create_task(
        conversation_id,
        "job",
        foreground=foreground,
        spawned_by=spawned_by,
        state={**spec, "directory": services.directory},
    )


def _launch_spec(state: Mapping[str, JsonValue]) -> LaunchSpec:
    argv = state.get("argv")
    log_cap = state.get("log_cap")
    return LaunchSpec(
        tuple(argv) if isinstance(argv, list) else argv,  # type: ignore[arg-type]
        state.get("cwd"),  # type: ignore[arg-type]
        state.get("env"),  # type: ignore[arg-type]
        log_cap,  # type: ignore[arg-type]
    )


def _grace(state: Mapping[str, JsonValue]) -> float:
    grace = state.get("grace")
    return float(grace) if isinstance(grace, (int, float)) else DEFAULT_GRACE


def job_outcome_text(job: TaskSnapshot) -> tuple[str, bool]:
    """A settled job as a tool result: how it ended, then the tails of its output; and
    whether that is an error (anything but exit code 0)."""
    state = task_state(job)
    result = state.get("result")
    result = result if isinstance(result, dict) else {}
    code, signum = result.get("exit_code"), result.get("signal")
    if job.status == "exited" and code is not None:
        head = f"job {job.id} exited with code {code}"
    elif job.status in ("exited", "killed") and signum is not None:
        head = (
            f"job {job.id} {'was killed' if job.status == 'killed' else 'ended'} by signal {signum}"
        )
    else:
        reason = state.get("reason")
        head = f"job {job.id} {job.status}" + (f": {reason}" if isinstance(reason, str) else "")
    parts = [head]
    for stream in ("stdout", "stderr"):
        tail = result.get(f"{stream}_tail")
        if isinstance(tail, str) and tail:
            parts.append(f"--- {stream} (tail) ---\n{tail}")
    return "\n".join(parts), not (job.status == "exited" and code == 0)


class JobDefinition(TaskDefinition):
    kind = "job"
    initial_status = "planned"
    roles: dict[str, Role] = {
        "planned": "ready",
        "spawning": "inflight",
        "running": "waiting",
        "exited": "terminal",
        "killed": "terminal",
        "lost": "terminal",
        "failed": "terminal",
    }
    transitions = {
        "planned": ["spawning", "killed"],
        "spawning": ["running", "exited", "lost", "failed", "killed"],
        "running": ["exited", "killed", "lost"],
    }

    def __init__(self, services: JobServices) -> None:
        self.services = services

    def validate_state(self, value: JsonValue) -> JsonValue:
        if not isinstance(value, dict):
            raise ValueError("a job's state is a JSON object")
        argv = value.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("a job's state needs argv, a non-empty list of str")
        if not isinstance(value.get("directory"), str):
            raise ValueError("a job's state needs directory, the folder of its logs")
        # The launch fields as start_job checks them, so a task created directly
        # (tx.create_task) cannot carry a spec that would only fail at launch.
        try:
            check_launch_spec(argv, value.get("cwd"), value.get("env"), value.get("log_cap"))
            check_grace(value.get("grace", DEFAULT_GRACE))
        except InvalidArgumentError as exc:
            raise ValueError(str(exc)) from None
        return value

    # ------------------------------------------------------------------ execute
    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        host = self.services.get_host()
        spec = _launch_spec(state)
        intent = host.intend(spec, directory=str(state["directory"]))
        spawning = {**state, "intent": intent.to_json()}

        def intend(tx: Command) -> bool:
            if tx.abort_marked(task.id) is not False:
                return False  # cancelled before it started: the abort handler settles
            tx.patch_task(task.id, status="spawning", state=spawning)
            return True

        if await ctx.command(intend):  # durable before anything starts
            await self._launch(task, ctx, spawning, spec, intent)

    async def _launch(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        spec: LaunchSpec,
        intent: LaunchIntent,
    ) -> None:
        if ctx.cancelled:
            return  # marked after the intent: nothing started; abort records killed
        host = self.services.get_host()
        try:
            identity = await asyncio.to_thread(host.launch, spec, intent)
        except PicoError as exc:  # refused before anything ran: the outcome is known
            await self._settle(task, ctx, state, "failed", reason=str(exc))
            return
        running = {**state, "identity": identity.to_json()}
        # Recorded even if cancellation arrived meanwhile: the process runs, and the abort
        # handler needs its identity to stop it.
        await ctx.command(lambda tx: tx.patch_task(task.id, status="running", state=running))

    # ------------------------------------------------------------------ recover
    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        host = self.services.get_host()
        intent = LaunchIntent.from_json(state.get("intent"))
        if task.status == "running":
            self._observe(
                task, ctx, state, intent, ProcessIdentity.from_json(state.get("identity"))
            )
            return
        # spawning: the owner died between the intent and the identity.
        found = host.find(intent)
        if found is not None:
            adopted = {**state, "identity": found.to_json()}
            await ctx.command(lambda tx: tx.patch_task(task.id, status="running", state=adopted))
            return
        result = host.recover(intent, None)
        if result is not None:
            await self._settle(task, ctx, state, "exited", result=result)
        elif not host.launched(intent):  # no process of this intent can exist
            await self._launch(task, ctx, state, _launch_spec(state), intent)
        else:
            await self._settle(
                task,
                ctx,
                state,
                "lost",
                reason="the job was launched, but no process carries its token and it left "
                "no exit status (the launch was interrupted, or its wrapper was killed)",
            )

    def _observe(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        intent: LaunchIntent,
        identity: ProcessIdentity,
    ) -> None:
        """The exit observer of one waiting phase: ``host.wait`` runs while subscribed; the
        initial reconciliation settles a process that ended while nobody watched."""
        host = self.services.get_host()

        def subscribe(notify: Callable[[Any], None]) -> Callable[[], None]:
            async def watch() -> None:
                notify(("exit", await host.wait(identity, intent)))

            job = asyncio.ensure_future(watch())

            def unsubscribe() -> None:
                job.cancel()

            return unsubscribe

        async def reconcile(event: Any, rctx: TaskExecution) -> None:
            if rctx.current().status != "running":
                return
            if event is None:  # the initial check: did it end while nobody watched?
                if host.identify(identity) == "running":
                    return
                await self._ended(task, rctx, state, intent, identity)
                return
            _, result = event
            if result is None:
                await self._ended(task, rctx, state, intent, identity)
            else:
                await self._settle(task, rctx, state, "exited", result=result)

        ctx.observe(subscribe, reconcile, promised=True)

    async def _ended(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        intent: LaunchIntent,
        identity: ProcessIdentity,
    ) -> None:
        """The recorded process no longer runs: its status file is the outcome, or the
        job is lost with the reason."""
        host = self.services.get_host()
        known = host.identify(identity)
        result = host.recover(intent, identity)
        if result is not None:
            await self._settle(task, ctx, state, "exited", result=result)
            return
        if known == "gone":
            reason = (
                f"process {identity.pid} is gone: its pid now belongs to another process or "
                "the machine restarted, and it left no exit status"
            )
        else:
            reason = f"process {identity.pid} ended without an exit status (its wrapper was killed)"
        await self._settle(task, ctx, state, "lost", reason=reason)

    # ------------------------------------------------------------------ abort
    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        if task.status == "planned":
            await self._settle(task, ctx, state, "killed", reason="cancelled before it started")
            return
        host = self.services.get_host()
        intent = LaunchIntent.from_json(state.get("intent"))
        if task.status == "running":
            identity: ProcessIdentity | None = ProcessIdentity.from_json(state.get("identity"))
        else:  # spawning: it may have started
            identity = host.find(intent)
            if identity is None:
                result = host.recover(intent, None)
                if result is not None:
                    await self._settle(task, ctx, state, "exited", result=result)
                elif host.launched(intent):
                    await self._settle(
                        task, ctx, state, "lost", reason="cancelled; the launch was interrupted"
                    )
                else:
                    await self._settle(
                        task, ctx, state, "killed", reason="cancelled before it started"
                    )
                return
            state = {**state, "identity": identity.to_json()}
        assert identity is not None
        if host.identify(identity) != "running":
            await self._ended(task, ctx, state, intent, identity)
            return
        result = await host.terminate(identity, intent, grace=_grace(state))
        await self._settle(
            task,
            ctx,
            state,
            "killed",
            result=result,
            reason=None if result is not None else "stopped; its wrapper left no exit status",
        )

    # ------------------------------------------------------------------ settle
    async def _settle(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        status: str,
        *,
        result: ExitResult | None = None,
        reason: str | None = None,
    ) -> None:
        final: dict[str, JsonValue] = dict(state)
        if result is not None:
            final["result"] = result.to_json()
        if reason is not None:
            final["reason"] = reason
        await ctx.command(lambda tx: tx.patch_task(task.id, status=status, state=final))
