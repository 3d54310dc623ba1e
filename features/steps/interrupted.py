"""Steps for a stream interrupted by a crash (§8.3): the owner goes away mid-stream and
the next owner recovers the generation it left streaming."""

from __future__ import annotations

import asyncio

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import Agent, World, _agent


def _frames(world: World) -> pico.WorkingList[str]:
    (generation,) = world.run(world.h.tasks(kind="generation", limit=1)).items
    return pico.working_list("pico.frames", str, scope=pico.working_scope(f"task/{generation.id}"))


def _saved(world: World, frames: pico.WorkingList[str]) -> str:
    page = world.run(world.h.read_list(frames, limit=100))
    return "".join(e.value for e in page.items)


@given(parsers.parse("the model will answer a story of {chars:d} characters"))
def model_tells_story(world: World, chars: int) -> None:
    _agent(world).provider.script.append(("once upon a time " * chars)[:chars])


@given("the model may be asked only once per turn")
def model_asked_once_per_turn(world: World) -> None:
    services = world.h.services
    assert services is not None
    services.max_attempts = 1  # captured by the turn's generation when it is accepted


@when(parsers.parse('"{conv}" streams until {chars:d} characters of the answer are saved'))
def streams_until_saved(world: World, conv: str, chars: int) -> None:
    agent = _agent(world)
    frames = _frames(world)
    while len(_saved(world, frames)) < chars:
        assert not agent.driving.done(), "the answer finished before it was interrupted"
        agent.clock.advance(1.0)
        world.run(asyncio.sleep(0))
    world.addresses["saved"] = _saved(world, frames)
    world.addresses["frames"] = frames


@when("the owner goes away mid-stream")
def owner_goes_away(world: World) -> None:
    agent = _agent(world)
    world.run(world.h.close())  # nothing is settled: the generation stays streaming
    world.run(asyncio.wait_for(agent.driving, 10))
    world.harness = None


@when("the session is opened again with a new model")
def reopened_with_new_model(world: World) -> None:
    reopened_with_model(world, None)


@when(parsers.parse('the session is opened again with a new model that will answer "{text}"'))
def reopened_with_model(world: World, text: str | None) -> None:
    clock = pico.FakeClock()
    script = [text] if text is not None else ["a made-up answer"]
    agent = Agent(pico.FauxProvider(script, chunk_chars=4, cadence=1.0, clock=clock), clock)
    world.agent = agent
    world.harness = world.run(world.backend.open(provider=agent.provider, clock=clock))


@then(parsers.parse('"{question}" is interrupted with the saved part of the answer'))
def saved_part_is_the_answer(world: World, question: str) -> None:
    conv = pico.ConversationHandle(world.h, world.run(world.h.root()).id)
    result = world.run(conv.result(world.id(question)))
    assert result is not None and result.status == "interrupted", result
    entry = world.run(world.h.entry(result.entry_id))
    assert entry is not None and entry.content == {"text": world.addresses["saved"]}
    assert entry.metadata is not None and entry.metadata["interrupted"] is True
    assert world.run(world.h.read_list(world.addresses["frames"])).items == ()
