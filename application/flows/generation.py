"""Generation (§8.3): one model request of an input group, as a task definition.

    status      role        transitions
    pending     ready       -> streaming | failed | aborted
    retry_wait  ready       -> streaming | failed | aborted
    streaming   inflight    -> done | failed | retry_wait | deferred | aborted
    deferred    ready       -> polling | failed | aborted
    polling     inflight    -> done | deferred | failed | retry_wait | aborted
    done, failed, aborted   terminal

``accept`` selects the user entry and creates ONE generation in the same commit. The
generation commits streaming intent, projects the context, streams from the model provider
into its working scope, then settles in ONE command: a final answer resolves the input
group and places queued input (§8.2); tool calls publish the assistant entry, one tool task
per call and the ``post_tools`` join after all of them (``tool.py``, ``join.py``). The calls
run in parallel unless the captured ``tool_execution`` policy is ``"sequential"`` or a tool
is ``sequential``: then ``after`` edges chain them in call order (``tool_dependencies``, §5.4).
Over the context budget, or on overflow, it waits for one captured collapse
(``collapse.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pico.application.command import Command
from pico.application.flows.collapse import start_collapse
from pico.application.flows.common import (
    AgentServices,
    captured_options,
    ints,
    json_list,
    names,
    request_options,
    task_state,
)
from pico.application.flows.inputs import place, queued, set_results
from pico.application.flows.owner import cancel_input_group, settle_owner
from pico.application.flows.streaming import add_usage, stream_response
from pico.application.hooks import YieldDecision
from pico.application.model import (
    Deferred,
    ProviderError,
    Request,
    Response,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    estimate_tokens,
)
from pico.application.projection import project_context
from pico.application.state import working_list
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.json import JsonObject, JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = ["GenerationDefinition", "generation_state", "tool_dependencies"]

#: Failed attempts (debug), retries scheduled and generations that failed (info):
#: the provider's classified message, never the request's content (docs/telemetry.md).
log = logging.getLogger("pico.provider")


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
        state = task_state(task)
        if task.status == "deferred":
            await self._poll(task, ctx, state)
            return
        request = Request(
            model=str(state.get("model") or self.services.model),
            system=self.services.system,
            messages=project_context(
                ctx.reads,
                task.conversation_id,
                self.services.projection,
                cache=self.services.projection_cache,
            ),
            tools=self.services.tools.specs(str(t) for t in names(state.get("tools"))),
            settings=captured_options(state),
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
            outcome = await stream_response(
                self.services.provider, request, ctx, frames, self.services.telemetry
            )
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
        inputs = ints(state.get("inputs"))
        if isinstance(outcome, Deferred):
            new_state = {
                **state,
                "handle": outcome.handle,
                "usage": add_usage(state.get("usage"), outcome.usage),
            }
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="deferred", state=new_state, required_permit="deferred-poll"
                )
            )
            return
        message = outcome.message
        content: dict[str, JsonValue] = {"text": message.text}
        blocks = [p for p in message.parts if isinstance(p, ThinkingPart)]
        thinking = "".join(p.text for p in blocks)
        if thinking:
            content["thinking"] = thinking
        if any(p.signature for p in blocks):  # signed thinking goes back block by block
            content["thinking_blocks"] = [
                {"text": p.text, "signature": p.signature} for p in blocks
            ]
        calls = message.tool_calls
        decision = YieldDecision()
        if not calls and isinstance(outcome, Response):
            decision = await self.services.hooks.decide_yield(outcome)  # outside the line
        usage = add_usage(state.get("usage"), outcome.usage)
        offered = names(state.get("tools"))
        chain = tool_dependencies(
            [
                state.get("tool_execution") == "sequential"
                or getattr(self.services.tools.get(c.name), "sequential", False)
                for c in calls
            ]
        )

        def settle(tx: Command) -> None:
            cid = task.conversation_id
            if tx.abort_marked(task.id) is not False:
                return  # cancellation won: no normal successor (§6.4)
            if calls:
                content["tool_calls"] = [_call_json(c) for c in calls]
                entry = tx.append_entry(
                    cid,
                    "assistant",
                    content,
                    by_task_id=task.id,
                    metadata={"tool_calls": [c.id for c in calls], "usage": usage},
                )
                tx.append_context(cid, [entry])
                tool_ids: list[int] = []
                for c, earlier in zip(calls, chain, strict=True):
                    tool_ids.append(
                        tx.create_task(
                            cid,
                            "tool",
                            foreground=True,
                            after=[tool_ids[i] for i in earlier],
                            spawned_by=task.id,
                            state={
                                "call_id": c.id,
                                "name": c.name,
                                "arguments": c.arguments,
                                "offered": json_list(offered),
                                # A call cut off by max_tokens may be unusable: never run it.
                                "truncated": outcome.stop_reason == "max_tokens",
                                **({"unusable": c.unusable} if c.unusable else {}),
                            },
                        )
                    )
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
                    tx.create_task(
                        cid,
                        "generation",
                        foreground=True,
                        spawned_by=task.id,
                        state=generation_state(self.services, inputs, offered, state),
                    )
                else:
                    set_results(tx, inputs, {"status": "done", "entry_id": entry})
                    if not self._answer_boundary(tx, task, state):
                        settle_owner(tx, cid, {"status": "done", "entry_id": entry})
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
        log.debug(
            "generation task %d: attempt %d failed (%s): %s", task.id, attempt, error.kind, error
        )
        # Known usage commits even for failed, deferred or discarded attempts (§8.3).
        state = {**state, "usage": add_usage(state.get("usage"), error.usage)}
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
            log.info("generation task %d: retry %d in %.1fs (%s)", task.id, attempt, delay, error)
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id,
                    status="retry_wait",
                    state={**state, "attempt": attempt},
                    not_before=when,
                )
            )
            return
        inputs = ints(state.get("inputs"))
        log.info("generation task %d failed after %d attempt(s): %s", task.id, attempt, error)

        def fail(tx: Command) -> None:
            set_results(tx, inputs, {"status": "failed", "reason": str(error)})
            settle_owner(tx, task.conversation_id, {"status": "failed", "reason": str(error)})
            tx.patch_task(
                task.id, status="failed", state={**state, "attempt": attempt, "error": str(error)}
            )
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(fail)

    def _answer_boundary(
        self, tx: Command, task: TaskSnapshot, state: dict[str, JsonValue]
    ) -> bool:
        """After the input group is resolved: safe writes, steering and follow-ups start a
        new group, with a generation of its own (§8.2). False when nothing follows: the
        terminal foreground boundary, which settles a subagent owner (§8.6)."""
        cid = task.conversation_id
        nxt = place(
            tx, cid, ("write", "steer", "follow_up"), selection=self.services.queue_selection
        )
        if nxt:
            tx.create_task(
                cid,
                "generation",
                foreground=True,
                spawned_by=task.id,
                state=generation_state(self.services, nxt, names(state.get("tools")), state),
            )
        return bool(nxt)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        if task.status == "polling":  # the handle survives: poll again
            await ctx.command(
                lambda tx: tx.patch_task(
                    task.id, status="deferred", required_permit="deferred-poll"
                )
            )
            return
        # A stream cut off by a crash (§8.3). Its committed frames are the partial answer.
        if await ctx.command(lambda tx: self._publish_interrupted(tx, task, ctx, state)):
            return
        # No committed partial: nothing was published; retry within the budget or fail,
        # never fabricate an answer.
        await self._failed_attempt(
            task,
            ctx,
            state,
            ProviderError("the stream was interrupted", kind="retryable", retry_after=0.0),
        )

    def _publish_interrupted(
        self, tx: Command, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> bool:
        """With committed frames, publish them as the answer marked interrupted and settle
        the input group ``interrupted`` in ONE command; True when it did (or an abort owns
        the task). Frames carry only text: a response's tool calls arrive whole with its
        end and are published in the same command as the settlement, so a partial never
        announces a call and no call needs an error result here."""
        if tx.abort_marked(task.id) is not False:
            return True  # cancellation won: the abort handler settles (§6.4)
        frames = working_list("pico.frames", str, scope=ctx.working_scope)
        parts: list[str] = []
        after: int | None = None
        while True:
            page = tx.read_list(frames, after=after, limit=100)
            parts.extend(e.value for e in page.items)
            if page.next is None:
                break
            after = page.next
        partial = "".join(parts)
        if not partial:
            return False
        cid = task.conversation_id
        entry = tx.append_entry(
            cid,
            "assistant",
            {"text": partial},
            by_task_id=task.id,
            metadata={
                "interrupted": True,
                "stop_reason": "interrupted",
                "usage": state.get("usage"),
            },
        )
        tx.append_context(cid, [entry])
        outcome: JsonObject = {
            "status": "interrupted",
            "entry_id": entry,
            "reason": "the stream was interrupted",
        }
        set_results(tx, ints(state.get("inputs")), outcome)
        if not self._answer_boundary(tx, task, state):
            settle_owner(tx, cid, outcome)
        tx.patch_task(task.id, status="done", state={**state, "interrupted": True})
        tx.retire_working_scope(ctx.working_scope)
        return True

    async def abort(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        def cancel(tx: Command) -> None:
            cancel_input_group(tx, task)
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(cancel)


def _call_json(call: ToolCallPart) -> JsonValue:
    """A tool call as the assistant entry stores it (an unusable one says why)."""
    out: dict[str, JsonValue] = {"id": call.id, "name": call.name, "arguments": call.arguments}
    if call.unusable:
        out["unusable"] = call.unusable
    return out


def generation_state(
    services: AgentServices,
    inputs: Sequence[int],
    tools: Sequence[str],
    parent: dict[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """A generation's creation state: inputs, offered tools and the captured model and retry
    budget and the provider's request options (§8.3), inherited along one exchange."""
    parent = parent or {}
    state: dict[str, JsonValue] = {
        "inputs": json_list(inputs),
        "tools": json_list(tools),
        "model": parent.get("model") or services.model,
        "max_attempts": parent.get("max_attempts") or services.max_attempts,
        "tool_execution": parent.get("tool_execution") or services.tool_execution,
    }
    options = parent.get("options") or request_options(services.provider)
    if options:  # absent for a provider without request options: the shape stays as it was
        state["options"] = options
    return state


def tool_dependencies(sequential: Sequence[bool]) -> list[list[int]]:
    """The ``after`` of each call of one response, as indexes of earlier calls (§5.4).

    A sequential call (its tool is ``sequential``, or the generation's policy is) is a
    barrier: it waits for every earlier call, and every later call waits for it. Calls
    between two barriers run in parallel. Only the nearest edges are kept — the barrier
    before, or the parallel calls since it — as the rest follow transitively: all
    sequential gives ``B.after=[A]``, ``C.after=[B]``; none gives no edges at all.
    """
    edges: list[list[int]] = []
    barrier: int | None = None  # the last sequential call so far
    since: list[int] = []  # the parallel calls after it
    for index, is_sequential in enumerate(sequential):
        before = [barrier] if barrier is not None else []
        if is_sequential:
            edges.append(since or before)
            barrier, since = index, []
        else:
            edges.append(before)
            since.append(index)
    return edges
