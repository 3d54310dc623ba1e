"""Steps for approving and denying held tool calls (§8.6): the session's policy holds every
call of the ``read`` tool for a person's decision, which waits as an approval task. The
tool logs the arguments it ran with and the result hook logs what it processed, so a
scenario reads back what ran rather than guessing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import Agent, World, _agent


@dataclass
class ApprovalAgent(Agent):
    ran_with: list[pico.JsonObject] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)  # what after_tool saw
    rewrite: pico.JsonObject | None = None  # the arguments the policy asks to approve
    approval: int | None = None  # the approval the scenario last saw waiting


def _approvals(world: World) -> ApprovalAgent:
    agent = _agent(world)
    assert isinstance(agent, ApprovalAgent), "the scenario's tool calls do not need approval"
    return agent


def _open(world: World, agent: ApprovalAgent) -> pico.Harness:
    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        agent.ran_with.append(args)
        return f"read {args.get('path', 'everything')}"

    async def before(call: pico.ToolCall) -> pico.ToolDecision:
        return pico.ToolDecision("hold", "reading needs a person", arguments=agent.rewrite)

    async def after(call: pico.ToolCall, outcome: pico.ToolOutcome) -> pico.ToolOutcome:
        agent.processed.append(outcome.text)
        return outcome

    tool = pico.Tool("read", "Read a file", {"type": "object"}, read)
    hooks = pico.Hooks(before_tool=before, after_tool=after)
    harness: pico.Harness = world.run(
        world.backend.open(provider=agent.provider, tools=[tool], hooks=hooks, clock=agent.clock)
    )
    return harness


@given(
    parsers.parse('an agent session with conversation "{name}" whose tool calls need approval'),
    target_fixture="world",
)
def an_agent_session_needing_approval(world: World, name: str) -> World:
    clock = pico.FakeClock()
    agent = ApprovalAgent(pico.FauxProvider([], chunk_chars=4, cadence=1.0, clock=clock), clock)
    world.agent = agent
    world.harness = _open(world, agent)
    world.names[name] = world.run(world.h.root()).id
    return world


@given(parsers.parse("the policy asks to approve the arguments {arguments}"))
def policy_rewrites(world: World, arguments: str) -> None:
    _approvals(world).rewrite = json.loads(arguments)


def _decide(world: World, decision: str) -> None:
    agent = _approvals(world)
    assert agent.approval is not None, "no approval was seen waiting"
    approval = agent.approval
    world.attempt(world.h.decide_approval(approval, decision))


@when(parsers.re(r"the waiting approval is (?P<decision>granted|denied)$"))
def decided(world: World, decision: str) -> None:
    _decide(world, "grant" if decision == "granted" else "deny")
    assert world.error is None, repr(world.error)


@when(parsers.re(r"the approval is (?P<decision>granted|denied) after the cancellation$"))
def decided_late(world: World, decision: str) -> None:
    _decide(world, "grant" if decision == "granted" else "deny")


@when("the agent session is closed and opened again")
def reopen_agent(world: World) -> None:
    world.run(world.h.close())
    world.harness = _open(world, _approvals(world))


@then(parsers.re(r"(?P<count>\d+|no) approvals? (?:is|are) waiting for a decision$"))
def approvals_waiting(world: World, count: str) -> None:
    agent = _approvals(world)
    pending = world.run(world.h.pending_approvals())
    assert len(pending) == (0 if count == "no" else int(count)), pending
    if pending:
        agent.approval = pending[0].id


@then("no tool ran")
def no_tool_ran(world: World) -> None:
    assert _approvals(world).ran_with == []


@then(parsers.parse('the tool "{name}" ran with {arguments}'))
def tool_ran_with(world: World, name: str, arguments: str) -> None:
    assert _approvals(world).ran_with == [json.loads(arguments)]


def _call_result(world: World, conv: str) -> Any:
    page = world.run(world.conv(conv).entries(kind="tool", limit=10))
    assert len(page.items) == 1, page.items
    return page.items[0].content


@then(parsers.parse('the result of the call in "{conv}" is "{text}"'))
def call_result(world: World, conv: str, text: str) -> None:
    assert _call_result(world, conv) == {"content": text, "is_error": False}


@then(parsers.parse('the result of the call in "{conv}" is the error "{text}"'))
def call_error(world: World, conv: str, text: str) -> None:
    assert _call_result(world, conv) == {"content": text, "is_error": True}


@then(parsers.parse('the result hook processed "{text}"'))
def hook_processed(world: World, text: str) -> None:
    assert _approvals(world).processed == [text]
