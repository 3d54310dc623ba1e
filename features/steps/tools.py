"""Steps for how a response's tool calls are ordered (§5.4): one after another, or a tool
that runs alone. Tools take five seconds of the fake clock, as in the library's agent steps,
and log when they start and finish so the order is read back, not guessed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_bdd import given, parsers, then

import pico
from features.steps.library import Agent, World, _agent, _names

TOOL_NAMES = ("read", "grep", "edit")


@dataclass
class OrderedAgent(Agent):
    log: list[str] = field(default_factory=list)  # "start read", "end read", ...
    failing: set[str] = field(default_factory=set)


def _ordered(world: World) -> OrderedAgent:
    agent = _agent(world)
    assert isinstance(agent, OrderedAgent), "the scenario's tools do not log their order"
    return agent


def _open(world: World, name: str, *, alone: tuple[str, ...] = (), **kwargs: Any) -> World:
    clock = pico.FakeClock()
    agent = OrderedAgent(pico.FauxProvider([], chunk_chars=4, cadence=1.0, clock=clock), clock)

    def make(tool: str) -> Any:
        async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            agent.invoked.append(tool)
            agent.log.append(f"start {tool}")
            await clock.sleep_until(clock.now() + 5)
            agent.log.append(f"end {tool}")
            if tool in agent.failing:
                raise RuntimeError(f"{tool} broke")
            return f"{tool} done"

        return run

    tools = [
        pico.Tool(n, n, {"type": "object"}, make(n), sequential=n in alone) for n in TOOL_NAMES
    ]
    world.agent = agent
    world.harness = world.run(
        world.backend.open(provider=agent.provider, tools=tools, clock=clock, **kwargs)
    )
    world.names[name] = world.run(world.h.root()).id
    return world


@given(
    parsers.parse(
        'an agent session with conversation "{name}" whose tool calls run one after another'
    ),
    target_fixture="world",
)
def an_agent_session_with_sequential_tools(world: World, name: str) -> World:
    return _open(world, name, tool_execution="sequential")


@given(
    parsers.parse('an agent session with conversation "{name}" whose tool "{tool}" runs alone'),
    target_fixture="world",
)
def an_agent_session_with_a_tool_alone(world: World, name: str, tool: str) -> World:
    return _open(world, name, alone=(tool,))


@given(parsers.parse('the tool "{tool}" will fail'))
def a_failing_tool(world: World, tool: str) -> None:
    _ordered(world).failing.add(tool)


@then(parsers.parse('the tools ran one after another in the order "{names}"'))
def tools_ran_in_order(world: World, names: str) -> None:
    expected = [f"{step} {n}" for n in _names(names) for step in ("start", "end")]
    assert _ordered(world).log == expected


@then(parsers.parse('"{later}" started after "{earlier}" finished'))
def started_after(world: World, later: str, earlier: str) -> None:
    log = _ordered(world).log
    assert log.index(f"start {later}") > log.index(f"end {earlier}"), log


@then(parsers.parse('"{first}" and "{second}" ran at the same time'))
def ran_together(world: World, first: str, second: str) -> None:
    log = _ordered(world).log
    assert log.index(f"start {first}") < log.index(f"end {second}"), log
    assert log.index(f"start {second}") < log.index(f"end {first}"), log


@then(parsers.parse('the tool "{tool}" never ran'))
def tool_never_ran(world: World, tool: str) -> None:
    assert tool not in _ordered(world).invoked


@then(parsers.parse('every tool call of "{conv}" has a result'))
def every_call_has_a_result(world: World, conv: str) -> None:
    entries = world.run(world.conv(conv).entries(limit=1000)).items
    calls = [
        call["id"]
        for e in entries
        if e.kind == "assistant" and isinstance(e.content, dict)
        for call in e.content.get("tool_calls") or []
    ]
    answered = [e.metadata["tool_call_id"] for e in entries if e.kind == "tool" and e.metadata]
    assert calls and sorted(answered) == sorted(calls)
