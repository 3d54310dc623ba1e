"""Steps for watching a conversation (§9.4): a watcher's first view and the commits it
sees after it, a command being committed while a watch registers (held inside its builder
until the scenario lets it finish), a watcher that reads nothing, one that fails.

Entries are named by their content (the library's message steps append the name)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import World, _names
from pico.application.watch import WatchBase, WatchCommit, WatchEvent, WatchSignal, WatchStream


@dataclass
class Watcher:
    events: list[WatchEvent] = field(default_factory=list)
    fails: bool = False
    stream: WatchStream | None = None

    def __call__(self, event: WatchEvent) -> None:
        self.events.append(event)
        if self.fails and isinstance(event, WatchCommit):
            raise RuntimeError("the watcher failed")


@dataclass
class InFlight:
    task: asyncio.Future[Any]
    release: asyncio.Event
    name: str


def _watchers(world: World) -> dict[str, Watcher]:
    found: dict[str, Watcher] | None = getattr(world, "watchers", None)
    if found is None:
        found = {}
        world.watchers = found  # type: ignore[attr-defined]
    return found


def _watcher(world: World, name: str) -> Watcher:
    watcher = _watchers(world).get(name)
    if watcher is None:
        raise AssertionError(f"no watcher is called {name!r} in this scenario")
    return watcher


def _entry_names(world: World, commit: WatchCommit) -> list[str]:
    return [
        world.alias(int(str(change.payload["seq"])))
        for change in commit.changes
        if change.event == "Conversation.EntryAppended"
    ]


def _commits(world: World, watcher: Watcher) -> str:
    return "; ".join(
        " + ".join(_entry_names(world, e)) for e in watcher.events if isinstance(e, WatchCommit)
    )


# ------------------------------------------------------------------ Given


@given(parsers.parse('the session has another conversation "{name}"'))
def another_conversation(world: World, name: str) -> None:
    world.names[name] = world.run(world.h.command(lambda tx: tx.create_conversation()))


@given(parsers.parse('a command appending "{name}" to "{conv}" is being committed'))
def in_flight(world: World, name: str, conv: str) -> None:
    cid = world.id(conv)

    async def start() -> InFlight:
        building, release = asyncio.Event(), asyncio.Event()

        async def build(tx: pico.Command) -> int:
            entry = tx.append_entry(cid, "user", name)  # its number is final already
            building.set()
            await release.wait()
            return entry

        task: asyncio.Future[int] = asyncio.ensure_future(world.h.command(build))
        await asyncio.wait_for(building.wait(), 10)
        return InFlight(task, release, name)

    world.in_flight = world.run(start())  # type: ignore[attr-defined]


# ------------------------------------------------------------------ When


@when(parsers.parse('"{name}" watches "{conv}"'))
def watches(world: World, name: str, conv: str) -> None:
    watcher = _watchers(world)[name] = Watcher()
    world.h.watch(world.id(conv), watcher)


@when(parsers.parse('"{name}" watches "{conv}" and fails on every commit'))
def watches_and_fails(world: World, name: str, conv: str) -> None:
    watcher = _watchers(world)[name] = Watcher(fails=True)
    world.h.watch(world.id(conv), watcher)


@when(parsers.parse('"{name}" watches "{conv}" without reading, with room for {room:d} events'))
def watches_without_reading(world: World, name: str, conv: str, room: int) -> None:
    async def open_stream() -> WatchStream:
        return world.h.watch(world.id(conv), buffer=room)

    _watchers(world)[name] = Watcher(stream=world.run(open_stream()))


@when("the command being committed completes")
def completes(world: World) -> None:
    flight: InFlight = world.in_flight  # type: ignore[attr-defined]

    async def finish() -> int:
        flight.release.set()
        entry: int = await asyncio.wait_for(flight.task, 10)
        return entry

    world.names[flight.name] = world.run(finish())


# ------------------------------------------------------------------ Then


@then(parsers.parse('"{name}" first sees the transcript "{names}"'))
def first_sees(world: World, name: str, names: str) -> None:
    watcher = _watcher(world, name)
    assert watcher.events, f"{name} was given nothing"
    base = watcher.events[0]
    assert isinstance(base, WatchBase), base
    seen = [world.alias(e.id) for e in base.entries]
    assert seen == _names(names), f"{name} first saw {seen}"


@then(parsers.parse('"{name}" saw the commits "{commits}"'))
def saw_commits(world: World, name: str, commits: str) -> None:
    seen = _commits(world, _watcher(world, name))
    assert seen == commits, f"{name} saw the commits {seen!r}"


@then(parsers.parse('"{name}" saw the commits "{commits}" and was told to rebind'))
def saw_then_rebind(world: World, name: str, commits: str) -> None:
    watcher = _watcher(world, name)
    stream = watcher.stream
    assert stream is not None, f"{name} watches with a listener, not a stream"

    async def read_to_the_end() -> None:
        # Only a stream that was told to rebind ends by itself: a live one times out.
        watcher.events.extend([e async for e in stream])

    world.run(asyncio.wait_for(read_to_the_end(), 10))
    assert _commits(world, watcher) == commits, _commits(world, watcher)
    last = watcher.events[-1]
    assert isinstance(last, WatchSignal) and last.kind == "rebind", last


@then(parsers.parse('"{name}" was told that it failed'))
def told_failed(world: World, name: str) -> None:
    signals = [e for e in _watcher(world, name).events if isinstance(e, WatchSignal)]
    assert [s.kind for s in signals] == ["handler_error"], signals
    assert "the watcher failed" in signals[0].detail
