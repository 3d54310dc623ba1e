"""The built-in agent flows (§5.4, §8.1, §8.3, §8.4) as task definitions.

One turn: ``accept`` selects the user entry and creates ONE generation in the same commit.
The generation commits streaming intent, projects the context, streams from the model
provider into its working scope, then settles in ONE command: a final answer resolves the
input group; tool calls publish the assistant entry, one task per call and the
``post_tools`` join after all of them. Each tool settles only itself; the join decides
whether the exchange stops, hands off or continues with the next generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pico.application.clock import Clock, SystemClock
from pico.application.command import Command
from pico.application.hooks import Hooks, ToolCall, YieldDecision
from pico.application.model import (
    Deferred,
    Done,
    Message,
    ModelProvider,
    ProviderError,
    Request,
    Response,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolResultPart,
    Usage,
    estimate_tokens,
)
from pico.application.ports import ReadPort
from pico.application.projection import Projection, ProjectionCache, project_context
from pico.application.scheduler import Execution
from pico.application.state import ConversationValue, SessionValue, working_list
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.application.tools import ToolArgumentsError, ToolContext, ToolOutcome, ToolRegistry
from pico.domain.errors import CommandRejectedError
from pico.domain.ids import check_choice
from pico.domain.json import JsonObject, JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = ["AgentServices", "InputResult", "agent_definitions", "input_result_address"]

RESULT_NAMESPACE = "pico.input-result"


def input_result_address(input_id: int) -> SessionValue[Any]:
    # Fixed-width keys keep numeric admission order in bounded key scans (§8.1).
    return SessionValue(namespace=RESULT_NAMESPACE, key=f"{input_id:016d}")


@dataclass(frozen=True)
class InputResult:
    """§8.1: queued | running | done(entry) | placed(entry) | cancelled | failed | stopped."""

    status: str
    entry_id: int | None = None
    reason: str | None = None


@dataclass
class AgentServices:
    provider: ModelProvider
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    model: str = "default"
    system: str = ""
    max_attempts: int = 3
    retry_delay: float = 2.0
    clock: Clock = field(default_factory=SystemClock)
    projection: Projection = field(default_factory=Projection)
    projection_cache: ProjectionCache = field(default_factory=ProjectionCache)
    queue_selection: str = "all"  # or "one": the oldest queued input of each mode
    hooks: Hooks = field(default_factory=Hooks)
    active_tools: list[str] | None = None  # offered at first; None offers every tool
    context_budget: int | None = None  # estimated tokens; over it, collapse before a request


MODES = ("write", "steer", "follow_up", "next_run")
TRIGGERS = ("steer", "follow_up", "next_run")  # modes that request generation


#: Queue values live in namespaces ``pico.queue.<mode>``: contiguous in a key scan.
_QUEUE = "pico.queue."


def queue_address(mode: str, input_id: int) -> ConversationValue[Any]:
    # One sticky value per queued input; fixed-width keys keep admission order in key scans.
    return ConversationValue(
        namespace=f"{_QUEUE}{mode}", key=f"{input_id:016d}", rewind_policy=False
    )


def enqueue(tx: Command, conversation_id: int, mode: str, content: JsonValue) -> int:
    """Busy acceptance: an unselected admission entry, a queue value, result queued."""
    entry = tx.append_entry(conversation_id, "user", content, metadata={"queued": mode})
    with tx.core():
        tx.set_value(queue_address(mode, entry), {"mode": mode}, conversation_id=conversation_id)
    set_results(tx, [entry], {"status": "queued"})
    return entry


def queued(tx: Command, conversation_id: int, modes: Sequence[str]) -> list[tuple[int, str]]:
    """(input id, mode) of queued inputs in the given modes, in admission order: one scan
    over the contiguous ``pico.queue.*`` namespaces of the conversation's values."""
    wanted = set(modes)
    found: list[tuple[int, str]] = []
    after: tuple[str, str] | None = (_QUEUE, "")  # just before every queue namespace
    while after is not None:
        page = tx.scan_values(conversation_id=conversation_id, after=after, limit=500)
        for item in page.items:
            if not item.namespace.startswith(_QUEUE):
                return sorted(found)  # past the queues
            mode = item.namespace[len(_QUEUE) :]
            if mode in wanted:
                found.append((int(item.key or 0), mode))
        after = page.next
    return sorted(found)


