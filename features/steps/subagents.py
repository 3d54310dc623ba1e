"""Steps for subagents (§4.3, §5.6, §5.7, §8.6): start one from a conversation, watch its
owner task and child conversation, cancel it, restart the session. The session drive is
the one that supervises detached work, so these steps drive the session."""

from __future__ import annotations

import asyncio
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import Agent, World, _address, _agent, _agent_tools, _json, _names
from pico.application.model import Request


def _spawn(world: World, conv: str, owner: str, child: str, prompt: str, **options: Any) -> None:
    s = world.run(world.conv(conv).spawn(prompt, **options))
    task = world.run(world.h.task(s))
    assert task is not None and task.owned_conversation_id is not None
    world.names[owner] = s
    world.names[child] = task.owned_conversation_id
    world.names[prompt] = world.run(world.conv(child).context_entries())[-1].id


_START = 'starts the subagent "{owner}" in conversation "{child}" with the prompt "{prompt}"'


@when(parsers.parse(f'"{{conv}}" {_START}'))
def starts_the_subagent(world: World, conv: str, owner: str, child: str, prompt: str) -> None:
    _spawn(world, conv, owner, child, prompt)


@when(parsers.parse(f'"{{conv}}" {_START}, inheriting the context'))
def starts_inheriting(world: World, conv: str, owner: str, child: str, prompt: str) -> None:
    _spawn(world, conv, owner, child, prompt, context="inherit")


@when(
    parsers.parse(f'"{{conv}}" {_START}, copying "{{names}}" and setting "{{name}}" to {{value}}')
)
def starts_initialized(
    world: World, conv: str, owner: str, child: str, prompt: str, names: str, name: str, value: str
) -> None:
    values = pico.Initialization(
        inherit=[_address(world, n) for n in _names(names)],
        set=[(_address(world, name), _json(value))],
    )
    _spawn(world, conv, owner, child, prompt, values=values)


@when("the session starts working")
def session_starts(world: World) -> None:
    agent = _agent(world)

    async def start() -> None:
        agent.driving = asyncio.ensure_future(world.h.drive())
        for _ in range(50):
            await asyncio.sleep(0)

    world.run(start())


async def _finish(world: World) -> str:
    agent = _agent(world)
    while not agent.driving.done():
        agent.clock.advance(1.0)
        await asyncio.sleep(0)
    return str(agent.driving.result())


@when("the session finishes its work")
def session_finishes(world: World) -> None:
    world.outcome = world.run(asyncio.wait_for(_finish(world), 10))


@when("the session works until it settles")
def session_works(world: World) -> None:
    session_starts(world)
    session_finishes(world)


@when(parsers.parse('subagent "{owner}" is cancelled from "{conv}"'))
def subagent_cancelled(world: World, owner: str, conv: str) -> None:
    world.names["the marked"] = len(world.run(world.conv(conv).abort_background(world.id(owner))))


@when(parsers.parse('the user cancels the work of "{conv}"'))
def user_cancels(world: World, conv: str) -> None:
    world.names["the marked"] = len(world.run(world.conv(conv).abort()))


@when("the agent session restarts")
def agent_restarts(world: World) -> None:
    agent = _agent(world)
    world.run(world.h.close())
    world.harness = world.run(
        world.backend.open(provider=agent.provider, tools=[], clock=agent.clock)
    )


def _owner(world: World, owner: str) -> pico.TaskSnapshot:
    task: pico.TaskSnapshot | None = world.run(world.h.task(world.id(owner)))
    assert task is not None and task.kind == "subagent", task
    return task


def _state(task: pico.TaskSnapshot) -> dict[str, Any]:
    assert isinstance(task.state, dict)
    return task.state


@then(parsers.parse('subagent "{owner}" is waiting for "{child}"'))
def subagent_waiting(world: World, owner: str, child: str) -> None:
    task = _owner(world, owner)
    assert task.status == "waiting" and task.owned_conversation_id == world.id(child)


@then(parsers.parse('"{child}" is owned by subagent "{owner}"'))
def owned_by(world: World, child: str, owner: str) -> None:
    snapshot = world.run(world.conv(child).snapshot())
    assert snapshot.owner_task_id == world.id(owner)
    assert snapshot.source is None  # ownership, not fork history


@then("nothing ran yet")
def nothing_ran(world: World) -> None:
    assert _agent(world).provider.request_count == 0


