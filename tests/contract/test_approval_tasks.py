"""Approvals as durable tasks (seed 003 §8.6, §6.4, §6.5; seed 000 "the approval channel"),
on every backend with the faux provider: the trace of each command read back from the
stored task records, listing, restart, late decisions, abort versus decision in both
orders, and sessions stored before approvals were tasks."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject
from tests.backends import Backend

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


async def _bounded(coro: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


@dataclasses.dataclass
class Agent:
    """One harness whose ``read`` tool is held by ``before_tool``; records what ran."""

    backend: Backend
    invoked: list[JsonObject] = dataclasses.field(default_factory=list)
    asked: list[JsonObject] = dataclasses.field(default_factory=list)  # before_tool calls
    processed: list[str] = dataclasses.field(default_factory=list)  # after_tool texts
    rewrite: JsonObject | None = None  # the arguments the hold asks to approve
    deciding: asyncio.Event | None = None  # before_tool waits on it when set
    h: pico.Harness | None = None

    async def open(self, script: list[Any] | None = None) -> pico.Harness:
        async def read(args: JsonObject, ctx: ToolContext) -> str:
            self.invoked.append(args)
            return f"contents of {args['path']}"

        async def before(call: pico.ToolCall) -> pico.ToolDecision:
            self.asked.append(call.arguments)
            if self.deciding is not None:
                await self.deciding.wait()
            return pico.ToolDecision("hold", "reads need a person", arguments=self.rewrite)

        async def after(call: pico.ToolCall, outcome: pico.ToolOutcome) -> pico.ToolOutcome:
            self.processed.append(outcome.text)
            return dataclasses.replace(outcome, text=outcome.text.upper())

        provider = FauxProvider(
            script
            if script is not None
            else [FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "after"]
        )
        self.h = await self.backend.open(
            provider=provider,
            tools=[pico.Tool("read", "Read", SCHEMA, read)],
            hooks=pico.Hooks(before_tool=before, after_tool=after),
        )
        return self.h

    async def held(self) -> tuple[pico.ConversationHandle, int, pico.TaskSnapshot]:
        """Open, ask, drive until the call waits on its approval."""
        h = await self.open()
        c = await h.root()
        input_id = await c.accept("read it")
        assert await _bounded(c.drive()) == "suspended"
        (approval,) = await h.pending_approvals()
        return c, input_id, approval


async def _task(h: pico.Harness, task_id: Any) -> pico.TaskSnapshot:
    found = await h.task(task_id)
    assert found is not None
    return found


async def _refused(
    h: pico.Harness, attempt: Callable[[], Awaitable[Any]], error: type[pico.PicoError]
) -> str:
    """The attempt raises ``error`` and writes nothing."""
    head, main = h.head(), h.main_head()
    with pytest.raises(error) as caught:
        await attempt()
    assert type(caught.value) is error, repr(caught.value)
    assert (h.head(), h.main_head(), h.faulted) == (head, main, None)
    return str(caught.value)


def _tool_of(approval: pico.TaskSnapshot) -> int:
    assert isinstance(approval.state, dict)
    tool_id = approval.state["tool_task"]
    assert isinstance(tool_id, int)
    return tool_id


async def _tool_result(h: pico.Harness, tool: pico.TaskSnapshot) -> pico.Entry:
    assert isinstance(tool.state, dict)
    entry = await h.entry(tool.state["result_entry"])  # type: ignore[arg-type]
    assert entry is not None and entry.kind == "tool"
    return entry


# ------------------------------------------------------------------ hold, grant, deny


async def test_a_held_call_creates_its_approval_and_waits_on_it_in_one_command(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    c, _, approval = await agent.held()
    h = agent.h
    assert h is not None
    tool = (await h.tasks(kind="tool", limit=1)).items[0]
    # Check A: pending and waiting, required work of the exchange, spawned by the tool,
    # holding the call to approve.
    assert (approval.kind, approval.status, approval.role) == ("approval", "pending", "waiting")
    assert approval.foreground and approval.spawned_by == tool.id
    assert approval.conversation_id == tool.conversation_id == c.id
    assert approval.state == {
        "tool_task": tool.id,
        "call_id": tool.state["call_id"],  # type: ignore[call-overload,index]
        "name": "read",
        "arguments": {"path": "a.py"},
        "reason": "reads need a person",
    }
    # Check the tool: waiting after A, patched by the same command (the next number).
    assert (tool.status, tool.role) == ("awaiting_approval", "waiting")
    assert approval.id in tool.after and tool.state["approval"] == approval.id  # type: ignore[call-overload,index]
    assert tool.updated_seq == approval.id + 1
    assert agent.invoked == [] and await h.tasks(kind="approval", live=True) is not None
    await h.close()


async def test_granting_runs_the_approved_arguments_without_asking_before_tool_again(
    backend: Backend,
) -> None:
    agent = Agent(backend, rewrite={"path": "safe/a.py"})
    c, input_id, approval = await agent.held()
    h = agent.h
    assert h is not None and agent.asked == [{"path": "a.py"}]
    assert approval.state["arguments"] == {"path": "safe/a.py"}  # type: ignore[call-overload,index]
    head = h.head()
    assert await h.decide_approval(approval.id, "grant") == approval.id
    decided = await _task(h, approval.id)
    tool = await _task(h, _tool_of(approval))
    # Check ONE command: { A granted; tool ready with the approved arguments }.
    assert decided.status == "granted" and not decided.live
    assert (tool.status, tool.role) == ("pending", "ready")
    assert tool.state["arguments"] == {"path": "safe/a.py"} and tool.state["approved"]  # type: ignore[call-overload,index]
    assert head < decided.updated_seq < tool.updated_seq <= h.head()
    assert await _bounded(c.drive()) == "idle"
    assert agent.invoked == [{"path": "safe/a.py"}]  # the approved arguments ran
    assert agent.asked == [{"path": "a.py"}]  # before_tool was not asked again
    tool = await _task(h, tool.id)
    entry = await _tool_result(h, tool)
    assert tool.status == "done"
    assert entry.content == {"content": "CONTENTS OF SAFE/A.PY", "is_error": False}
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    await h.close()


async def test_denying_runs_after_tool_and_writes_the_tools_own_result(backend: Backend) -> None:
    agent = Agent(backend)
    c, input_id, approval = await agent.held()
    h = agent.h
    assert h is not None
    head = h.head()
    await h.decide_approval(approval.id, "deny")
    decided = await _task(h, approval.id)
    tool = await _task(h, _tool_of(approval))
    # Check ONE command: { A denied; tool finishing with the denial outcome }.
    assert decided.status == "denied"
    assert (tool.status, tool.role) == ("finishing", "ready")
    assert tool.state["finish"] == {"denied": "denied by approval"}  # type: ignore[call-overload,index]
    assert head < decided.updated_seq < tool.updated_seq <= h.head()
    assert await h.entries(c.id, kind="tool") is not None
    assert not (await h.entries(c.id, kind="tool")).items  # the result is the tool's to write
    assert await _bounded(c.drive()) == "idle"
    tool = await _task(h, tool.id)
    entry = await _tool_result(h, tool)
    assert tool.status == "done" and agent.invoked == []
    assert agent.processed == ["denied by approval"]  # after_tool processed the denial
    assert entry.content == {"content": "DENIED BY APPROVAL", "is_error": True}
    assert entry.metadata["tool_call_id"] == tool.state["call_id"]  # type: ignore[call-overload,index]
    result = await c.result(input_id)
    assert result is not None and result.status == "done"  # the model saw the denial
    await h.close()


# ------------------------------------------------------------------ the decision surface


async def test_pending_approvals_are_listed_as_tasks_per_conversation(backend: Backend) -> None:
    agent = Agent(backend)
    h = await agent.open(
        [FauxResponse(tool_calls=[("read", {"path": "a.py"}), ("read", {"path": "b.py"})]), "ok"]
    )
    c = await h.root()
    other = await c.fork(at_entry=await c.append("user", "context"))
    await c.accept("read both")
    assert await _bounded(c.drive()) == "suspended"
    pending = await h.pending_approvals()
    assert [a.state["arguments"] for a in pending] == [{"path": "a.py"}, {"path": "b.py"}]  # type: ignore[call-overload,index]
    assert pending == list((await h.tasks(kind="approval", live=True)).items)
    assert await h.pending_approvals(c.id) == pending
    assert await h.pending_approvals(other.id) == []
    assert await h.held_tool_calls() == []  # a deferred result is a different thing
    await h.decide_approval(pending[0].id, "deny")
    assert await h.pending_approvals() == [await _task(h, pending[1].id)]
    await h.close()


async def test_a_pending_approval_survives_a_restart_and_is_never_granted(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    _, _, approval = await agent.held()
    assert agent.h is not None
    await agent.h.close()
    h = await agent.open([])
    c = await h.root()
    assert await _bounded(c.drive()) == "suspended"  # nothing to do until a decision
    assert await _bounded(h.drive()) == "suspended"
    assert await h.pending_approvals() == [approval]  # unchanged record, still listable
    assert agent.invoked == [] and agent.asked == [{"path": "a.py"}]
    await h.decide_approval(approval.id, "grant")
    assert await _bounded(c.drive()) == "idle" and agent.invoked == [{"path": "a.py"}]
    await h.close()


async def test_a_late_decision_is_refused_and_changes_nothing(backend: Backend) -> None:
    agent = Agent(backend)
    c, _, approval = await agent.held()
    h = agent.h
    assert h is not None
    tool_id = _tool_of(approval)
    await h.decide_approval(approval.id, "grant")
    for late in ("grant", "deny"):
        for target in (approval.id, tool_id):
            message = await _refused(
                h, functools.partial(h.decide_approval, target, late), pico.CommandRejectedError
            )
            assert f"approval {approval.id} was already granted" in message
    assert await _bounded(c.drive()) == "idle"
    message = await _refused(
        h, lambda: h.decide_approval(approval.id, "deny"), pico.CommandRejectedError
    )
    assert "already granted" in message and agent.invoked == [{"path": "a.py"}]
    await h.close()


async def test_a_decision_for_an_unknown_or_other_task_is_refused(backend: Backend) -> None:
    agent = Agent(backend)
    _, _, approval = await agent.held()
    h = agent.h
    assert h is not None
    generation = (await h.tasks(kind="generation", limit=1)).items[0]
    await _refused(h, lambda: h.decide_approval(10**9, "grant"), pico.UnknownTaskError)
    message = await _refused(
        h, lambda: h.decide_approval(generation.id, "grant"), pico.CommandRejectedError
    )
    assert f"task {generation.id} is a 'generation' task, not an approval" in message
    await _refused(h, lambda: h.decide_approval(approval.id, "yes"), pico.InvalidArgumentError)
    assert await h.pending_approvals() == [approval]
    await h.close()


# ------------------------------------------------------------------ cancellation (§6.4, §6.5)


async def test_abort_before_the_decision_refuses_it_and_settles_both_tasks(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    c, input_id, approval = await agent.held()
    h = agent.h
    assert h is not None
    tool_id = _tool_of(approval)
    marked = await c.abort()
    assert {approval.id, tool_id} <= set(marked)  # the tool and its unfinished dependency A
    for target in (approval.id, tool_id):
        message = await _refused(
            h, functools.partial(h.decide_approval, target, "grant"), pico.CommandRejectedError
        )
        assert "marked for cancellation" in message
    assert await _bounded(c.drive()) == "idle"
    assert (await _task(h, approval.id)).status == "aborted"  # A's own abort handler
    tool = await _task(h, tool_id)
    entry = await _tool_result(h, tool)  # the required result record of the call
    assert tool.status == "aborted" and entry.content == {"content": "aborted", "is_error": True}
    assert agent.invoked == [] and await h.pending_approvals() == []
    result = await c.result(input_id)
    assert result is not None and result.status == "cancelled"
    message = await _refused(
        h, lambda: h.decide_approval(approval.id, "grant"), pico.CommandRejectedError
    )
    assert "already aborted" in message
    await h.close()


async def test_a_decision_before_the_abort_lets_the_abort_settle_the_tool(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    c, _, approval = await agent.held()
    h = agent.h
    assert h is not None
    tool_id = _tool_of(approval)
    await h.decide_approval(approval.id, "grant")
    marked = await c.abort()
    assert tool_id in marked and approval.id not in marked  # A is settled: not selected
    assert await _bounded(c.drive()) == "idle"
    assert (await _task(h, approval.id)).status == "granted"  # a decision is kept
    tool = await _task(h, tool_id)
    assert tool.status == "aborted" and agent.invoked == []  # the grant did not escape
    assert (await _tool_result(h, tool)).content == {"content": "aborted", "is_error": True}
    await h.close()


async def test_an_abort_while_before_tool_decides_creates_no_approval(backend: Backend) -> None:
    agent = Agent(backend, deciding=asyncio.Event())
    h = await agent.open()
    c = await h.root()
    await c.accept("read it")
    driving = asyncio.ensure_future(c.drive())
    while not agent.asked:  # barrier: the hook is deciding, outside the command line
        await asyncio.sleep(0)
    tool = (await h.tasks(kind="tool", limit=1)).items[0]
    assert tool.id in await c.abort()
    assert agent.deciding is not None
    agent.deciding.set()  # the hook now answers "hold" for a marked tool
    assert await _bounded(driving) == "idle"
    assert (await h.tasks(kind="approval", limit=10)).items == ()  # the hold wrote nothing
    tool = await _task(h, tool.id)
    assert tool.status == "aborted" and agent.invoked == []
    await h.close()


async def test_cancelling_only_the_approval_finishes_its_tool_with_the_cancellation(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    c, input_id, approval = await agent.held()
    h = agent.h
    assert h is not None
    await h.command(lambda tx: tx.request_abort(approval.id))
    assert await _bounded(c.drive()) == "idle"
    assert (await _task(h, approval.id)).status == "aborted"
    tool = await _task(h, _tool_of(approval))
    entry = await _tool_result(h, tool)
    assert tool.status == "done" and agent.invoked == []
    assert entry.content == {
        "content": "THE APPROVAL WAS CANCELLED BEFORE A DECISION",
        "is_error": True,
    }
    result = await c.result(input_id)
    assert result is not None and result.status == "done"  # the turn went on
    await h.close()


# ------------------------------------------------------------------ legacy sessions


async def _legacy_session(agent: Agent) -> tuple[int, int]:
    """A live tool task held the old way: status ``approval``, no approval task."""
    h = await agent.open([])
    c = await h.root()
    await c.append("user", "read the old file")
    await c.append("assistant", "reading", metadata={"tool_calls": ["call-1"]})
    state: JsonObject = {
        "call_id": "call-1",
        "name": "read",
        "arguments": {"path": "old.py"},
        "offered": ["read"],
    }
    tool_id = await h.command(
        lambda tx: tx.create_task(c.id, "tool", status="approval", state=state, foreground=True)
    )
    await h.close()
    return c.id, tool_id


async def test_a_legacy_held_tool_is_migrated_on_recovery_and_never_granted(
    backend: Backend,
) -> None:
    agent = Agent(backend)
    conversation_id, tool_id = await _legacy_session(agent)
    h = await agent.open([])
    c = await h.root()
    assert await _bounded(c.drive()) == "suspended"
    (approval,) = await h.pending_approvals()
    tool = await _task(h, tool_id)
    # Check the migration is the hold command: { create approval A; tool waiting after:[A] }.
    assert (approval.status, approval.spawned_by, approval.foreground) == ("pending", tool_id, True)
    assert approval.state["arguments"] == {"path": "old.py"}  # type: ignore[call-overload,index]
    assert tool.status == "awaiting_approval" and tool.after == (approval.id,)
    assert tool.updated_seq == approval.id + 1 and agent.invoked == []
    assert await h.decide_approval(tool_id, "grant") == approval.id  # the legacy id decides A
    assert await _bounded(c.drive()) == "idle"
    assert agent.invoked == [{"path": "old.py"}] and agent.asked == []
    assert (await _task(h, tool_id)).status == "done"
    assert conversation_id == c.id
    await h.close()


@pytest.mark.parametrize("decision", ["grant", "deny"])
async def test_a_legacy_held_tool_decided_before_recovery_gets_its_approval_task(
    backend: Backend, decision: str
) -> None:
    agent = Agent(backend)
    _, tool_id = await _legacy_session(agent)
    h = await agent.open([])
    approval_id = await h.decide_approval(tool_id, decision)
    approval = await _task(h, approval_id)
    tool = await _task(h, tool_id)
    assert approval.status == ("granted" if decision == "grant" else "denied")
    assert approval.spawned_by == tool_id and tool.after == (approval_id,)
    assert tool.status == ("pending" if decision == "grant" else "finishing")
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    tool = await _task(h, tool_id)
    entry = await _tool_result(h, tool)
    if decision == "grant":
        assert entry.content == {"content": "CONTENTS OF OLD.PY", "is_error": False}
    else:
        assert entry.content == {"content": "DENIED BY APPROVAL", "is_error": True}
    await h.close()