def place(
    tx: Command, conversation_id: int, modes: Sequence[str], *, selection: str = "all"
) -> list[int]:
    """Place queued inputs of ``modes`` (all, or the oldest of each mode): a placement entry
    refers to the admission entry (never a copy) and is selected; the queue value is
    deleted. Writes resolve ``placed``; triggers are returned, now ``running``."""
    items = queued(tx, conversation_id, modes)
    if selection == "one":
        seen: set[str] = set()
        items = [(i, m) for i, m in items if not (m in seen or seen.add(m))]  # type: ignore[func-returns-value]
    triggers: list[int] = []
    for input_id, mode in items:  # admission order is preserved
        placement = tx.append_entry(conversation_id, "placement", {"input": input_id})
        tx.append_context(conversation_id, [placement])
        with tx.core():
            tx.delete_value(queue_address(mode, input_id), conversation_id=conversation_id)
        if mode == "write":
            set_results(tx, [input_id], {"status": "placed", "entry_id": placement})
        else:
            set_results(tx, [input_id], {"status": "running"})
            triggers.append(input_id)
    return triggers


def cancel_queued_inputs(
    tx: Command,
    conversation_id: int,
    modes: Sequence[str],
    *,
    reason: str = "aborted",
    deleted: bool = False,
) -> list[int]:
    """Cancel the queued inputs of ``modes`` in one conversation: dequeue each and record
    ``cancelled`` with ``reason``. Admission entries stay in the transcript (§8.1). A
    deleted conversation accepts no writes: only the results are recorded there."""
    items = queued(tx, conversation_id, modes)
    if not deleted:
        with tx.core():
            for input_id, mode in items:
                tx.delete_value(queue_address(mode, input_id), conversation_id=conversation_id)
    cancelled = [input_id for input_id, _ in items]
    if cancelled:
        set_results(tx, cancelled, {"status": "cancelled", "reason": reason})
    return cancelled


def cancel_every_queued_input(tx: Command, reads: ReadPort, *, reason: str) -> list[int]:
    """Cancel every queued input of every mode in every conversation of the session (§6.6
    shutdown). Conversations are enumerated in id pages (no index spans the queue
    namespaces of all conversations), each queue read as ``queued()`` reads it: a seek to
    its ``pico.queue.*`` namespaces, never a scan of history. Run inside the builder, so
    every read shares the command's snapshot."""
    cancelled: list[int] = []
    after: int | None = None
    while True:
        page = reads.scan_conversations(after=after, limit=MAX_CONVERSATION_PAGE)
        for conv in page.items:
            cancelled += cancel_queued_inputs(
                tx, conv.id, MODES, reason=reason, deleted=conv.deleted
            )
        if page.next is None:
            return cancelled
        after = page.next


#: Conversations read per page when shutdown enumerates the session's queues.
MAX_CONVERSATION_PAGE = 1000


def set_results(tx: Command, inputs: Sequence[int], result: JsonObject) -> None:
    with tx.core():  # results live in core-owned session values
        for input_id in inputs:
            tx.set_value(input_result_address(input_id), result)


