"""Hooks (§8.8) and the approval channel, on every backend with the faux provider."""

from __future__ import annotations

import asyncio
import dataclasses
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


def _read(invoked: list[JsonObject]) -> pico.Tool:
    async def read(args: JsonObject, ctx: ToolContext) -> str:
        invoked.append(args)
        return f"contents of {args['path']}"

    return pico.Tool("read", "Read", SCHEMA, read)


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


async def test_before_request_transforms_and_after_response_observes(backend: Backend) -> None:
    seen: list[Any] = []

    async def before(request: pico.Request) -> pico.Request:
        return dataclasses.replace(request, system="You are terse.")

    async def after(outcome: Any) -> None:
        seen.append(outcome)
        raise RuntimeError("observers never block")  # logged and ignored

    provider = FauxProvider(["ok"])
    hooks = pico.Hooks(before_request=before, after_response=after)
    h = await backend.open(provider=provider, hooks=hooks)
    c = await h.root()
    _, result = await _bounded(c.prompt("hi"))
    assert result is not None and result.status == "done"
    assert provider.requests[0].system == "You are terse." and len(seen) == 1
    await h.close()


async def test_a_failing_before_request_fails_the_turn_closed(backend: Backend) -> None:
    async def before(request: pico.Request) -> pico.Request:
        raise ValueError("policy service down")

    provider = FauxProvider(["never sent"])
    h = await backend.open(provider=provider, hooks=pico.Hooks(before_request=before))
    c = await h.root()
    _, result = await _bounded(c.prompt("hi"))
    assert result is not None and result.status == "failed"
    assert "policy service down" in (result.reason or "") and provider.requests == []
    await h.close()


async def test_before_tool_can_block_or_rewrite_and_after_tool_processes(
    backend: Backend,
) -> None:
    invoked: list[JsonObject] = []

    async def before(call: pico.ToolCall) -> pico.ToolDecision:
        if call.arguments["path"] == "secret.txt":
            return pico.ToolDecision("block", "not allowed to read secrets")
        return pico.ToolDecision("allow", arguments={"path": "safe/" + str(call.arguments["path"])})

    async def after(call: pico.ToolCall, outcome: pico.ToolOutcome) -> pico.ToolOutcome:
        return dataclasses.replace(outcome, text=outcome.text.upper())

    provider = FauxProvider(
        [
            FauxResponse(tool_calls=[("read", {"path": "secret.txt"}), ("read", {"path": "a.py"})]),
            "done",
        ]
    )
    h = await backend.open(
        provider=provider,
        tools=[_read(invoked)],
        hooks=pico.Hooks(before_tool=before, after_tool=after),
    )
    c = await h.root()
    _, result = await _bounded(c.prompt("read both"))
    assert result is not None and result.status == "done"
    assert invoked == [{"path": "safe/a.py"}]  # the blocked call never ran
    results = [e.content for e in (await c.entries(kind="tool")).items]
    assert results[0] == {"content": "not allowed to read secrets", "is_error": True}
    assert results[1] == {"content": "CONTENTS OF SAFE/A.PY", "is_error": False}
    await h.close()


async def test_arguments_a_hook_edits_in_place_are_validated_before_the_tool_runs(
    backend: Backend,
) -> None:
    invoked: list[JsonObject] = []

    async def before(call: pico.ToolCall) -> pico.ToolDecision:
        call.arguments["path"] = 7  # edited in place, not returned as a transformation
        return pico.ToolDecision("allow")

    provider = FauxProvider([FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "done"])
    h = await backend.open(
        provider=provider, tools=[_read(invoked)], hooks=pico.Hooks(before_tool=before)
    )
    c = await h.root()
    _, result = await _bounded(c.prompt("read it"))
    assert result is not None and result.status == "done"
    assert invoked == []  # never invoked with arguments its schema refuses
    (tool_result,) = [e.content for e in (await c.entries(kind="tool")).items]
    assert isinstance(tool_result, dict) and tool_result["is_error"] is True
    assert "invalid at path" in str(tool_result["content"])
    await h.close()


