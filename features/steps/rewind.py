"""Steps for rewinding a conversation (§9.1): rewind while the agent works, keep the work
running, refuse a target inside a commit. The fake clock moves while the rewind drains,
so a tool that sleeps on it still finishes its cleanup."""

from __future__ import annotations

import asyncio
from typing import Any

from pytest_bdd import parsers, then, when

from features.steps.library import World, _agent


def _rewind(world: World, conv: str, new: str, **options: Any) -> None:
    agent = _agent(world)

    async def run() -> int:
        rewinding = asyncio.ensure_future(world.conv(conv).rewind(**options))
        while not rewinding.done():
            agent.clock.advance(1.0)
            await asyncio.sleep(0)
        return (await rewinding).id

    world.names[new] = world.run(asyncio.wait_for(run(), 10))


@when(parsers.parse('"{conv}" is rewound to entry "{entry}" as "{new}"'))
def rewound(world: World, conv: str, entry: str, new: str) -> None:
    _rewind(world, conv, new, at_entry=world.id(entry))


@when(parsers.parse('"{conv}" is rewound to entry "{entry}" as "{new}", keeping its work running'))
def rewound_keeping_work(world: World, conv: str, entry: str, new: str) -> None:
    _rewind(world, conv, new, at_entry=world.id(entry), keep_running=True)


@when(parsers.parse('"{conv}" tries to rewind to the sequence number of "{entry}"'))
def tries_to_rewind_inside(world: World, conv: str, entry: str) -> None:
    world.attempt(world.conv(conv).rewind(as_of=world.id(entry)))


def _live(world: World, conv: str) -> list[Any]:
    page = world.run(world.h.tasks(conversation_ids=[world.id(conv)], live=True, limit=100))
    return list(page.items)


@then(parsers.parse('"{conv}" has no work left'))
def no_work_left_in(world: World, conv: str) -> None:
    assert _live(world, conv) == []


@then(parsers.parse('nothing in "{conv}" is marked for cancellation'))
def nothing_marked(world: World, conv: str) -> None:
    live = _live(world, conv)
    assert live and not any(t.abort_requested for t in live), live


@then(parsers.parse('the work of "{conv}" had settled before "{new}" was made'))
def settled_before(world: World, conv: str, new: str) -> None:
    page = world.run(world.h.tasks(conversation_ids=[world.id(conv)], limit=100))
    assert page.items and all(t.role == "terminal" for t in page.items)
    assert world.id(new) > max(t.updated_seq for t in page.items)