def _ints(value: JsonValue) -> list[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _state(task: TaskSnapshot) -> dict[str, JsonValue]:
    return dict(task.state) if isinstance(task.state, dict) else {}


class GenerationDefinition(TaskDefinition):
    kind = "generation"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "ready",
        "retry_wait": "ready",
        "deferred": "ready",
        "streaming": "inflight",
        "polling": "inflight",
        "done": "terminal",
        "failed": "terminal",
        "aborted": "terminal",
    }
    transitions = {
        "pending": ["streaming", "failed", "aborted"],
        "retry_wait": ["streaming", "failed", "aborted"],
        "streaming": ["done", "failed", "retry_wait", "deferred", "aborted"],
        "deferred": ["polling", "failed", "aborted"],
        "polling": ["done", "deferred", "failed", "retry_wait", "aborted"],
    }

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = _state(task)
        if task.status == "deferred":
            await self._poll(task, ctx, state)
            return
        request = Request(
            model=str(state.get("model") or self.services.model),
            system=self.services.system,
            messages=tuple(
                project_context(
                    ctx.reads,
                    task.conversation_id,
                    self.services.projection,
                    cache=self.services.projection_cache,
                )
            ),
            tools=self.services.tools.specs(str(t) for t in _ints_or_names(state.get("tools"))),
        )
        if await self._needs_collapse(task, ctx, state, request):
            return  # the generation now waits for its captured collapse
        # Durable intent before the external call (§5.8); clears stale timing/permits.
        await ctx.command(
            lambda tx: tx.patch_task(
                task.id, status="streaming", not_before=None, required_permit=None
            )
        )
        hooks = self.services.hooks
        if hooks.before_request is not None:
            try:  # preparation: fails closed
                request = await hooks.before_request(request)
            except Exception as exc:
                await self._failed_attempt(
                    task,
                    ctx,
                    state,
                    ProviderError(f"the before_request hook raised {exc!r}", kind="fatal"),
                )
                return
            if ctx.cancelled:
                return  # re-check after the hook: an abort suppresses the request
        frames = working_list("pico.frames", str, scope=ctx.working_scope)
        try:
            outcome = await _stream(self.services.provider, request, ctx, frames)
        except ProviderError as error:
            await self._failed_attempt(task, ctx, state, error)
            return
        if outcome is None:
            return  # signalled (abort/close): publish nothing; the abort handler settles
        await hooks.observe_response(outcome)
        await self._settle(task, ctx, state, outcome)

    async def _needs_collapse(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue], request: Request
    ) -> bool:
        """Automatic collapse (§8.3): over the context budget, create the collapse and the
        dependency on it together, once; a captured collapse's outcome is interpreted once
        and never recreated on a retry."""
        budget = self.services.context_budget
        if budget is None or state.get("auto_collapse") is not None:
            return False
        chars = sum(
            len(p.text)
            if isinstance(p, (TextPart, ThinkingPart))
            else len(p.content)
            if isinstance(p, ToolResultPart)
            else 0
            for m in request.messages
            for p in m.parts
        )
        if estimate_tokens(chars) <= budget:
            return False

        def wait(tx: Command) -> None:
            collapse = start_collapse(tx, self.services, task.conversation_id)
            tx.patch_task(
                task.id, state={**state, "auto_collapse": collapse}, after=[*task.after, collapse]
            )

        await ctx.command(wait)
        return True

    async def _poll(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> None:
        handle = state.get("handle")
        assert isinstance(handle, str)
        await ctx.command(lambda tx: tx.patch_task(task.id, status="polling", required_permit=None))
        try:
            outcome = await self.services.provider.poll(handle)
        except ProviderError as error:
            await self._failed_attempt(task, ctx, state, error)
            return
        await self._settle(task, ctx, state, outcome)

    async def _settle(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        outcome: Response | Deferred,
    ) -> None:
        inputs = _ints(state.get("inputs"))
        if isinstance(outcome, Deferred):
            new_state = {
                **state,
                "handle": outcome.handle,
                "usage": _add_usage(state.get("usage"), outcome.usage),
            }
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="deferred", state=new_state, required_permit="deferred-poll"
                )
            )
            return
        message = outcome.message
        content: dict[str, JsonValue] = {"text": message.text}
        thinking = "".join(p.text for p in message.parts if isinstance(p, ThinkingPart))
        if thinking:
            content["thinking"] = thinking
        calls = message.tool_calls
        decision = YieldDecision()
        if not calls and isinstance(outcome, Response):
            decision = await self.services.hooks.decide_yield(outcome)  # outside the line
        usage = _add_usage(state.get("usage"), outcome.usage)
        offered = _ints_or_names(state.get("tools"))

        def settle(tx: Command) -> None:
            cid = task.conversation_id
            if tx.abort_marked(task.id) is not False:
                return  # cancellation won: no normal successor (§6.4)
            if calls:
                content["tool_calls"] = [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                ]
                entry = tx.append_entry(
                    cid,
                    "assistant",
                    content,
                    by_task_id=task.id,
                    metadata={"tool_calls": [c.id for c in calls], "usage": usage},
                )
                tx.append_context(cid, [entry])
                tool_ids = [
                    tx.create_task(
                        cid,
                        "tool",
                        foreground=True,
                        spawned_by=task.id,
                        state={
                            "call_id": c.id,
                            "name": c.name,
                            "arguments": c.arguments,
                            "offered": _json_list(offered),
                            # A call cut off by max_tokens may be unusable: never run it.
                            "truncated": outcome.stop_reason == "max_tokens",
                        },
                    )
                    for c in calls
                ]
                tx.create_task(
                    cid,
                    "post_tools",
                    foreground=True,
                    after=tool_ids,
                    spawned_by=task.id,
                    state=generation_state(self.services, inputs, offered, state),
                )
            else:
                entry = tx.append_entry(
                    cid, "assistant", content, by_task_id=task.id, metadata={"usage": usage}
                )
                tx.append_context(cid, [entry])
                if decision.action == "continue" and not queued(tx, cid, ("steer", "follow_up")):
                    # The yield hook continues the SAME input group (§8.2); queued input
                    # would have taken precedence over this (possibly stale) decision.
                    nudge = tx.append_entry(
                        cid, "user", decision.message, metadata={"yield": True}, by_task_id=task.id
                    )
                    tx.append_context(cid, [nudge])
                    nxt = inputs
                else:
                    set_results(tx, inputs, {"status": "done", "entry_id": entry})
                    # The answer boundary: safe writes, steering and follow-ups start a new
                    # group.
                    nxt = place(
                        tx,
                        cid,
                        ("write", "steer", "follow_up"),
                        selection=self.services.queue_selection,
                    )
                if nxt:
                    tx.create_task(
                        cid,
                        "generation",
                        foreground=True,
                        spawned_by=task.id,
                        state=generation_state(self.services, nxt, offered, state),
                    )
            tx.patch_task(task.id, status="done", state={**state, "usage": usage})
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(settle, defer=True)

    async def _failed_attempt(
        self,
        task: TaskSnapshot,
        ctx: TaskExecution,
        state: dict[str, JsonValue],
        error: ProviderError,
    ) -> None:
        attempt = int(state.get("attempt", 0) or 0) + 1  # type: ignore[arg-type]
        # Known usage commits even for failed, deferred or discarded attempts (§8.3).
        state = {**state, "usage": _add_usage(state.get("usage"), error.usage)}
        if error.kind == "overflow" and not state.get("collapsed"):
            # Overflow: ONE captured collapse, and the SAME generation waits for it (§8.3).
            retry_state = {**state, "attempt": attempt, "collapsed": True}

            def wait_for_collapse(tx: Command) -> None:
                collapse = start_collapse(tx, self.services, task.conversation_id)
                tx.patch_task(
                    task.id,
                    status="retry_wait",
                    state=retry_state,
                    after=[collapse],
                    not_before=None,
                )

            await ctx.command(wait_for_collapse)
            return
        budget = state.get("max_attempts")
        limit = budget if isinstance(budget, int) else self.services.max_attempts
        if error.kind == "retryable" and attempt < limit:
            delay = (
                error.retry_after
                if error.retry_after is not None
                else self.services.retry_delay * attempt
            )
            when = self.services.clock.now() + delay
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id,
                    status="retry_wait",
                    state={**state, "attempt": attempt},
                    not_before=when,
                )
            )
            return
        inputs = _ints(state.get("inputs"))

        def fail(tx: Command) -> None:
            set_results(tx, inputs, {"status": "failed", "reason": str(error)})
            tx.patch_task(
                task.id, status="failed", state={**state, "attempt": attempt, "error": str(error)}
            )
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(fail)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = _state(task)
        if task.status == "polling":  # the handle survives: poll again
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="deferred", required_permit="deferred-poll"
                )
            )
            return
        # An interrupted stream published nothing: retry within the budget, never fabricate.
        await self._failed_attempt(
            task,
            ctx,
            state,
            ProviderError("the stream was interrupted", kind="retryable", retry_after=0.0),
        )

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        inputs = _ints(_state(task).get("inputs"))

        def cancel(tx: Command) -> None:
            set_results(tx, inputs, {"status": "cancelled", "reason": "aborted"})
            tx.patch_task(task.id, status="aborted")
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(cancel)


