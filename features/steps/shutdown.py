"""Steps for shutdown and abort (§6.4, §6.6): shutting the session down while the agent
works, input refused meanwhile, subagents a running tool starts. The fake clock moves
while shutdown settles, so a tool that ignores the stop signal still finishes."""

from __future__ import annotations

import asyncio
from typing import Any

from pytest_bdd import parsers, then, when

import pico
from features.steps.library import World, _agent, _agent_tools

_TRIES = {
    "ask": "accept",
    "steer with": "steer",
    "follow up with": "follow_up",
    "leave for the next run": "next_run",
    "add the message": "append_message",
}


def _reopen(world: World) -> None:
    agent = _agent(world)
    world.harness = world.run(
        world.backend.open(provider=agent.provider, tools=_agent_tools(agent), clock=agent.clock)
    )


async def _settle_shutdown(world: World, shutdown: Any) -> None:
    agent = _agent(world)
    while not shutdown.done():
        agent.clock.advance(1.0)
        await asyncio.sleep(0)
    await shutdown
    if agent.driving is not None:
        await agent.driving  # the turn's own drive ends too ("closed" or "idle")


@when("the session shuts down and is opened again")
def shuts_down(world: World) -> None:
    async def run() -> None:
        await _settle_shutdown(world, asyncio.ensure_future(world.h.shutdown()))

    world.run(asyncio.wait_for(run(), 10))
    _reopen(world)


@when("the session starts shutting down")
def starts_shutting_down(world: World) -> None:
    async def start() -> None:
        world.shutdown = asyncio.ensure_future(world.h.shutdown())  # type: ignore[attr-defined]
        # The shutdown's one cancellation command is committed: every live task is marked.
        for _ in range(1000):
            await asyncio.sleep(0)
            live = (await world.h.tasks(live=True)).items
            if live and all(t.abort_requested for t in live):
                return
        raise AssertionError("the shutdown did not mark the live work")

    world.run(start())


@when(
    parsers.re(
        r"the user tries to (?P<how>ask|steer with|follow up with|leave for the next run|"
        r'add the message) "(?P<text>[^"]+)" in "(?P<conv>[^"]+)"$'
    )
)
def user_tries(world: World, how: str, text: str, conv: str) -> None:
    method = getattr(world.conv(conv), _TRIES[how])
    world.error = None
    try:
        world.run(method(text))
    except pico.PicoError as exc:
        world.error = exc


@when("the shutdown finishes and the session is opened again")
def shutdown_finishes(world: World) -> None:
    shutdown = world.shutdown  # type: ignore[attr-defined]
    world.run(asyncio.wait_for(_settle_shutdown(world, shutdown), 10))
    _reopen(world)


@when(
    parsers.parse(
        'the running tool of "{conv}" starts a subagent conversation "{child}" asked "{text}"'
    )
)
def starts_subagent(world: World, conv: str, child: str, text: str) -> None:
    async def start() -> None:
        page = await world.h.tasks(conversation_ids=[world.id(conv)], live=True, kind="tool")
        [tool] = page.items
        world.names[child] = await world.h.command(lambda tx: tx.create_owned_conversation(tool.id))
        world.names[text] = await world.conv(child).accept(text)
        for _ in range(50):  # the owner's drive starts the subagent's generation
            await asyncio.sleep(0)

    world.run(start())


@then(parsers.parse('"{question}" was cancelled by the shutdown'))
def cancelled_by_shutdown(world: World, question: str) -> None:
    root = world.run(world.h.root())
    result = world.run(root.result(world.id(question)))
    assert result == pico.InputResult("cancelled", None, "shutdown"), result


@then("no work is left in the session")
def no_work_left(world: World) -> None:
    assert not world.run(world.h.tasks(live=True)).items
