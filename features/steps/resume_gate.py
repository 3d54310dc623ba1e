"""Steps for the resume gate (features/resume_gate.feature): an agent session is opened
with a faux model, closed, and reopened under another configuration; the auditor's view
is the session's stored events (``Harness.audit``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import World
from pico import FauxFailure, FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject

PATH: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@dataclass
class Gate:
    """What the scenario opened the session with, and what happened since."""

    options: dict[str, Any] = field(default_factory=dict)
    provider: FauxProvider = field(default_factory=lambda: FauxProvider([]))
    clock: pico.FakeClock = field(default_factory=pico.FakeClock)
    ran: list[str] = field(default_factory=list)
    input_id: int | None = None
    refused: pico.ConfigurationMismatchError | None = None
    before: tuple[int, int, int] | None = None
    outcome: Any = None


def _gate(world: World) -> Gate:
    gate = world.addresses.get("resume gate")
    if gate is None:
        gate = world.addresses["resume gate"] = Gate()
    assert isinstance(gate, Gate)
    return gate


def _open(world: World, provider: FauxProvider, **options: Any) -> None:
    gate = _gate(world)
    gate.provider = provider
    world.harness = world.run(world.backend.open(provider=provider, clock=gate.clock, **options))


def _reopen(world: World, provider: FauxProvider, **changes: Any) -> None:
    world.run(world.h.close())
    world.harness = None
    _open(world, provider, **{**_gate(world).options, **changes})


def _state(world: World) -> tuple[int, int, int]:
    records = world.h.audit(limit=100_000)
    return world.h.head(), len(records), records[-1].position if records else 0


def _changes(world: World) -> list[dict[str, Any]]:
    payloads: list[Any] = [
        r.payload for r in world.h.audit(limit=100_000) if r.event == "Session.ConfigurationChanged"
    ]
    return [
        {**change, "acknowledged": payload["acknowledged"]}
        for payload in payloads
        for change in payload["changes"]
    ]


async def _bounded(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, 10)


# ------------------------------------------------------------------ Given


@given(
    parsers.parse('an agent session working with model "{model}" and system prompt "{system}"'),
    target_fixture="world",
)
def agent_session(world: World, model: str, system: str) -> World:
    _gate(world).options = {"model": model, "system": system}
    _open(world, FauxProvider([]), model=model, system=system)
    return world


@given(
    parsers.parse('an agent session whose model calls the tools "{first}" and then "{second}"'),
    target_fixture="world",
)
def session_with_two_tools(world: World, first: str, second: str) -> World:
    gate = _gate(world)

    async def defer(args: JsonObject, ctx: ToolContext) -> str:
        gate.ran.append(ctx.tool_name)
        ctx.defer()
        return "asked"

    async def run(args: JsonObject, ctx: ToolContext) -> str:
        gate.ran.append(ctx.tool_name)
        return "done"

    tools = [pico.Tool(first, "first", PATH, defer), pico.Tool(second, "second", PATH, run)]
    gate.options = {"tools": tools, "tool_execution": "sequential"}
    calls = FauxResponse(tool_calls=[(first, {"path": "a"}), (second, {"path": "b"})])
    _open(world, FauxProvider([calls]), **gate.options)
    return world


@given(parsers.parse('the call of "{name}" waits for an answer from outside'))
def call_waits(world: World, name: str) -> None:
    c = world.run(world.h.root())
    world.run(c.accept("go"))
    assert world.run(_bounded(c.drive())) == "suspended"
    held = world.run(world.h.held_tool_calls())
    assert [t.state["name"] for t in held] == [name]


@given(
    parsers.parse(
        "an agent session allowing {attempts:d} attempts per answer whose model was busy once"
    ),
    target_fixture="world",
)
def session_with_budget(world: World, attempts: int) -> World:
    gate = _gate(world)
    gate.options = {"max_attempts": attempts, "retry_delay": 10.0}
    _open(world, FauxProvider([FauxFailure("retryable", "busy")]), **gate.options)
    c = world.run(world.h.root())
    gate.input_id = world.run(c.accept("hello"))

    async def until_retry() -> None:
        driving = asyncio.ensure_future(c.drive())
        for _ in range(200):
            await asyncio.sleep(0)
            (g,) = (await world.h.tasks(kind="generation")).items
            if g.status == "retry_wait":
                await world.h.close()
                assert await driving == "closed"
                return
        raise AssertionError("the first attempt did not fail")

    world.run(until_retry())
    world.harness = world.run(world.backend.open(read_only=True))
    return world


# ------------------------------------------------------------------ When


@when(parsers.parse('the session is reopened with model "{model}"'))
def reopen_with_model(world: World, model: str) -> None:
    gate = _gate(world)
    gate.before = _state(world)
    world.run(world.h.close())
    world.harness = None
    try:
        _open(world, FauxProvider([]), **{**gate.options, "model": model})
    except pico.ConfigurationMismatchError as exc:
        gate.refused = exc


@when(
    parsers.parse('the session is reopened with system prompt "{system}" and the user asks "{q}"')
)
def reopen_with_prompt(world: World, system: str, q: str) -> None:
    gate = _gate(world)
    _reopen(world, FauxProvider(["an answer"]), system=system)
    c = world.run(world.h.root())
    gate.input_id = world.run(c.accept(q))
    try:
        gate.outcome = world.run(c.drive())
    except pico.ConfigurationMismatchError as exc:
        gate.refused = exc


@when("the configuration change is acknowledged")
def acknowledge(world: World) -> None:
    world.run(world.h.acknowledge_configuration())


@when(parsers.parse('the session is reopened without the tool "{name}"'))
def reopen_without_tool(world: World, name: str) -> None:
    tools = [t for t in _gate(world).options["tools"] if t.name != name]
    _reopen(world, FauxProvider(["finished"]), tools=tools)


@when(parsers.parse('the call of "{name}" is answered'))
def answer_call(world: World, name: str) -> None:
    (held,) = world.run(world.h.held_tool_calls())
    assert held.state["name"] == name
    world.run(world.h.answer_tool_call(held.id, "the answer"))
    c = world.run(world.h.root())
    assert world.run(_bounded(c.drive())) == "idle"


@when(
    parsers.parse(
        "the session is reopened allowing {attempts:d} attempts while the model stays busy "
        "{times:d} more times"
    )
)
def reopen_with_budget(world: World, attempts: int, times: int) -> None:
    busy = [FauxFailure("retryable", "busy")] * times
    _reopen(world, FauxProvider([*busy, "ok"]), max_attempts=attempts, retry_delay=0.0)
    gate = _gate(world)
    gate.clock.advance(10.0)  # the retry timed before the reopen is due
    c = world.run(world.h.root())
    assert world.run(_bounded(c.drive())) == "idle"


# ------------------------------------------------------------------ Then


@then(parsers.parse('the reopening is refused naming the field "{name}"'))
def reopening_refused(world: World, name: str) -> None:
    refused = _gate(world).refused
    assert refused is not None and refused.hard
    assert [c["field"] for c in refused.changes] == [name]
    assert name in str(refused)


@then("nothing was written to the session")
def nothing_written(world: World) -> None:
    world.harness = world.run(world.backend.open(read_only=True))
    assert _state(world) == _gate(world).before


@then(parsers.parse('the session still reopens with model "{model}"'))
def reopens(world: World, model: str) -> None:
    _reopen(world, FauxProvider([]), model=model)
    assert world.h.configuration()["model"] == model  # type: ignore[index]


@then("no work runs and the model is not asked")
def nothing_runs(world: World) -> None:
    gate = _gate(world)
    assert gate.refused is not None and not gate.refused.hard
    assert gate.provider.request_count == 0


@then(parsers.parse('the auditor sees the change of "{name}" acknowledged'))
def change_acknowledged(world: World, name: str) -> None:
    assert [(c["field"], c["acknowledged"]) for c in _changes(world)] == [(name, True)]


@then(parsers.parse('the auditor sees the change of "{name}" accepted automatically'))
def change_accepted(world: World, name: str) -> None:
    assert (name, False) in [(c["field"], c["acknowledged"]) for c in _changes(world)]


@then("the user's question is answered")
def answered(world: World) -> None:
    c = world.run(world.h.root())
    assert world.run(_bounded(c.drive())) == "idle"
    input_id = _gate(world).input_id
    assert input_id is not None
    assert world.run(c.result(input_id)).status == "done"


@then(parsers.parse('the call of "{name}" gets an error result saying it is no longer offered'))
def error_result(world: World, name: str) -> None:
    c = world.run(world.h.root())
    results = world.run(world.h.entries(c.id, kind="tool")).items
    (result,) = [r for r in results if r.metadata["tool_name"] == name]
    assert result.content["is_error"] is True
    assert f"{name!r} is no longer offered" in result.content["content"]


@then(parsers.parse('the removed tool "{name}" was never invoked'))
def never_ran(world: World, name: str) -> None:
    assert name not in _gate(world).ran


@then(parsers.parse("the answer fails after {attempts:d} attempts in all"))
def fails_after(world: World, attempts: int) -> None:
    gate = _gate(world)
    c = world.run(world.h.root())
    assert gate.input_id is not None
    assert world.run(c.result(gate.input_id)).status == "failed"
    (g,) = world.run(world.h.tasks(kind="generation")).items
    assert g.state["attempt"] == attempts
    assert gate.provider.request_count == attempts - 1  # the first one was made before