#: Streamed text is written to the working scope in frames of about this many characters:
#: one working commit per frame, not per token (a bounded buffer, drained before settling).
FRAME_CHARS = 512


async def _stream(
    provider: ModelProvider, request: Request, ctx: TaskExecution, frames: Any
) -> Response | Deferred | None:
    """Consume one provider stream, writing frames to the working scope, racing the
    execution's stop signal: an abort stops streaming at once (None). Frames are buffered:
    a frame of ``FRAME_CHARS`` is written (awaited) as soon as it fills; the rest is
    superseded by the settlement, which carries the whole message."""
    if ctx.signal.is_set():
        return None
    events = provider.stream(request).__aiter__()

    async def consume() -> Response | Deferred:
        buffer: list[str] = []
        buffered = 0
        async for event in events:
            if isinstance(event, TextDelta):
                buffer.append(event.text)
                buffered += len(event.text)
                if buffered >= FRAME_CHARS:
                    await ctx.working(_append_frame(frames, "".join(buffer)))
                    buffer.clear()
                    buffered = 0
            elif isinstance(event, Done):
                # The settlement publishes the whole message and retires this working scope
                # in one command: writing the last partial frame first would be pure waste.
                return event.outcome
        raise ProviderError("the stream ended without a response", kind="retryable")

    # One race for the whole stream, not one per step: the stop signal cancels the
    # consumer wherever it waits, between frames or inside the provider's next step.
    consumer = asyncio.ensure_future(consume())
    stop = asyncio.ensure_future(ctx.signal.wait())
    try:
        await asyncio.wait({consumer, stop}, return_when=asyncio.FIRST_COMPLETED)
        if stop.done() or not consumer.done():
            return None  # stopped: whatever the consumer had is discarded (finally)
        return consumer.result()
    finally:
        stop.cancel()
        if not consumer.done():
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
        closer = getattr(events, "aclose", None)
        if closer is not None:
            await closer()  # best-effort provider cancellation


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
    state = _state(task)
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


