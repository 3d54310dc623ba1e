"""Steps for a collapse interrupted by a crash (§8.5): the owner goes away after (or
before) the summary was recorded, and the next owner finishes the collapse."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import World
from pico.infrastructure.container import open_storage
from tests.contract.test_collapse_recovery import DiesBeforePublishing, Summarizer


def _die() -> None:
    raise OSError("the owner went away before the summary was published")


@dataclass
class Collapsing:
    storage: DiesBeforePublishing
    summarizer: Summarizer
    go_away_after_recording: bool = False
    driving: Any = None


def _collapsing(world: World) -> Collapsing:
    found = world.addresses.get("collapsing")
    assert isinstance(found, Collapsing), "the scenario has no summarizer session"
    return found


@given(
    parsers.parse('a session with conversation "{name}" and a summarizer'),
    target_fixture="world",
)
def a_summarizer_session(world: World, name: str) -> World:
    backend = world.backend
    storage = DiesBeforePublishing(
        open_storage(backend.url, session=backend.session, durability=None, read_only=False),
        _die,
    )
    summarizer = Summarizer()
    world.addresses["collapsing"] = Collapsing(storage, summarizer)
    world.harness = world.run(pico.Harness.open(storage, provider=summarizer))
    world.names[name] = world.run(world.h.root()).id
    return world


@given(
    parsers.parse(
        'the summarizer will answer "{text}" at a cost of {tokens_in:d} input and '
        "{tokens_out:d} output tokens"
    )
)
def summarizer_answers(world: World, text: str, tokens_in: int, tokens_out: int) -> None:
    summarizer = _collapsing(world).summarizer
    summarizer.text = text
    summarizer.usage = pico.Usage(tokens_in, tokens_out)


@given("the summarizer will not answer")
def summarizer_hangs(world: World) -> None:
    _collapsing(world).summarizer.hold = True


@given("the owner will go away right after the summary is recorded")
def go_away_after_recording(world: World) -> None:
    _collapsing(world).go_away_after_recording = True


@given("a collapse may ask the model only once")
def collapse_asks_once(world: World) -> None:
    services = world.h.services
    assert services is not None
    services.max_attempts = 1  # captured by the collapse when it is created


@when(parsers.parse('"{conv}" starts the collapse "{name}"'))
def starts_collapse(world: World, conv: str, name: str) -> None:
    collapsing = _collapsing(world)
    world.names[name] = world.run(world.conv(conv).collapse())
    if collapsing.go_away_after_recording:
        collapsing.storage.watch = world.names[name]

    async def start() -> None:
        collapsing.driving = asyncio.ensure_future(world.conv(conv).drive())
        # Until the summarizer hangs, or the publication after the recorded summary fails.
        while not (collapsing.driving.done() or collapsing.summarizer.started.is_set()):
            await asyncio.sleep(0)
        while not collapsing.driving.done() and not collapsing.summarizer.hold:
            await asyncio.sleep(0)

    world.run(asyncio.wait_for(start(), 10))


@when("the owner goes away")
def owner_goes_away(world: World) -> None:
    collapsing = _collapsing(world)
    if world.h.faulted is not None:  # the publication after the recorded summary failed
        assert collapsing.storage.armed, world.h.faulted
    else:
        (collapse,) = world.run(world.h.tasks(kind="collapse", limit=5)).items
        assert collapse.status == "summarizing", "the collapse finished before its owner left"
    world.run(world.h.close())  # nothing more is settled: the collapse stays in flight
    with contextlib.suppress(pico.PicoError):  # a publication that never committed
        world.run(asyncio.wait_for(collapsing.driving, 10))
    world.harness = None


@when("the session is opened again with a new summarizer")
def reopened_with_summarizer(world: World) -> None:
    reopened_answering(world, "a summary nobody asked for", 1, 1)


@when(
    parsers.parse(
        'the session is opened again with a new summarizer that will answer "{text}" at a '
        "cost of {tokens_in:d} input and {tokens_out:d} output tokens"
    )
)
def reopened_answering(world: World, text: str, tokens_in: int, tokens_out: int) -> None:
    collapsing = _collapsing(world)
    collapsing.summarizer = Summarizer(text, pico.Usage(tokens_in, tokens_out))
    world.harness = world.run(world.backend.open(provider=collapsing.summarizer))


@then(parsers.parse('the context of "{conv}" starts with the summary "{text}"'))
def context_starts_with_summary(world: World, conv: str, text: str) -> None:
    first = world.run(world.conv(conv).context_entries())[0]
    assert first.kind == "summary" and first.content == text, first


@then(parsers.parse("the summarizer was asked {count:d} times"))
def summarizer_asked(world: World, count: int) -> None:
    assert len(_collapsing(world).summarizer.requests) == count


@then(
    parsers.parse('the collapse "{name}" cost {tokens_in:d} input and {tokens_out:d} output tokens')
)
def collapse_cost(world: World, name: str, tokens_in: int, tokens_out: int) -> None:
    task = world.run(world.h.task(world.id(name)))
    assert task is not None and isinstance(task.state, dict)
    assert task.state["usage"] == {"input": tokens_in, "output": tokens_out}
