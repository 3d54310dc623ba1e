"""Steps for a fork's initialization (§4.3, §9.1): which sticky values a fork copies from
its source, which it is given, and what is refused. The scenario builds the
initialization step by step; the fork step (or its attempt) constructs it, so a refused
value is reported like any other rejected command."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_bdd import parsers, when

import pico
from features.steps.library import World, _address, _json, _names


@dataclass
class PendingInitialization:
    inherit: list[str] = field(default_factory=list)
    set: list[tuple[str, Any]] = field(default_factory=list)

    def build(self, world: World) -> pico.Initialization:
        return pico.Initialization(
            inherit=[_address(world, n) for n in self.inherit],
            set=[(_address(world, n), v) for n, v in self.set],
        )


@pytest.fixture
def pending_initialization() -> PendingInitialization:
    return PendingInitialization()


@when(parsers.parse('a fork initialization copies "{names}"'))
def initialization_copies(pending_initialization: PendingInitialization, names: str) -> None:
    pending_initialization.inherit.extend(_names(names))


@when(parsers.parse('the initialization sets "{name}" to {value}'))
def initialization_sets(
    pending_initialization: PendingInitialization, name: str, value: str
) -> None:
    pending_initialization.set.append((name, _json(value)))


async def _fork(
    world: World, pending: PendingInitialization, source: str, entry: str
) -> pico.ConversationHandle:
    init = pending.build(world)  # inside the attempt: a refused value is the command's error
    return await world.conv(source).fork(at_entry=world.id(entry), sticky=init)


@when(
    parsers.parse('"{new}" is forked from "{source}" at entry "{entry}" with that initialization')
)
def fork_initialized(
    world: World,
    pending_initialization: PendingInitialization,
    new: str,
    source: str,
    entry: str,
) -> None:
    world.names[new] = world.run(_fork(world, pending_initialization, source, entry)).id


@when(
    parsers.parse('a fork of "{source}" at entry "{entry}" with that initialization is attempted')
)
def try_fork_initialized(
    world: World, pending_initialization: PendingInitialization, source: str, entry: str
) -> None:
    world.attempt(_fork(world, pending_initialization, source, entry))