def decide_held_approval(tx: Command, task_id: int, decision: str) -> None:
    """The approval channel (§9.1, seed 000): grant lets the held tool run (without asking
    ``before_tool`` again); deny writes its error result. Validated before writing."""
    check_choice(decision, "an approval decision", ("grant", "deny"))
    task = tx.get_task(task_id)
    if task is None or task.kind != "tool" or task.status != "approval":
        raise CommandRejectedError(f"task {task_id} is not a tool call waiting for approval")
    state = _state(task)
    if decision == "grant":
        tx.patch_task(task_id, status="pending", state={**state, "approved": True})
        return
    cid = task.conversation_id
    entry = tx.append_entry(
        cid,
        "tool",
        {"content": "denied by approval", "is_error": True},
        by_task_id=task_id,
        metadata={"tool_call_id": state.get("call_id"), "tool_name": state.get("name")},
    )
    tx.append_context(cid, [entry])
    tx.patch_task(task_id, status="done", state={**state, "result_entry": entry, "approved": False})


def generation_state(
    services: AgentServices,
    inputs: Sequence[int],
    tools: Sequence[str],
    parent: dict[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """A generation's creation state: inputs, offered tools and the captured model and retry
    budget (§8.3), inherited along one exchange."""
    parent = parent or {}
    return {
        "inputs": _json_list(inputs),
        "tools": _json_list(tools),
        "model": parent.get("model") or services.model,
        "max_attempts": parent.get("max_attempts") or services.max_attempts,
    }


def _add_usage(previous: JsonValue, usage: Usage | None) -> JsonValue:
    """Accumulate known usage; unknown (None) adds nothing and is not zero."""
    if usage is None:
        return previous
    base = previous if isinstance(previous, dict) else {}
    total_in = base.get("input", 0)
    total_out = base.get("output", 0)
    return {
        "input": (total_in if isinstance(total_in, int) else 0) + usage.input_tokens,
        "output": (total_out if isinstance(total_out, int) else 0) + usage.output_tokens,
    }


def _control(outcome: ToolOutcome) -> JsonObject:
    """What the join and the audit need from a tool run."""
    usage: JsonValue = (
        None
        if outcome.usage is None
        else {"input": outcome.usage.input_tokens, "output": outcome.usage.output_tokens}
    )
    return {
        "terminate": outcome.terminate,
        "handoff": outcome.handoff,
        "details": outcome.details,
        "usage": usage,
        "add_tools": list[JsonValue](outcome.add_tools),
    }


def _json_list(values: Sequence[int] | Sequence[str]) -> list[JsonValue]:
    return list(values)


def _append_frame(frames: Any, text: str) -> Any:
    def build(wtx: Any) -> None:
        with wtx.tx.core():  # frames live in a core-owned working namespace
            wtx.append_list(frames, text)

    return build


def _ints_or_names(value: JsonValue) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


class ToolTaskDefinition(TaskDefinition):
    kind = "tool"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "ready",
        "approval": "waiting",  # held by before_tool until decide_approval
        "running": "inflight",
        "held": "waiting",  # the tool deferred its result to an outside answer
        "done": "terminal",
        "aborted": "terminal",
    }
    transitions = {
        "pending": ["approval", "running", "done", "aborted"],
        "approval": ["pending", "done", "aborted"],
        "running": ["held", "done", "aborted"],
        "held": ["done", "aborted"],
    }

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = _state(task)
        name = str(state.get("name"))
        if state.get("truncated"):
            await self._result(
                task,
                ctx,
                state,
                "the model's output was truncated before this call was complete; it was not run",
                is_error=True,
            )
            return
        try:
            tool = self.services.tools.authorize(name, _ints_or_names(state.get("offered")))
            args = tool.validate(state.get("arguments"))
        except ToolArgumentsError as exc:  # an error result, never an invocation
            await self._result(task, ctx, state, str(exc), is_error=True)
            return
        call = ToolCall(task.id, str(state.get("call_id")), name, args)
        if not state.get("approved"):
            decision = await self.services.hooks.decide_tool(call)  # outside the line
            if decision.action == "block":
                await self._result(task, ctx, state, decision.result or "blocked", is_error=True)
                return
            if decision.action == "hold":
                await ctx.command(lambda tx: tx.patch_task(task.id, status="approval"))
                return
            if decision.arguments is not None:
                try:  # a transformation is revalidated before it is used
                    args = tool.validate(decision.arguments)
                except ToolArgumentsError as exc:
                    await self._result(task, ctx, state, str(exc), is_error=True)
                    return
        # Persist the effective arguments and replay decision BEFORE invocation (§8.4).
        running: dict[str, JsonValue] = {**state, "arguments": args, "replay": tool.replay}
        await ctx.command(lambda tx: tx.patch_task(task.id, status="running", state=running))
        frames = working_list("pico.tool-output", str, scope=ctx.working_scope)

        async def admit(text: str) -> None:  # progress is awaited: explicit backpressure
            await ctx.working(_append_frame(frames, text))

        tool_ctx = ToolContext(call_id=call.call_id, tool_name=name, signal=ctx.signal, sink=admit)
        outcome = await tool.run(args, tool_ctx)
        if outcome.deferred and not outcome.is_error:
            # The answer will come from outside: park durably (seed 000).
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="held", state={**running, "held": outcome.text}
                )
            )
            return
        outcome = await self.services.hooks.process_tool(call, outcome)
        await self._result(
            task,
            ctx,
            running,
            outcome.text,
            is_error=outcome.is_error,
            control=_control(outcome),
            images=outcome.images,
        )

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
        state = _state(task)
        if task.status in ("held", "approval"):
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
            await self._result(task, ctx, state, "the tool is no longer registered", is_error=True)
            return
        outcome = await tool.run(
            state.get("arguments"),
            ToolContext(call_id=str(state.get("call_id")), tool_name=tool.name, signal=ctx.signal),
        )
        await self._result(
            task,
            ctx,
            state,
            outcome.text,
            is_error=outcome.is_error,
            control=_control(outcome),
            images=outcome.images,
        )

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        await self._result(task, ctx, _state(task), "aborted", is_error=True, status="aborted")


