"""Tool execution (§8.4), its approval hold (§8.6) and the outside answers to a held call
(seed 000).

    status              role        transitions
    pending             ready       -> awaiting_approval | running | done | aborted
    awaiting_approval   waiting     -> pending | finishing | aborted   (after:[approval A])
    finishing           ready       -> done | aborted     (the outcome came from elsewhere)
    running             inflight    -> held | finishing | done | aborted
    held                waiting     -> done | aborted     (the tool deferred its result)
    approval            waiting     legacy: held with no approval task; recovery migrates it
    done, aborted                   terminal

A tool task validates and authorizes its call, persists the effective arguments and replay
decision before invoking, and settles only itself with one tool result entry; the join
(``join.py``) reads every outcome. A call held by ``before_tool`` waits on an approval task
(``approval.py``); a grant makes it ``pending`` again with the approved arguments, a denial
makes it ``finishing``: its state says what it finishes from (``{"finish": {"denied": ...}}``)
and ``_finish`` runs the result hooks and writes its result. A tool that returns a
``ToolDelegation`` continues as a subagent (``subagent.py``): foreground, the call is
``finishing`` after the owner S (``{"finish": {"subagent": S}}``) and its result is the
child's answer; background, its result names S at once. A ``JobDelegation`` continues as a
job (``job.py``) the same way: ``{"finish": {"job": J}}`` and its result is how the process
ended with the tails of its output, or a result naming J at once. ``answer_held_call`` moves
``held`` to ``done``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from pico.application.command import Command
from pico.application.flows.approval import AWAITING_APPROVAL, LEGACY_APPROVAL, hold, migrate
from pico.application.flows.common import AgentServices, append_frame, names, task_state
from pico.application.flows.job import create_job, job_outcome_text, job_spec
from pico.application.flows.subagent import launch, offered_tools
from pico.application.hooks import ToolCall
from pico.application.state import working_list
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.application.tools import (
    OUTPUT_CAP,
    TRUNCATED,
    JobDelegation,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolDelegation,
    ToolOutcome,
)
from pico.domain.errors import CommandRejectedError, PicoError
from pico.domain.json import JsonObject, JsonValue, strict_json
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = [
    "ToolCallAnsweredError",
    "ToolTaskDefinition",
    "answer_held_call",
    "no_longer_offered",
]


class ToolTaskDefinition(TaskDefinition):
    kind = "tool"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "ready",
        AWAITING_APPROVAL: "waiting",  # after:[A] until A is decided
        "finishing": "ready",  # writes the outcome its state names (``_finish``)
        LEGACY_APPROVAL: "waiting",  # stored before approvals were tasks; recover migrates
        "running": "inflight",
        "held": "waiting",  # the tool deferred its result to an outside answer
        "done": "terminal",
        "aborted": "terminal",
    }
    transitions = {
        "pending": [AWAITING_APPROVAL, "running", "done", "aborted"],
        AWAITING_APPROVAL: ["pending", "finishing", "aborted"],
        "finishing": ["done", "aborted"],
        LEGACY_APPROVAL: [AWAITING_APPROVAL, "pending", "finishing", "done", "aborted"],
        "running": ["held", "finishing", "done", "aborted"],
        "held": ["done", "aborted"],
    }

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        name = str(state.get("name"))
        if task.status == "finishing":
            await self._finish(task, ctx, state)
            return
        if state.get("truncated"):
            await self._result(
                task,
                ctx,
                state,
                "the model's output was truncated before this call was complete; it was not run",
                is_error=True,
            )
            return
        if state.get("unusable"):
            await self._result(
                task,
                ctx,
                state,
                f"the model's arguments for this call could not be used ({state['unusable']});"
                " it was not run",
                is_error=True,
            )
            return
        if self.services.tools.get(name) is None and name in names(state.get("offered")):
            # The resume gate's tools class: the tool set changed since the call was made.
            await self._result(task, ctx, state, no_longer_offered(name), is_error=True)
            return
        try:
            tool = self.services.tools.authorize(name, names(state.get("offered")))
            args = tool.validate(state.get("arguments"))
        except ToolArgumentsError as exc:  # an error result, never an invocation
            await self._result(task, ctx, state, str(exc), is_error=True)
            return
        call = ToolCall(task.id, str(state.get("call_id")), name, args)
        # ``args`` is what validate returned, unless a hook saw it: a before_tool hook may
        # edit the call's arguments in place, so the invocation then validates them again.
        checked = True
        if not state.get("approved"):
            checked = self.services.hooks.before_tool is None
            decision = await self.services.hooks.decide_tool(call)  # outside the line
            if decision.action == "block":
                await self._result(task, ctx, state, decision.result or "blocked", is_error=True)
                return
            if decision.arguments is not None:
                try:  # a transformation is revalidated before it is used (or approved)
                    args = tool.validate(decision.arguments)
                    checked = True  # a fresh copy: the hook holds none of it
                except ToolArgumentsError as exc:
                    await self._result(task, ctx, state, str(exc), is_error=True)
                    return
            if decision.action == "hold":  # ONE command: { create approval A; tool after:[A] }
                reason = decision.result
                await ctx.command(lambda tx: hold(tx, task, args, reason))
                return
        # Persist the effective arguments and replay decision BEFORE invocation (§8.4).
        running: dict[str, JsonValue] = {**state, "arguments": args, "replay": tool.replay}
        await ctx.command(lambda tx: tx.patch_task(task.id, status="running", state=running))
        frames = working_list("pico.tool-output", str, scope=ctx.working_scope)

        async def admit(text: str) -> None:  # progress is awaited: explicit backpressure
            await ctx.working(append_frame(frames, text))

        tool_ctx = ToolContext(call_id=call.call_id, tool_name=name, signal=ctx.signal, sink=admit)
        outcome = await self._run(tool, args, tool_ctx, ctx, validated=checked)
        if outcome.delegation is not None:  # the call continues as a subagent (§5.5)
            await self._delegate(task, ctx, running, outcome.delegation)
            return
        if outcome.deferred and not outcome.is_error:
            # The answer will come from outside: park durably (seed 000).
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="held", state={**running, "held": outcome.text}
                )
            )
            return
        await self._processed(task, ctx, running, call, outcome)

    async def _processed(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        call: ToolCall,
        outcome: ToolOutcome,
    ) -> None:
        """Run the result hooks (``after_tool``) on an outcome, then write it as the call's
        result and settle."""
        outcome = await self.services.hooks.process_tool(call, outcome)
        await self._result(
            task,
            ctx,
            state,
            outcome.text,
            is_error=outcome.is_error,
            control=_control(outcome),
            images=outcome.images,
        )

    async def _delegate(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        delegation: ToolDelegation | JobDelegation,
    ) -> None:
        """§5.5, §5.6: launch the subagent (or job) and move this call on, in ONE command.
        Foreground: ``{ create S; tool finishing after:[S] }``, and ``_finish`` reads S's
        result once S settles. Background: ``{ create S; tool result naming S; settle }``.
        A launch the subagent flow would refuse (an unregistered tool, a list in the
        values) is this call's error result instead; nothing is created."""
        services = self.services
        what = "job" if isinstance(delegation, JobDelegation) else "subagent"
        try:
            if isinstance(delegation, JobDelegation):
                jobs = services.jobs
                if jobs is None:
                    raise CommandRejectedError("this harness runs no jobs")
                jobs.get_host()  # ConfigurationError where no host can run
                spec = job_spec(
                    delegation.argv,
                    cwd=delegation.cwd,
                    env=delegation.env,
                    log_cap=delegation.log_cap,
                    grace=delegation.grace,
                )
            else:  # by default the tools a new input is offered, without this tool
                tools = offered_tools(services, delegation.tools, without=str(state.get("name")))
        except PicoError as exc:
            await self._result(
                task, ctx, state, f"the delegation was refused: {exc}", is_error=True
            )
            return

        def start(tx: Command) -> None:
            if tx.abort_marked(task.id) is not False:
                return  # cancellation won: the abort handler writes the call's result
            cid = task.conversation_id
            if isinstance(delegation, JobDelegation):
                assert jobs is not None
                owner = create_job(
                    tx,
                    jobs,
                    cid,
                    spec,
                    foreground=not delegation.background,
                    spawned_by=task.id,
                )
            else:
                owner = launch(
                    tx,
                    services,
                    cid,
                    delegation.prompt,
                    context=delegation.context,
                    values=delegation.values,
                    tools=tools,
                    foreground=not delegation.background,
                    spawned_by=task.id,
                )
            if not delegation.background:
                tx.patch_task(
                    task.id,
                    status="finishing",
                    after=[owner],
                    state={**state, "finish": {what: owner}},
                )
                return
            details: JsonObject = {what: owner}
            if what == "subagent":
                child = tx.get_task(owner)
                details["conversation"] = None if child is None else child.owned_conversation_id
            text = f"started {what} task {owner} in the background"
            entry = tx.append_entry(
                cid,
                "tool",
                {"content": text, "is_error": False},
                by_task_id=task.id,
                metadata={"tool_call_id": state.get("call_id"), "tool_name": state.get("name")},
            )
            tx.append_context(cid, [entry])
            control = {**_control(ToolOutcome(text=text)), "details": details}
            tx.patch_task(task.id, status="done", state={**state, "result_entry": entry, **control})

        await ctx.command(start)

    def _subagent_outcome(self, ctx: TaskExecution, owner_id: int) -> ToolOutcome:
        """A foreground delegation's result: the child's final answer text (capped like any
        tool output), or an error result naming why there is none."""
        owner = ctx.task(owner_id)
        state = task_state(owner) if owner is not None else {}
        result = state.get("result")
        result = result if isinstance(result, dict) else {}
        details: JsonObject = {
            "subagent": owner_id,
            "conversation": None if owner is None else owner.owned_conversation_id,
            "status": None if owner is None else owner.status,
        }
        if owner is None or owner.live:
            return ToolOutcome(text=f"subagent task {owner_id} has no outcome", is_error=True)
        entry_id = result.get("entry_id")
        if owner.status == "done" and isinstance(entry_id, int):
            entry = ctx.reads.get_entries([entry_id]).get(entry_id)
            content = entry.content if entry is not None else None
            text = content.get("text") if isinstance(content, dict) else None
            if isinstance(text, str):
                if len(text) > OUTPUT_CAP:
                    text = text[:OUTPUT_CAP] + TRUNCATED
                details["entry_id"] = entry_id
                return ToolOutcome(text=text, details=details)
        reason = result.get("reason")
        why = f": {reason}" if isinstance(reason, str) and reason else ""
        words = {"aborted": "was cancelled", "stopped": "stopped", "failed": "failed"}
        text = f"the subagent {words.get(owner.status, 'ended without an answer')}{why}"
        return ToolOutcome(text=text, is_error=owner.status != "stopped", details=details)

    def _job_outcome(self, ctx: TaskExecution, job_id: int) -> ToolOutcome:
        """A foreground job's result: how it ended and its output's tails (capped)."""
        job = ctx.task(job_id)
        if job is None or job.live:
            return ToolOutcome(text=f"job task {job_id} has no outcome", is_error=True)
        text, is_error = job_outcome_text(job)
        if len(text) > OUTPUT_CAP:
            text = text[:OUTPUT_CAP] + TRUNCATED
        return ToolOutcome(
            text=text, is_error=is_error, details={"job": job_id, "status": job.status}
        )

    async def _finish(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> None:
        """The ``finishing`` phase: the outcome came from elsewhere, named by
        ``state["finish"]``: ``{"denied": reason}`` (an approval's denial) or
        ``{"subagent": S}`` (a foreground delegation, read once S settled). The result
        hooks process it and the tool writes its own result and settles, as after a run."""
        source = state.get("finish")
        denied = source.get("denied") if isinstance(source, dict) else None
        subagent = source.get("subagent") if isinstance(source, dict) else None
        job = source.get("job") if isinstance(source, dict) else None
        if isinstance(denied, str):
            outcome = ToolOutcome(text=denied, is_error=True)
        elif isinstance(subagent, int):
            outcome = self._subagent_outcome(ctx, subagent)
        elif isinstance(job, int):
            outcome = self._job_outcome(ctx, job)
        else:  # a source this version does not know: never a fabricated success
            outcome = ToolOutcome(text=f"the tool cannot finish from {source!r}", is_error=True)
        await self._processed(task, ctx, state, _stored_call(task, state), outcome)

    async def _result(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        text: str,
        *,
        is_error: bool,
        control: JsonObject | None = None,
        status: str = "done",
        images: Sequence[JsonObject] = (),
    ) -> None:
        content: dict[str, JsonValue] = {"content": text, "is_error": is_error}
        if images:
            content["images"] = list[JsonValue](images)

        def settle(tx: Command) -> None:  # a tool settles only itself
            cid = task.conversation_id
            entry = tx.append_entry(
                cid,
                "tool",
                content,
                by_task_id=task.id,
                metadata={"tool_call_id": state.get("call_id"), "tool_name": state.get("name")},
            )
            tx.append_context(cid, [entry])
            tx.patch_task(
                task.id, status=status, state={**state, "result_entry": entry, **(control or {})}
            )

        await ctx.command(settle, defer=True)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        if task.status == LEGACY_APPROVAL:  # migrate, never grant: { create A; after:[A] }
            await ctx.command(lambda tx: migrate(tx, task.id))
            return
        if task.status in ("held", AWAITING_APPROVAL):
            return  # waiting for an outside answer or decision; nothing to arm
        if task.status == "running" and state.get("replay") == "safe":
            await self._rerun(task, ctx, state)  # replay allowed by the captured policy
            return
        if task.status == "pending":
            await self.execute(task, ctx)
            return
        await self._result(
            task,
            ctx,
            state,
            "the tool was interrupted; it may or may not have completed",
            is_error=True,
        )

    async def _rerun(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> None:
        tool = self.services.tools.get(str(state.get("name")))
        if tool is None:
            message = no_longer_offered(str(state.get("name")))
            await self._result(task, ctx, state, message, is_error=True)
            return
        replay = ToolContext(
            call_id=str(state.get("call_id")), tool_name=tool.name, signal=ctx.signal
        )
        outcome = await self._run(tool, state.get("arguments"), replay, ctx, validated=False)
        # A replayed run's result passes the result hooks like the first run's would have.
        await self._processed(task, ctx, state, _stored_call(task, state), outcome)

    async def _run(
        self,
        tool: Tool,
        args: JsonValue,
        tool_ctx: ToolContext,
        ctx: TaskExecution,
        *,
        validated: bool,
    ) -> ToolOutcome:
        """One invocation (a first run or a replay) in its ``execute_tool`` span. A first
        run's arguments were just validated and persisted, and the tool gets its own copy
        (what it does to them never reaches the task's state); a replay's stored ones are
        validated again, against the tool as it is now."""
        telemetry = self.services.telemetry
        with telemetry.tool(tool.name, tool_ctx.call_id) as span:
            if validated and isinstance(args, dict):
                copy = cast(JsonObject, strict_json(args, what=f"arguments of {tool.name!r}"))
                outcome = await tool.invoke(copy, tool_ctx)
            else:
                outcome = await tool.run(args, tool_ctx)
            telemetry.tool_outcome(span, outcome, interrupted=ctx.signal.is_set())
        return outcome

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        await self._result(task, ctx, task_state(task), "aborted", is_error=True, status="aborted")


def no_longer_offered(name: str) -> str:
    """The error result of a live call whose tool was removed (the resume gate, tools
    class): never an invocation of another tool."""
    return (
        f"tool {name!r} is no longer offered: it was removed from the harness's tools after "
        "this call was made, so it was not run"
    )


def _stored_call(task: TaskSnapshot, state: dict[str, JsonValue]) -> ToolCall:
    """The call as the task stored it (its effective arguments), for the result hooks."""
    arguments = state.get("arguments")
    return ToolCall(
        task.id,
        str(state.get("call_id")),
        str(state.get("name")),
        arguments if isinstance(arguments, dict) else {},
    )


def _control(outcome: ToolOutcome) -> JsonObject:
    """What the join and the audit need from a tool run."""
    usage: JsonValue = None if outcome.usage is None else outcome.usage.as_json()
    return {
        "terminate": outcome.terminate,
        "handoff": outcome.handoff,
        "details": outcome.details,
        "usage": usage,
        "add_tools": list[JsonValue](outcome.add_tools),
    }


class ToolCallAnsweredError(CommandRejectedError):
    """The held tool call was answered already; its first answer landed."""

    def __init__(self, task_id: int, entry_id: int | None) -> None:
        self.task_id = task_id
        self.entry_id = entry_id
        super().__init__(
            f"tool task {task_id} was already answered (result entry {entry_id}); the first "
            "answer landed and a second one is refused"
        )


def answer_held_call(tx: Command, task_id: int, text: str, is_error: bool) -> int:
    """Seed 000, "Answering a deferred call": validate, then write ONE ordinary tool result
    and settle the tool, so the join continues as after any tool."""
    task = tx.get_task(task_id)
    if task is None or task.kind != "tool":
        raise CommandRejectedError(f"task {task_id} is not a tool call of this session")
    state = task_state(task)
    if not task.live:
        entry = state.get("result_entry")
        raise ToolCallAnsweredError(task_id, entry if isinstance(entry, int) else None)
    if task.status != "held":
        raise CommandRejectedError(
            f"tool task {task_id} is {task.status!r}, not waiting for an outside answer"
        )
    cid = task.conversation_id
    entry = tx.append_entry(
        cid,
        "tool",
        {"content": text, "is_error": is_error},
        by_task_id=task_id,
        metadata={
            "tool_call_id": state.get("call_id"),
            "tool_name": state.get("name"),
            "answered": True,
        },
    )
    tx.append_context(cid, [entry])
    tx.patch_task(task_id, status="done", state={**state, "result_entry": entry})
    return entry
