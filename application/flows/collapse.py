"""Collapse (§8.5), including speculative completion.

    status       role       transitions
    pending      ready      -> summarizing | declined | stale | failed | aborted
    summarizing  inflight   -> pending | parked | done | stale | failed | aborted
    parked       waiting    -> done | stale | aborted   (a complete candidate)
    done, stale, declined, failed, aborted   terminal

``start_collapse`` keeps one live collapse per conversation. The summary of the prefix
through the cut point (no tool call open) is computed while the conversation may be busy,
then published in place of that prefix only when the context is editable and the prefix
unchanged; a competing edit makes the candidate stale.

One attempt, in commands: ``{ summarizing: cut point and prefix revision captured }`` →
the summarizer → ``{ candidate: summary + reported usage, phase "candidate" }`` →
``{ publish | park | stale }``. Recovery of a ``summarizing`` task (its process died)
reuses a recorded candidate — published, parked or made stale exactly as the normal path
does, without asking the summarizer again and without adding its usage twice — and with
no candidate retries (back to ``pending``, the same cut point) within the captured
``max_attempts``, or fails; a generation waiting on it then proceeds with its context
unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pico.application.command import Command
from pico.application.flows.common import (
    AgentServices,
    captured_options,
    closed_exchanges,
    request_options,
    task_state,
)
from pico.application.flows.streaming import add_usage, stream_response
from pico.application.model import Message, ProviderError, Request, Response, TextPart
from pico.application.scheduler import Execution
from pico.application.state import working_list
from pico.application.tasks import TaskDefinition, TaskExecution
from pico.domain.json import JsonValue
from pico.domain.task import Role
from pico.domain.values import TaskSnapshot

__all__ = ["CollapseDefinition", "start_collapse"]


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
        "pending": ["summarizing", "declined", "stale", "failed", "aborted"],
        # back to pending: an interrupted attempt retried within the budget (recover)
        "summarizing": ["pending", "parked", "done", "stale", "failed", "aborted"],
        "parked": ["done", "stale", "aborted"],
    }

    def __init__(self, services: AgentServices) -> None:
        self.services = services

    async def execute(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        cid = task.conversation_id
        decision = await self.services.hooks.decide_collapse(cid)  # outside the line
        if decision.action == "decline":
            await ctx.command(lambda tx: tx.patch_task(task.id, status="declined"))
            return
        snapshot = ctx.reads.get_conversations([cid]).get(cid)
        if snapshot is not None and isinstance(state.get("revision"), int):
            # A retry of an interrupted attempt keeps its captured cut point: a prefix
            # edited since makes it stale without asking the summarizer again.
            captured_through = state.get("through")
            through = (
                captured_through
                if snapshot.prefix_revision == state.get("revision")
                and isinstance(captured_through, int)
                and captured_through in snapshot.context
                else None
            )
            reason = "the prefix changed before the retry"
        else:
            through = _cut_point(ctx.reads, snapshot.context if snapshot else ())
            reason = "nothing to collapse"
        if snapshot is None or through is None:
            await ctx.command(
                lambda tx: tx.patch_task(task.id, status="stale", state={**state, "reason": reason})
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
            settings=captured_options(state),
        )
        try:
            outcome = await stream_response(
                self.services.provider,
                request,
                ctx,
                working_list("pico.frames", str, scope=ctx.working_scope),
                self.services.telemetry,
            )
        except ProviderError as error:
            failed = {
                **captured,
                "error": str(error),
                "usage": add_usage(captured.get("usage"), error.usage),
            }

            def fail(tx: Command) -> None:
                tx.patch_task(task.id, status="failed", state=failed)
                tx.retire_working_scope(ctx.working_scope)

            await ctx.command(fail)
            return
        if not isinstance(outcome, Response):
            return  # signalled, or deferred (not supported for summaries): the abort settles
        # The attempt's outcome, durable before any publication (§8.5): the complete
        # candidate and its reported usage, in ONE command. From here on a crash reuses
        # this candidate; the summarizer is not asked again and the usage never re-added.
        candidate: dict[str, JsonValue] = {
            **captured,
            "summary": outcome.message.text,
            "usage": add_usage(captured.get("usage"), outcome.usage),
            "phase": "candidate",
        }
        await ctx.command(lambda tx: tx.patch_task(task.id, state=candidate))
        if ctx.signal.is_set():
            return  # abort or close: the abort handler settles (usage kept); recovery reuses
        await self._publish(task, ctx, candidate)

    async def _publish(
        self, task: TaskSnapshot, ctx: TaskExecution, state: dict[str, JsonValue]
    ) -> None:
        cid = task.conversation_id

        def publish(tx: Command) -> str:
            if tx.abort_marked(task.id) is not False:
                return "aborted"  # cancellation won: the abort handler settles (§6.4)
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
                await self._publish(current, rctx, task_state(current))

        ctx.observe(subscribe, reconcile)

    async def recover(self, task: TaskSnapshot, ctx: TaskExecution) -> None:
        state = task_state(task)
        if task.status == "parked":  # a durable complete candidate: re-arm the predicate
            self._observe(task, ctx)
            return
        # Interrupted while summarizing (its process died, or its owner closed).
        if state.get("phase") == "candidate" and isinstance(state.get("summary"), str):
            # The attempt's outcome was recorded: publish, park or go stale exactly as the
            # normal path does, from the recorded candidate and its recorded usage.
            await self._publish(task, ctx, state)
            return
        # No complete candidate: nothing was published and no usage is known. Retry from
        # the same cut point within the captured budget, or fail.
        attempt = int(state.get("attempt", 0) or 0) + 1  # type: ignore[arg-type]
        budget = state.get("max_attempts")
        limit = budget if isinstance(budget, int) else self.services.max_attempts

        def retry_or_fail(tx: Command) -> None:
            if tx.abort_marked(task.id) is not False:
                return  # cancellation won: the abort handler settles (§6.4)
            if attempt < limit:
                tx.patch_task(task.id, status="pending", state={**state, "attempt": attempt})
            else:
                error = f"the summary was interrupted after {attempt} attempt(s) of {limit}"
                tx.patch_task(
                    task.id,
                    status="failed",
                    state={**state, "attempt": attempt, "error": error},
                )
            # The interrupted attempt's frames are discarded; a retry starts a fresh scope.
            tx.retire_working_scope(ctx.working_scope)

        await ctx.command(retry_or_fail)

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
    keep = list(context[:-2])  # keep the latest exchange selected
    closed = closed_exchanges(reads.get_entries(keep, content=False), keep)
    cut: int | None = None
    for entry_id, done in zip(keep, closed, strict=True):
        if done:
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
    state: dict[str, JsonValue] = {
        "instructions": instructions,
        "model": services.model,
        "max_attempts": services.max_attempts,  # the retry budget, captured (§8.5)
    }
    if options := request_options(services.provider):
        state["options"] = options  # the request options, captured like the model (§8.3)
    return tx.create_task(conversation_id, "collapse", foreground=True, state=state)