class PostToolsDefinition(TaskDefinition):
    kind = "post_tools"
    initial_status = "pending"
    roles: dict[str, Role] = {"pending": "ready", "done": "terminal", "aborted": "terminal"}
    transitions = {"pending": ["done", "aborted"]}

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = _state(task)
        inputs = _ints(state.get("inputs"))

        def join(tx: Command) -> None:  # ONE command reads all outcomes and decides
            if tx.abort_marked(task.id) is not False:
                return
            found = tx.get_tasks(task.after)  # every tool outcome in one read
            tools = [found[i] for i in task.after if i in found]
            cid = task.conversation_id
            if any(isinstance(t.state, dict) and t.state.get("terminate") for t in tools):
                set_results(tx, inputs, {"status": "stopped", "reason": "a tool terminated"})
            else:
                handoffs = [
                    t.state.get("handoff")
                    for t in tools
                    if isinstance(t.state, dict) and t.state.get("handoff") is not None
                ]
                if len(handoffs) == 1:  # conflicting handoffs reject the handoff
                    entry = tx.append_entry(cid, "handoff", handoffs[0], by_task_id=task.id)
                    tx.reset_context(cid, [entry])
                # The tool boundary: safe writes and steering join the current input group.
                steering = place(
                    tx, cid, ("write", "steer"), selection=self.services.queue_selection
                )
                offered_next = _ints_or_names(state.get("tools"))
                for t in tools:  # active-tool additions from this exchange
                    added = t.state.get("add_tools") if isinstance(t.state, dict) else None
                    for name in added if isinstance(added, list) else []:
                        if isinstance(name, str) and name not in offered_next:
                            offered_next.append(name)
                tx.create_task(
                    cid,
                    "generation",
                    foreground=True,
                    spawned_by=task.id,
                    state=generation_state(
                        self.services, [*inputs, *steering], offered_next, state
                    ),
                )
            tx.patch_task(task.id, status="done")

        await ctx.command(join, defer=True)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        await self.execute(task, ctx)

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        inputs = _ints(_state(task).get("inputs"))

        def cancel(tx: Command) -> None:
            set_results(tx, inputs, {"status": "cancelled", "reason": "aborted"})
            tx.patch_task(task.id, status="aborted")

        await ctx.command(cancel)


