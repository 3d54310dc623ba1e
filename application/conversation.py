"""The public API (§9.1): ``ConversationHandle``, the commands and reads of one
conversation of an open ``Harness``.

A handle is not a stored object: it holds the harness and a conversation id, and every
command runs on the harness's command line, resolving only after its one batch is durable
and published.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pico.application.command import Command, ConversationCommand
from pico.application.flows import InputResult
from pico.application.flows.collapse import start_collapse
from pico.application.flows.generation import generation_state
from pico.application.flows.inputs import (
    MODES,
    cancel_queued_inputs,
    enqueue,
    input_result_address,
    place,
    queue_address,
    set_results,
)
from pico.application.flows.job import JobServices, create_job, job_spec
from pico.application.flows.schedule import create_schedule, subagent_action
from pico.application.flows.subagent import CONTEXTS, launch, offered_tools
from pico.application.host import DEFAULT_GRACE, DEFAULT_LOG_CAP, LaunchSpec
from pico.application.model import Message
from pico.application.projection import Projection, project_context
from pico.application.recurrence import Recurrence
from pico.application.scheduler import DriveOutcome
from pico.application.state import ConversationList, ConversationValue, Initialization
from pico.domain.errors import (
    CommandRejectedError,
    InvalidArgumentError,
    LiveWorkError,
    UnknownConversationError,
)
from pico.domain.ids import check_choice, check_id, check_optional_id
from pico.domain.json import JsonValue, check_json, dumps
from pico.domain.values import (
    ConversationSnapshot,
    Entry,
    ListElement,
    Order,
    Page,
    StoredValue,
    ValuePage,
)

if TYPE_CHECKING:
    from pico.application.harness import Harness

__all__ = ["ConversationHandle"]

T = TypeVar("T")


class _DryRun(Exception):
    """Raised by a builder to discard its batch after validating it (rewind's target)."""


class ConversationHandle:
    """Issues commands for one conversation. Not a stored object: read ``snapshot()``."""

    def __init__(self, harness: Harness, conversation_id: int) -> None:
        self.harness = harness
        self.id = conversation_id

    def __repr__(self) -> str:
        return f"ConversationHandle(id={self.id}, session={self.harness.session_id!r})"

    async def snapshot(self, *, as_of: int | None = None) -> ConversationSnapshot:
        found = self.harness.reads.get_conversations([self.id], as_of)
        if self.id not in found:
            where = "" if as_of is None else f" at position {as_of}"
            raise UnknownConversationError(self.id, where)
        return found[self.id]

    async def context_as_of(self, position: int) -> tuple[int, ...]:
        """The context that existed at ``position`` (§7.7), not today's context filtered."""
        return self.harness.reads.context_as_of(self.id, position)

    # ------------------------------------------------------------------ agent turns (§8.1)
    async def accept(self, input: JsonValue, *, request_id: str | None = None) -> int:
        """Accept user input (§8.1). Idle: ONE command places eligible queued input, appends
        and selects this input and creates one generation for all of them. Busy: the input
        is stored unselected and queued as a follow-up (result ``queued``). Returns the input
        id (its admission entry). With ``request_id``, a retry after a lost reply returns the
        original input; reuse for different input or another conversation rejects."""
        return await self._admit(input, "follow_up", request_id)

    async def steer(self, input: JsonValue, *, request_id: str | None = None) -> int:
        """Input for the running turn: placed at the next tool or answer boundary."""
        return await self._admit(input, "steer", request_id)

    async def follow_up(self, input: JsonValue, *, request_id: str | None = None) -> int:
        """Input for after the current answer: placed at the next answer boundary."""
        return await self._admit(input, "follow_up", request_id)

    async def next_run(self, input: JsonValue, *, request_id: str | None = None) -> int:
        """Input kept for the next explicit idle acceptance only."""
        return await self._admit(input, "next_run", request_id)

    async def append_message(self, input: JsonValue) -> int:
        """Context only, never a run request: selected now when idle (result ``placed``),
        otherwise at the next safe boundary."""
        return await self._admit(input, "write", None)

    async def cancel_queued(self, input_id: int) -> str:
        """``cancelled`` | ``already_consumed`` | ``not_found``."""
        check_id(input_id, "input_id")

        def build(tx: Command) -> str:
            for mode in MODES:
                address = queue_address(mode, input_id)
                if tx.get_stored(address, conversation_id=self.id) is not None:
                    with tx.core():
                        tx.delete_value(address, conversation_id=self.id)
                    set_results(tx, [input_id], {"status": "cancelled", "reason": "cancelled"})
                    return "cancelled"
            stored = tx.get_stored(input_result_address(input_id))
            return "not_found" if stored is None else "already_consumed"

        return await self.harness.command(build)

    async def _admit(
        self, input: JsonValue, mode: str, request_id: str | None, *, defer: bool = False
    ) -> int:
        services = self.harness.services
        if services is None:
            raise CommandRejectedError(
                "this harness has no model provider: open it with Harness.open(provider=...)"
            )
        offered = (
            list(services.active_tools)
            if services.active_tools is not None
            else list(services.tools.names())
        )
        fingerprint = dumps({"mode": mode, "input": input}, what="input")

        def build(tx: Command) -> int:
            def create() -> int:
                # Busy = a turn is running; a collapse is context maintenance, not a turn
                # (a turn started now simply makes a pending collapse wait to publish).
                busy = [
                    t
                    for t in tx.scan_tasks(
                        conversation_ids=[self.id], live=True, foreground=True, limit=100
                    ).items
                    if t.kind != "collapse"
                ]
                if busy:
                    return enqueue(tx, self.id, mode, input)
                # Explicit idle acceptance: eligible queued input first, then this input.
                triggers = place(tx, self.id, MODES, selection=services.queue_selection)
                entry = tx.append_entry(self.id, "user", input)
                tx.append_context(self.id, [entry])
                if mode == "write":
                    set_results(tx, [entry], {"status": "placed", "entry_id": entry})
                else:
                    triggers.append(entry)
                    set_results(tx, [entry], {"status": "running"})
                if triggers:
                    tx.create_task(
                        self.id,
                        "generation",
                        foreground=True,
                        state=generation_state(services, triggers, offered),
                    )
                return entry

            if request_id is None:
                return create()
            input_id, _ = tx.claim_request_key(
                request_id, conversation_id=self.id, fingerprint=fingerprint, create=create
            )
            return input_id

        if defer:
            return await self.harness._admitted(build, defer=True)
        return await self.harness.command(build)

    async def result(self, input_id: int) -> InputResult | None:
        """The outcome of an accepted input (§8.1), or None if no such input. Only a
        durable outcome is reported: deferred settlements are committed first."""
        check_id(input_id, "input_id")
        self.harness._line.flush()
        stored = await self.harness.get_value(input_result_address(input_id))
        if not isinstance(stored, dict):
            return None
        entry = stored.get("entry_id")
        reason = stored.get("reason")
        return InputResult(
            str(stored.get("status")),
            entry if isinstance(entry, int) else None,
            reason if isinstance(reason, str) else None,
        )

    async def prompt(
        self, input: JsonValue, *, request_id: str | None = None, permits: Iterable[str] = ()
    ) -> tuple[int, InputResult | None]:
        """Accept, drive while observing that input, and return its result: terminal, or
        running/queued when progress suspends or closes. Never another input's answer."""
        # The acceptance is group-committed with the turn's first durable command (the
        # generation's intent, before the provider is called) or the drive's return.
        input_id = await self._admit(input, "follow_up", request_id, defer=True)
        await self.drive(permits=permits)
        return input_id, await self.result(input_id)

    async def collapse(self, *, instructions: str = "") -> int:
        """Ask for a collapse (§8.5): the returned task summarizes a complete prefix and
        replaces it when the context is editable and unchanged. One live per conversation."""
        services = self.harness.services
        if services is None:
            raise CommandRejectedError(
                "this harness has no model provider: open it with Harness.open(provider=...)"
            )
        return await self.harness.command(
            lambda tx: start_collapse(tx, services, self.id, instructions)
        )

    async def messages(
        self, *, projection: Projection | None = None, as_of: int | None = None
    ) -> list[Message]:
        """The provider messages of this context (§2.2): two batched reads, no writes."""
        return list(project_context(self.harness.reads, self.id, projection, as_of=as_of))

    async def context_entries(self, *, as_of: int | None = None) -> list[Entry]:
        """The selected entries in context order, read in one batch."""
        snap = await self.snapshot(as_of=as_of)
        found = self.harness.reads.get_entries(snap.context)
        return [found[i] for i in snap.context]

    async def entries(
        self,
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
        return await self.harness.entries(
            self.id,
            after=after,
            before=before,
            order=order,
            limit=limit,
            kind=kind,
            key=key,
            as_of=as_of,
            content=content,
        )

    @overload
    async def command(self, build: Callable[[ConversationCommand], Awaitable[T]]) -> T: ...

    @overload
    async def command(self, build: Callable[[ConversationCommand], T]) -> T: ...

    async def command(self, build: Callable[[ConversationCommand], Any]) -> Any:
        """``Harness.command`` with a builder for this conversation."""
        return await self.harness.command(lambda tx: build(ConversationCommand(tx, self.id)))

    async def append(
        self,
        kind: str,
        content: JsonValue,
        *,
        metadata: dict[str, JsonValue] | None = None,
        key: str | None = None,
        select: bool = True,
    ) -> int:
        """Append an entry and (by default) select it into context, in one commit."""

        def build(tx: Command) -> int:
            entry_id = tx.append_entry(self.id, kind, content, metadata=metadata, key=key)
            if select:
                tx.append_context(self.id, [entry_id])
            return entry_id

        return await self.harness.command(build)

    async def append_context(self, ids: Sequence[int]) -> None:
        await self.harness.command(lambda tx: tx.append_context(self.id, ids))

    async def replace_context_prefix(
        self, through: int, replacement: Sequence[int], *, expected_revision: int | None = None
    ) -> None:
        await self.harness.command(
            lambda tx: tx.replace_context_prefix(
                self.id, through, replacement, expected_revision=expected_revision
            )
        )

    async def compact(
        self,
        summary: JsonValue,
        *,
        through: int,
        kind: str = "summary",
        expected_revision: int | None = None,
        metadata: dict[str, JsonValue] | None = None,
    ) -> int:
        """Append a summary entry and replace the context prefix through ``through`` with it,
        in one commit (§2.3). Returns the summary's id."""

        def build(tx: Command) -> int:
            summary_id = tx.append_entry(self.id, kind, summary, metadata=metadata)
            tx.replace_context_prefix(
                self.id, through, [summary_id], expected_revision=expected_revision
            )
            return summary_id

        return await self.harness.command(build)

    async def reset_context(self, ids: Sequence[int] = ()) -> None:
        await self.harness.command(lambda tx: tx.reset_context(self.id, ids))

    async def handoff(self, content: JsonValue, *, kind: str = "handoff") -> int:
        """Append a handoff entry and reset the context to it, in one commit."""

        def build(tx: Command) -> int:
            entry_id = tx.append_entry(self.id, kind, content)
            tx.reset_context(self.id, [entry_id])
            return entry_id

        return await self.harness.command(build)

    async def fork(
        self,
        *,
        at_entry: int | None = None,
        as_of: int | None = None,
        sticky: Initialization | Sequence[ConversationValue[Any]] = (),
        inherit_state: bool = True,
    ) -> ConversationHandle:
        """A historical fork after the complete commit containing ``at_entry`` (or at main
        boundary ``as_of``): shares the transcript prefix, starts from the context that
        existed there, inherits rewindable state through the boundary, inherits no live
        work. ``sticky=Initialization(inherit=[...], set=[(address, value), ...])`` copies
        the selected sticky values' CURRENT contents, then applies the overrides; other
        sticky values start absent. A plain list of addresses only selects. One commit."""
        new_id = await self.harness.command(
            lambda tx: tx.fork(
                self.id, at_entry=at_entry, as_of=as_of, sticky=sticky, inherit_state=inherit_state
            )
        )
        return ConversationHandle(self.harness, new_id)

    async def rewind(
        self,
        *,
        at_entry: int | None = None,
        as_of: int | None = None,
        keep_running: bool = False,
        sticky: Initialization | Sequence[ConversationValue[Any]] = (),
        inherit_state: bool = True,
    ) -> ConversationHandle:
        """Go back to a historical target (§9.1): stop this conversation's foreground work,
        then fork at ``at_entry`` (or main boundary ``as_of``) as ``fork`` does.

        1. The target is validated first, by the fork's own rules (a dry run of the fork
           command, discarded): an invalid target raises the fork's error
           (``InvalidPositionError``, ``InvalidArgumentError``, ``AddressPolicyError``, ...)
           and aborts nothing.
        2. Unless ``keep_running``, the current foreground work is cancelled as ``abort()``
           selects it, and the cancellation is drained: only marked tasks' cleanup runs (no
           other effect starts) until none remains in this tree. An idle conversation
           marks nothing. If the cleanup cannot finish now (it waits for the outside),
           ``LiveWorkError`` is raised: the marks are durable, no fork was made; drive the
           conversation and rewind again. ``keep_running=True`` leaves the work alone.
        3. One fork command. It validates again against committed state: if the state
           changed since step 1 (the conversation was deleted, say), the fork raises its
           own error and the cancellation stays done.
        """
        if type(keep_running) is not bool:
            raise InvalidArgumentError(f"keep_running must be True or False, got {keep_running!r}")

        def build(tx: Command) -> int:
            return tx.fork(
                self.id, at_entry=at_entry, as_of=as_of, sticky=sticky, inherit_state=inherit_state
            )

        def dry_run(tx: Command) -> None:
            build(tx)
            raise _DryRun  # discards the batch: nothing written, no number consumed

        with contextlib.suppress(_DryRun):
            await self.harness.command(dry_run)
        if not keep_running:
            await self.abort()
            outcome = await self.harness.scheduler.drive(self.id, cancellation_only=True)
            if outcome != "idle":
                raise LiveWorkError(
                    f"rewind of conversation {self.id}: its foreground cancellation is "
                    f"requested but not settled (the drain is {outcome}); no fork was made. "
                    "Drive the conversation until it is idle, then rewind again"
                )
        return ConversationHandle(self.harness, await self.harness.command(build))

    # ------------------------------------------------------------------ scheduling (§6)
    async def spawn(
        self,
        prompt: JsonValue,
        *,
        context: str = "fresh",
        values: Initialization | Sequence[ConversationValue[Any]] | None = None,
        tools: Sequence[str] | None = None,
    ) -> int:
        """Start a subagent (§4.3, §5.7, §8.6); returns its owner task id S.

        ONE command creates S, the child conversation it owns, the child's initial values
        (``values=Initialization(inherit=[...], set=[...])``: the selected present values
        of this conversation copied, then the overrides; anything unselected is absent in
        the child, with no fallback here; lists are never copied), its context
        (``"fresh"``: empty; ``"inherit"``: this conversation's context up to its last
        complete-exchange boundary, never an unresolved call), the prompt selected there
        and the child's first generation, offered ``tools`` (default: the tools a new
        input is offered). Nothing runs until that command is durable.

        S is detached background work (§5.6): this conversation's ``drive()`` neither
        waits for it nor aborts it with ``abort()``; ``harness.drive()`` supervises it, and
        ``abort_background(S)`` cancels S and everything in its child. The child's final
        answer (or failure, or stop) settles S in the same command: ``harness.task(S)``
        shows ``status`` done | failed | stopped | aborted and ``state["result"]``
        (``{"status": "done", "entry_id": answer}``, ...). ``S.owned_conversation_id`` is
        the child; ``harness.conversation(child)`` drives or reads it directly.

        Raises:
            InvalidJsonError: the prompt is not strict JSON.
            InvalidArgumentError: ``context`` is not fresh|inherit, or ``tools`` names an
                unregistered tool.
            AddressPolicyError: ``values`` selects a list, session or working address.
            CommandRejectedError: this harness has no model provider.
        """
        services = self.harness.services
        if services is None:
            raise CommandRejectedError(
                "this harness has no model provider: open it with Harness.open(provider=...)"
            )
        init = None if values is None else Initialization.of(values)  # checked first
        return await self.harness.command(
            lambda tx: launch(
                tx, services, self.id, prompt, context=context, values=init, tools=tools
            )
        )

    def _jobs(self) -> JobServices:
        jobs = self.harness.jobs
        if jobs is None:
            raise CommandRejectedError(
                "this harness was opened with its own 'job' definition; start such jobs "
                "with harness.command(lambda tx: tx.create_task(...))"
            )
        return jobs

    async def start_job(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        log_cap: int = DEFAULT_LOG_CAP,
        grace: float = DEFAULT_GRACE,
    ) -> int:
        """Start a job: an OS process run in the background (§5.1, §8.7); returns its task id.

        ONE command creates the job ``planned``; a drive (``harness.drive()``,
        ``harness.wait_for(job)``) launches it: the launch intent (token, log and status
        files) is committed before the process starts in its own session and process group,
        then its verified identity (``running``), then ONE command with its result when it
        exits: ``status`` exited | killed | lost | failed and ``state["result"]`` (exit code
        or signal, log paths, bytes, tails). ``argv`` runs without a shell (pass ``("sh",
        "-c", "...")`` for one); ``env`` is the whole environment (None: the harness's own;
        it is stored in the task, so pass secrets through the harness's environment, not
        here); ``log_cap`` is the bytes kept per stream; ``grace`` the seconds between
        SIGTERM and SIGKILL when it is aborted.

        A job is detached background work (§5.6): this conversation's ``drive()`` neither
        waits for it nor aborts it; ``abort_background(job)`` stops it (SIGTERM, ``grace``,
        SIGKILL) and records ``killed``. ``harness.close()`` leaves it running for the next
        owner to adopt; ``harness.shutdown()`` stops it.

        Raises:
            InvalidArgumentError: a field is malformed (names it), or ``cwd`` is not an
                existing directory; nothing is written.
            CommandRejectedError: the harness runs its own ``job`` definition.
            ConfigurationError: no process host can run here (not Linux, no ``host=``).
        """
        jobs = self._jobs()
        spec = job_spec(argv, cwd=cwd, env=env, log_cap=log_cap, grace=grace)
        jobs.get_host()  # a machine that cannot run jobs says so now, writing nothing
        return await self.harness.command(lambda tx: create_job(tx, jobs, self.id, spec))

    async def schedule(
        self,
        recurrence: Recurrence,
        *,
        job: LaunchSpec | None = None,
        grace: float = DEFAULT_GRACE,
        prompt: JsonValue = None,
        context: str = "fresh",
        tools: Sequence[str] | None = None,
    ) -> int:
        """Start a recurring schedule S (§8.7); returns S, its one cancellation handle.

        Each due time creates one action J: a job (``job=LaunchSpec(argv, ...)``, with
        ``grace``) or a subagent answering ``prompt`` (``context``, ``tools`` as
        ``spawn``). S waits for J to be terminal before it plans the next run, so at most
        one J is live. After downtime ``recurrence.missed`` decides how many actions run:
        ``skip`` (only a run still on time), ``once``, or ``catch_up`` (at most
        ``catch_up_limit`` newest), never the whole backlog. ``harness.task(S).state`` holds
        the recurrence, ``runs_done``, ``skipped``, ``last_run`` (J's outcome reference)
        and ``outcomes`` (counts by J's status).

        S is detached background work: ``abort_background(S)`` settles it ``aborted`` and
        stops its unfinished J. It completes (``complete``) when the recurrence ends
        (``until``, ``count``).

        Raises:
            InvalidArgumentError: not exactly one of ``job`` and ``prompt``; a malformed
                recurrence or field; a recurrence with no run; nothing is written.
            CommandRejectedError: a subagent action on a harness without a model provider.
        """
        if not isinstance(recurrence, Recurrence):
            raise InvalidArgumentError(
                f"recurrence must be a Recurrence (pico.Recurrence(every=...) or "
                f"Recurrence(cron=...)), got {type(recurrence).__name__}"
            )
        if (job is None) == (prompt is None):
            raise InvalidArgumentError(
                "a schedule runs exactly one action: pass job=LaunchSpec(...) or prompt=..."
            )
        jobs = self._jobs()  # the built-in job kind is this harness's
        if job is not None:
            jobs.get_host()
            if not isinstance(job, LaunchSpec):
                raise InvalidArgumentError(
                    f"job must be a LaunchSpec (argv, cwd, env, log_cap), got {type(job).__name__}"
                )
            spec = job_spec(job.argv, cwd=job.cwd, env=job.env, log_cap=job.log_cap, grace=grace)
            action: dict[str, JsonValue] = {"job": spec}
        else:
            services = self.harness.services
            if services is None:
                raise CommandRejectedError(
                    "a subagent schedule needs a model provider: open the harness with "
                    "Harness.open(provider=...)"
                )
            check_json(prompt, what="schedule prompt")
            check_choice(context, "context", CONTEXTS)
            offered = None if tools is None else list(offered_tools(services, tools))
            action = subagent_action(prompt, context=context, tools=offered)
        now = self.harness.scheduler.clock.now()
        return await self.harness.command(
            lambda tx: create_schedule(tx, self.id, recurrence, action, now=now)
        )

    async def drive(self, *, permits: Iterable[str] = ()) -> DriveOutcome:
        """Execute work in this conversation and the conversations its tasks own. ``idle``
        when no required foreground work or selected cancellation remains; detached
        background work is serviced while the drive runs but not waited for."""
        return await self.harness.scheduler.drive(self.id, permits=permits)

    async def abort(self) -> list[int]:
        """Durably mark the current required foreground work (§5.6, §6.4): foreground tasks
        in this tree and their unfinished dependencies, selected and marked in ONE command
        (its reads share the command's snapshot, so nothing created meanwhile escapes).
        Returns the newly marked ids; a repeated abort joins the outstanding one. A drive
        performs the cleanup."""
        scheduler = self.harness.scheduler
        services = self.harness.services

        def build(tx: Command) -> list[int]:
            live = scheduler.live_tasks(self.id)
            by_id = {t.id: t for t in live}
            cache: dict[int, bool] = {}
            # Foreground work here and in children owned through foreground owners; the
            # foreground work of a detached child is not required here (§5.6).
            selected = {t.id for t in live if scheduler.required(t, self.id, cache)}
            frontier = list(selected)
            while frontier:  # unfinished dependencies are required work too
                task = by_id.get(frontier.pop())
                for dep in task.after if task else ():
                    if dep in by_id and dep not in selected:
                        selected.add(dep)
                        frontier.append(dep)
            targets = sorted(i for i in selected if not by_id[i].abort_requested)
            # A direct foreground abort of an owned child also cancels its owner (§6.5);
            # the owner settles once the child's selected work is terminal.
            snapshot = tx.get_conversation(self.id)
            owner_id = None if snapshot is None else snapshot.owner_task_id
            if owner_id is not None and selected:
                owner = tx.get_task(owner_id)
                if owner is not None and owner.live and not owner.abort_requested:
                    targets.append(owner_id)
            for i in targets:
                tx.request_abort(i)
            if targets and services is not None:
                # Foreground abort cancels queued steering/follow-ups in every conversation
                # the selection reaches: this one and those its selected tasks own (their
                # own owned children are selected too, so this recurses); writes and
                # next_run input are preserved (§6.4, §8.2). A repeated abort that marks
                # nothing new joins the outstanding one and drains no new input.
                cancel_queued_inputs(tx, self.id, ("steer", "follow_up"))
                owned = {by_id[i].owned_conversation_id for i in selected} - {None, self.id}
                for cid in sorted(c for c in owned if c is not None):
                    child = tx.get_conversation(cid)
                    deleted = child is not None and child.deleted
                    cancel_queued_inputs(tx, cid, ("steer", "follow_up"), deleted=deleted)
            return targets

        return await self.harness.command(build)

    async def abort_background(self, task_id: int | None = None) -> list[int]:
        """Mark detached background work: a background root (not required by foreground
        work), its unfinished dependencies and all live work in conversations it owns.
        Without ``task_id``, every detached root in this tree. Selected and marked in ONE
        command."""
        check_optional_id(task_id, "task_id")
        scheduler = self.harness.scheduler

        def build(tx: Command) -> list[int]:
            live = scheduler.live_tasks(self.id)
            by_id = {t.id: t for t in live}
            required: set[int] = set()
            chain: dict[int, bool] = {}
            frontier = [t.id for t in live if scheduler.required(t, self.id, chain)]
            while frontier:
                tid = frontier.pop()
                if tid in required:
                    continue
                required.add(tid)
                frontier.extend(d for d in by_id[tid].after if d in by_id)
            # Detached roots: not required, and not inside a detached owner's subtree
            # (that work is selected with its owner, not on its own).
            roots = [
                t
                for t in live
                if t.id not in required
                and scheduler.owned_through_foreground(t.conversation_id, self.id, chain)
            ]
            if task_id is not None:
                roots = [t for t in roots if t.id == task_id]
                if not roots:
                    raise CommandRejectedError(
                        f"task {task_id} is not live detached background work in conversation "
                        f"{self.id}; abort foreground work with conversation.abort()"
                    )
            # Each root, its unfinished dependencies (a schedule's action J) and all live
            # work in the conversations any of them owns (J's child, if it is a subagent).
            selected: set[int] = set()
            cache: dict[int, bool] = {}
            for root in roots:
                stack = [root.id]
                while stack:
                    tid = stack.pop()
                    if tid in selected or tid not in by_id:
                        continue
                    selected.add(tid)
                    task = by_id[tid]
                    stack.extend(task.after)
                    owned = task.owned_conversation_id
                    if owned is not None:
                        stack.extend(
                            t.id for t in live if scheduler.in_tree(t.conversation_id, owned, cache)
                        )
            targets = sorted(i for i in selected if not by_id[i].abort_requested)
            for i in targets:
                tx.request_abort(i)
            return targets

        return await self.harness.command(build)

    async def delete(self) -> None:
        await self.harness.delete_conversation(self.id)

    # ------------------------------------------------------------------ conversation state
    async def get_value(
        self,
        address: ConversationValue[T],
        *,
        as_of: int | None = None,
        default: T | None = None,
    ) -> T | None:
        """The value visible in this conversation (through fork history for rewindable
        addresses); ``as_of`` reads a past main boundary (rewindable addresses only)."""
        return self.harness._reader().get_value(
            address, conversation_id=self.id, as_of=as_of, default=default
        )

    async def get_stored(
        self, address: ConversationValue[T], *, as_of: int | None = None
    ) -> StoredValue[T] | None:
        return self.harness._reader().get_stored(address, conversation_id=self.id, as_of=as_of)

    async def set_value(self, address: ConversationValue[T], value: T) -> None:
        await self.harness.command(lambda tx: tx.set_value(address, value, conversation_id=self.id))

    async def delete_value(self, address: ConversationValue[Any]) -> None:
        await self.harness.command(lambda tx: tx.delete_value(address, conversation_id=self.id))

    async def append_list(self, address: ConversationList[T], value: T) -> int:
        return await self.harness.command(
            lambda tx: tx.append_list(address, value, conversation_id=self.id)
        )

    async def clear_list(self, address: ConversationList[Any]) -> None:
        await self.harness.command(lambda tx: tx.clear_list(address, conversation_id=self.id))

    async def read_list(
        self,
        address: ConversationList[T],
        *,
        after: int | None = None,
        before: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        as_of: int | None = None,
    ) -> Page[ListElement[T]]:
        return self.harness._reader().read_list(
            address,
            conversation_id=self.id,
            after=after,
            before=before,
            order=order,
            limit=limit,
            as_of=as_of,
        )

    async def scan_values(
        self,
        *,
        namespace: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> ValuePage:
        """Current sticky values of this conversation, by address key."""
        return self.harness._reader().scan_values(
            conversation_id=self.id, namespace=namespace, after=after, limit=limit
        )