@then(parsers.parse('subagent "{owner}" is done with the answer "{text}" from "{child}"'))
def subagent_done(world: World, owner: str, text: str, child: str) -> None:
    task = _owner(world, owner)
    assert task.status == "done", task
    result = _state(task)["result"]
    assert result["status"] == "done"
    entry = world.run(world.h.entry(result["entry_id"]))
    assert entry is not None and entry.conversation_id == world.id(child)
    assert isinstance(entry.content, dict) and entry.content["text"] == text


@then(parsers.parse('subagent "{owner}" was cancelled'))
def subagent_cancelled_outcome(world: World, owner: str) -> None:
    task = _owner(world, owner)
    assert task.status == "aborted", task
    assert _state(task)["result"]["status"] == "cancelled"
    prompt = _state(task)["prompt"]
    child = world.conv(world.alias(task.owned_conversation_id or 0))
    result = world.run(child.result(prompt))
    assert result is not None and result.status == "cancelled"


@then("nothing was marked for cancellation")
def nothing_marked_now(world: World) -> None:
    assert world.names["the marked"] == 0


@then(parsers.parse('the context of "{child}" starts with the context of "{parent}"'))
def context_inherited(world: World, child: str, parent: str) -> None:
    parent_ids = [e.id for e in world.run(world.conv(parent).context_entries())]
    child_ids = [e.id for e in world.run(world.conv(child).context_entries())]
    assert parent_ids and child_ids[: len(parent_ids)] == parent_ids
    assert len(child_ids) == len(parent_ids) + 1  # then its own prompt


# ------------------------------------------------------------------ delegation (§5.5, §5.6)


@given(
    parsers.parse('an agent session with conversation "{name}" that can delegate to subagents'),
    target_fixture="world",
)
def an_agent_session_with_subagents(world: World, name: str) -> World:
    clock = pico.FakeClock()
    agent = Agent(pico.FauxProvider([], chunk_chars=4, cadence=1.0, clock=clock), clock)
    world.agent = agent
    tools = [*_agent_tools(agent), pico.subagent_tool()]
    world.harness = world.run(world.backend.open(provider=agent.provider, tools=tools, clock=clock))
    world.names[name] = world.run(world.h.root()).id
    return world


@given(
    parsers.re(
        r'the model will delegate "(?P<prompt>[^"]+)" to a '
        r"(?P<where>subagent|background subagent)$"
    )
)
def model_delegates(world: World, prompt: str, where: str) -> None:
    args: pico.JsonObject = {"prompt": prompt, "background": where == "background subagent"}
    _agent(world).provider.script.append(pico.FauxResponse(tool_calls=[("subagent", args)]))


@given(parsers.parse('the model will answer the subagent "{child}" and "{conv}" "{parent}"'))
def model_answers_both(world: World, child: str, parent: str, conv: str) -> None:
    """Two requests in flight at once (the child's and the parent's): each answer goes to
    the request it belongs to, whichever reaches the model first. A fresh child's request
    holds one message, its prompt; the parent's holds the whole exchange."""

    def route(request: Request) -> str:
        return child if len(request.messages) == 1 else parent

    _agent(world).provider.script.extend([route, route])


def _calls(world: World, conv: str) -> list[Any]:
    entries = world.run(world.conv(conv).context_entries())
    return [e.content for e in entries if e.kind == "tool"]


def _delegated(world: World, conv: str) -> pico.TaskSnapshot:
    page = world.run(world.h.tasks(conversation_ids=[world.id(conv)], kind="subagent"))
    (task,) = page.items
    assert isinstance(task, pico.TaskSnapshot)
    return task


@then(parsers.parse('the subagent call in "{conv}" returned "{text}"'))
def call_returned(world: World, conv: str, text: str) -> None:
    assert _calls(world, conv) == [{"content": text, "is_error": False}]


@then(parsers.parse('the subagent call in "{conv}" returned at once, naming its subagent'))
def call_returned_at_once(world: World, conv: str) -> None:
    task = _delegated(world, conv)
    expected = f"started subagent task {task.id} in the background"
    assert _calls(world, conv) == [{"content": expected, "is_error": False}]


@then(parsers.parse('the subagent delegated by "{conv}" is done with the answer "{text}"'))
def delegated_done(world: World, conv: str, text: str) -> None:
    task = _delegated(world, conv)
    assert task.status == "done", task
    entry = world.run(world.h.entry(_state(task)["result"]["entry_id"]))
    assert entry is not None and isinstance(entry.content, dict)
    assert entry.content["text"] == text


@then(parsers.parse('the subagent delegated by "{conv}" is still working'))
def delegated_working(world: World, conv: str) -> None:
    assert _delegated(world, conv).status == "waiting"