def agent_definitions(services: AgentServices) -> list[TaskDefinition]:
    return [
        CollapseDefinition(services),
        GenerationDefinition(services),
        ToolTaskDefinition(services),
        PostToolsDefinition(services),
    ]


class CollapseDefinition(TaskDefinition):
    """Collapse (§8.5): summarize a complete context prefix and publish the summary in
    place of it, speculatively: the summary is computed while the conversation may be busy,
    then published only when the context is editable and its prefix unchanged."""

    kind = "collapse"
    initial_status = "pending"
    roles: dict[str, Role] = {
        "pending": "ready",
        "summarizing": "inflight",
        "parked": "waiting",  # a complete candidate waits for an editable context
        "done": "terminal",
        "stale": "terminal",
        "declined": "terminal",
        "failed": "terminal",
        "aborted": "terminal",
    }
    transitions = {
        "pending": ["summarizing", "declined", "failed", "aborted"],
        "summarizing": ["parked", "done", "stale", "failed", "aborted"],
        "parked": ["done", "stale", "aborted"],
    }

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = _state(task)
        cid = task.conversation_id
        decision = await self.services.hooks.decide_collapse(cid)  # outside the line
        if decision.action == "decline":
            await ctx.command(lambda tx: tx.patch_task(task.id, status="declined"))
            return
        snapshot = ctx.reads.get_conversations([cid]).get(cid)
        through = _cut_point(ctx.reads, snapshot.context if snapshot else ())
        if snapshot is None or through is None:
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="stale", state={**state, "reason": "nothing to collapse"}
                )
            )
            return
        captured: dict[str, JsonValue] = {
            **state,
            "through": through,
            "revision": snapshot.prefix_revision,
        }
        await ctx.command(lambda tx: tx.patch_task(task.id, status="summarizing", state=captured))
        prefix = list(snapshot.context[: snapshot.context.index(through) + 1])
        found = ctx.reads.get_entries(prefix)
        messages = self.services.projection.messages([found[i] for i in prefix if i in found], {})
        ask = "Summarize the conversation so far so it can replace it. " + (
            decision.instructions or str(state.get("instructions") or "")
        )
        request = Request(
            model=str(state.get("model") or self.services.model),
            system=self.services.system,
            messages=(*messages, Message("user", (TextPart(ask),))),
        )
        try:
            outcome = await _stream(
                self.services.provider,
                request,
                ctx,
                working_list("pico.frames", str, scope=ctx.working_scope),
            )
        except ProviderError as error:
            failed = {**captured, "error": str(error), "usage": _add_usage(None, error.usage)}
            await ctx.command(lambda tx: tx.patch_task(task.id, status="failed", state=failed))
            return
        if not isinstance(outcome, Response):
            return  # signalled, or deferred (not supported for summaries): the abort settles
        summary = outcome.message.text
        parked = {**captured, "summary": summary, "usage": _add_usage(None, outcome.usage)}
        await self._publish(task, ctx, parked)

    async def _publish(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> None:
        cid = task.conversation_id

        def publish(tx: Command) -> str:
            snap = tx.get_conversation(cid)
            through = state.get("through")
            if (
                snap is None
                or snap.prefix_revision != state.get("revision")
                or through not in snap.context
            ):
                tx.patch_task(task.id, status="stale", state=state)  # a competing edit won
                return "stale"
            if not _editable(tx, cid):
                current = tx.get_task(task.id)
                if current is not None and current.status != "parked":
                    tx.patch_task(task.id, status="parked", state=state)
                return "parked"
            entry = tx.append_entry(
                cid,
                "summary",
                state.get("summary"),
                by_task_id=task.id,
                metadata={"collapsed_through": through},
            )
            assert isinstance(through, int)
            revision = state.get("revision")
            assert isinstance(revision, int)
            tx.replace_context_prefix(cid, through, [entry], expected_revision=revision)
            tx.patch_task(task.id, status="done", state={**state, "summary_entry": entry})
            tx.retire_working_scope(ctx.working_scope)
            return "done"

        outcome = await ctx.command(publish)
        if outcome == "parked":
            self._observe(task, ctx)

    def _observe(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        # The observer listens to the scheduler's own task-change notifications, which
        # only pico's Execution reaches (this library definition runs under it, always).
        assert isinstance(ctx, Execution)
        scheduler = ctx._scheduler

        def subscribe(notify: Any) -> Any:
            listener = lambda: notify("changed")  # noqa: E731
            scheduler.listeners.add(listener)
            return lambda: scheduler.listeners.discard(listener)

        async def reconcile(event: Any, rctx: TaskExecution) -> None:
            current = rctx.current()
            if current.status == "parked":
                await self._publish(current, rctx, _state(current))

        ctx.observe(subscribe, reconcile)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        if task.status == "parked":  # a durable complete candidate: re-arm the predicate
            self._observe(task, ctx)
            return
        # Interrupted while summarizing: nothing was published; try again from the start.
        await ctx.command(
            lambda tx: tx.patch_task(
                task.id, status="failed", state={**_state(task), "error": "interrupted"}
            )
        )

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        def cancel(tx: Command) -> None:
            tx.patch_task(task.id, status="aborted")
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(cancel)


def _editable(tx: Command, conversation_id: int) -> bool:
    """No provider request in flight and no unresolved tool exchange in the conversation."""
    live = tx.scan_tasks(conversation_ids=[conversation_id], live=True, limit=1000).items
    return not any(
        (t.kind == "generation" and t.status in ("streaming", "polling")) or t.kind == "tool"
        for t in live
    )


def _cut_point(reads: Any, context: Sequence[int]) -> int | None:
    """The last context element before the most recent user turn at which no tool call is
    open: the prefix through it can be replaced without splitting an exchange."""
    if len(context) < 3:
        return None
    headers = reads.get_entries(list(context), content=False)
    open_calls: set[str] = set()
    cut: int | None = None
    for entry_id in context[:-2]:  # keep the latest exchange selected
        meta = headers[entry_id].metadata or {} if entry_id in headers else {}
        answered = meta.get("tool_call_id")
        if isinstance(answered, str):
            open_calls.discard(answered)
        calls = meta.get("tool_calls")
        if isinstance(calls, list):
            open_calls.update(str(c) for c in calls)
        if not open_calls:
            cut = entry_id
    return cut


def start_collapse(
    tx: Command, services: AgentServices, conversation_id: int, instructions: str = ""
) -> int:
    """One live collapse per conversation: return the existing one, or create it."""
    live = tx.scan_tasks(
        conversation_ids=[conversation_id], live=True, kind="collapse", limit=1
    ).items
    if live:
        return live[0].id
    return tx.create_task(
        conversation_id,
        "collapse",
        foreground=True,
        state={"instructions": instructions, "model": services.model},
    )
