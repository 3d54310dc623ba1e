"""Steps for bad input (issue 10): values that are not JSON, ids that are not ids.

The phrases name the kind of bad value in the domain's words; the Python value behind each
is built here, so a reviewer can add an example row without writing Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pytest_bdd import parsers, then, when

from features.steps.library import World, _address


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


_BAD_VALUES: dict[str, Callable[[], Any]] = {
    "not a number": lambda: float("nan"),
    "infinity": lambda: float("inf"),
    "a pair of numbers": lambda: (1, 2),
    "a set of numbers": lambda: {1, 2},
    "raw bytes": lambda: b"plan",
    "a decimal number": lambda: Decimal("1.5"),
    "an object whose key is a number": lambda: {1: "a"},
    "an object holding a lone surrogate": lambda: {"text": "half \ud800 a pair"},
    "a list nested 201 levels deep": lambda: _nested(201),
}


@when(parsers.parse('"{conv}" tries to set "{name}" to {value}'))
def try_set_bad_value(world: World, conv: str, name: str, value: str) -> None:
    world.attempt(world.conv(conv).set_value(_address(world, name), _BAD_VALUES[value]()))


_BAD_MESSAGES: dict[str, Callable[[], dict[str, Any]]] = {
    "not a number": lambda: {"content": float("nan")},
    "a lone surrogate in its text": lambda: {"content": "half \udc00 a pair"},
    "metadata that is a list": lambda: {"content": "hello", "metadata": ["a"]},
    "metadata holding a lone surrogate key": lambda: {
        "content": "hello",
        "metadata": {"\ud83d": 1},
    },
}


@when(parsers.parse('"{conv}" tries to receive a message with {value}'))
def try_receive_bad_message(world: World, conv: str, value: str) -> None:
    message = _BAD_MESSAGES[value]()
    world.attempt(
        world.conv(conv).append("user", message["content"], metadata=message.get("metadata"))
    )


@when(parsers.parse('"{conv}" tries to compact through the id {ident}'))
def try_compact_through_id(world: World, conv: str, ident: str) -> None:
    through = json.loads(ident)  # true, 1.0, "1", 0, -1, 2**63: JSON spells each kind
    world.attempt(world.conv(conv).compact("summary", through=through))


@then(parsers.parse('the error names "{text}"'))
def error_names(world: World, text: str) -> None:
    assert world.error is not None, "the command was accepted"
    assert text in str(world.error), str(world.error)


@then(parsers.parse("the entry numbered {ident:d} is not found"))
def entry_not_found(world: World, ident: int) -> None:
    assert world.run(world.h.entry(ident)) is None


@then(parsers.parse("the task numbered {ident:d} is not found"))
def task_not_found(world: World, ident: int) -> None:
    assert world.run(world.h.task(ident)) is None