async def test_a_tool_that_changes_its_arguments_leaves_the_recorded_ones_alone(
    backend: Backend,
) -> None:
    async def consume(args: JsonObject, ctx: ToolContext) -> str:
        path = args.pop("path")  # the tool's own copy
        args["extra"] = True
        return f"read {path}"

    tool = pico.Tool("read", "Read", SCHEMA, consume)
    provider = FauxProvider([FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "done"])
    h = await backend.open(provider=provider, tools=[tool])
    c = await h.root()
    _, result = await _bounded(c.prompt("read it"))
    assert result is not None and result.status == "done"
    (task,) = (await h.tasks(kind="tool", limit=1)).items
    state = task.state
    assert isinstance(state, dict) and state["arguments"] == {"path": "a.py"}
    await h.close()


@pytest.mark.parametrize("decision", ["grant", "deny"])
async def test_held_calls_wait_for_approval_across_a_restart(
    backend: Backend, decision: str
) -> None:
    invoked: list[JsonObject] = []

    async def before(call: pico.ToolCall) -> pico.ToolDecision:
        return pico.ToolDecision("hold")

    def open_harness(provider: FauxProvider) -> Any:
        return backend.open(
            provider=provider, tools=[_read(invoked)], hooks=pico.Hooks(before_tool=before)
        )

    provider = FauxProvider([FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "after"])
    h = await open_harness(provider)
    c = await h.root()
    input_id = await c.accept("read it")
    assert await _bounded(c.drive()) == "suspended"
    tool = (await h.tasks(kind="tool", limit=1)).items[0]
    assert tool.status == "awaiting_approval" and tool.role == "waiting" and invoked == []
    await h.close()
    h = await open_harness(provider)
    with pytest.raises(pico.CommandRejectedError):
        await h.decide_approval(tool.id, "maybe")
    # The held tool call's id is accepted for compatibility: it decides the call's approval.
    (approval,) = await h.pending_approvals()
    assert await h.decide_approval(tool.id, decision) == approval.id
    with pytest.raises(pico.CommandRejectedError):
        await h.decide_approval(tool.id, decision)  # decided once
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    assert invoked == ([{"path": "a.py"}] if decision == "grant" else [])
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    await h.close()


async def test_on_yield_continues_the_same_group_unless_input_is_queued(
    backend: Backend,
) -> None:
    decisions = [
        pico.YieldDecision("continue", "Keep going: check the tests too."),
        pico.YieldDecision("stop"),
    ]

    async def on_yield(response: pico.Response) -> pico.YieldDecision:
        return decisions.pop(0)

    provider = FauxProvider(["first pass", "second pass"])
    h = await backend.open(provider=provider, hooks=pico.Hooks(on_yield=on_yield))
    c = await h.root()
    _, result = await _bounded(c.prompt("review the parser"))
    assert result is not None and result.status == "done"
    answer = await h.entry(result.entry_id)
    assert answer is not None and isinstance(answer.content, dict)
    assert answer.content["text"] == "second pass"  # the group spanned both generations
    assert provider.requests[1].messages[-1].text.endswith("Keep going: check the tests too.")
    # A queued follow-up takes precedence over a continuation decision.
    clock = pico.FakeClock()
    provider2 = FauxProvider(["answer A", "answer B"], chunk_chars=2, cadence=1.0, clock=clock)
    answers: list[str] = []

    async def continue_after_a(response: pico.Response) -> pico.YieldDecision:
        answers.append(response.message.text)
        if response.message.text == "answer A":
            return pico.YieldDecision("continue", "more!")  # stale once B is queued
        return pico.YieldDecision("stop")

    b2 = Backend(backend.name, backend.url, backend.session + "-yield")
    h2 = await b2.open(provider=provider2, hooks=pico.Hooks(on_yield=continue_after_a), clock=clock)
    c2 = await h2.root()
    a = await c2.accept("A")
    drive = asyncio.ensure_future(c2.drive())
    for _ in range(30):
        await asyncio.sleep(0)
    b = await c2.follow_up("B")
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert drive.result() == "idle" and answers == ["answer A", "answer B"]
    assert [(await c2.result(i)).status for i in (a, b)] == ["done", "done"]  # type: ignore[union-attr]
    assert all("more!" not in m.text for r in provider2.requests for m in r.messages)
    assert provider2.requests[1].messages[-1].text == "B"
    await h.close()
    await h2.close()
