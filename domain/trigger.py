"""Triggering a domain event without the library's per-event overhead.

``eventsourcing``'s ``trigger_event`` copies its keyword arguments, builds the event
through the frozen dataclass ``__init__`` (an ``object.__setattr__`` call per field),
then ``mutate`` checks the id and version it has just set. An agent turn triggers ~30
events, and that construction is ~25,000 instructions of each (callgrind, memory
backend). ``trigger_event`` below builds the same event: its ``__dict__`` filled in the
dataclass's field order (so ``vars(event)``, and with it the stored body, is identical),
a default for an omitted field, ``TypeError`` for a missing or unknown one, then the
event's own ``apply`` and the version and ``modified_on`` updates ``mutate`` makes. The
aggregates (Session, Conversation, Task) use it as their ``trigger_event``; the library's
``@event`` methods reach it too. ``tests/unit/test_trigger.py`` holds it to the library's
result for every event type the aggregates trigger.

A command's events share one timestamp (``stamp_command``): they are committed together,
and one clock reading a command, not one an event, is what an agent turn's ~38 events
cost in ``datetime.now`` and (in the codec) ``isoformat``.
"""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar, Token
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

__all__ = [
    "CommandStamp",
    "command_stamp",
    "create_aggregate",
    "stamp_command",
    "trigger_event",
    "unstamp_command",
]

_MISSING: Any = dataclasses.MISSING
#: Per event class: its body fields in order, each with its default and default factory.
_LAYOUT: dict[type, tuple[tuple[str, Any, Any], ...]] = {}
_RECORD = ("originator_id", "originator_version", "timestamp")
#: Per event class: its body field names, as a set and in order.
_NAMES: dict[type, tuple[frozenset[str], tuple[str, ...]]] = {}
#: Per aggregate class: its topic (the created event's ``originator_topic``).
_TOPICS: dict[type, str] = {}


#: The command being built in this context: a box holding its timestamp. A context
#: variable, so commands of two asyncio tasks (two sessions on one loop) never share one;
#: a box, emptied when its command ends, because an asyncio task created inside a command
#: inherits the variable: it then reads an empty box and the clock, never a stale stamp.
_STAMP: ContextVar[list[datetime | None] | None] = ContextVar("pico_command_stamp", default=None)
_EVENT = Aggregate.Event  # whose clock (``create_timestamp``) every event reads


#: What ``stamp_command`` hands its caller for ``unstamp_command``: the box and the token.
CommandStamp = tuple[list[datetime | None], Token[list[datetime | None] | None]]


def stamp_command() -> CommandStamp:
    """Read the clock once for the command about to be built: every event triggered in
    this context until ``unstamp_command`` carries that reading (unless given its own
    timestamp). Nested commands (a builder awaiting another session's command) stamp
    their own and restore the outer one."""
    box: list[datetime | None] = [_EVENT.create_timestamp()]
    return box, _STAMP.set(box)


def unstamp_command(stamp: CommandStamp) -> None:
    box, token = stamp
    box[0] = None
    # A command coroutine the loop abandoned is finalised by the garbage collector, in
    # another context, where the token does not apply: its box is emptied all the same.
    try:  # noqa: SIM105 (a context manager per command costs more)
        _STAMP.reset(token)
    except ValueError:
        pass


def command_stamp() -> datetime | None:
    """The timestamp of the command being built in this context, if one is."""
    box = _STAMP.get()
    return None if box is None else box[0]


def _layout(event_class: type) -> tuple[tuple[str, Any, Any], ...]:
    layout = _LAYOUT.get(event_class)
    if layout is None:
        names = [f.name for f in dataclasses.fields(event_class)]
        if names[:3] != list(_RECORD):  # not the library's event layout: never guess
            raise TypeError(f"{event_class.__qualname__} does not start with {_RECORD}")
        layout = _LAYOUT[event_class] = tuple(
            (f.name, f.default, f.default_factory)
            for f in dataclasses.fields(event_class)
            if f.name not in _RECORD
        )
    return layout


def _fill(body: dict[str, Any], event_class: type, kwargs: dict[str, Any]) -> None:
    """The event's body fields from ``kwargs`` in the dataclass's order, with defaults;
    ``TypeError`` for a missing or unknown field, as the dataclass ``__init__`` raises."""
    used = 0
    for name, default, factory in _layout(event_class):
        if name in kwargs:
            body[name] = kwargs[name]
            used += 1
        elif default is not _MISSING:
            body[name] = default
        elif factory is not _MISSING:
            body[name] = factory()
        else:
            raise TypeError(f"Can't construct event {event_class}: missing field {name!r}")
    if used != len(kwargs):
        known = {name for name, _, _ in _layout(event_class)}
        unknown = sorted(set(kwargs) - known)
        raise TypeError(f"Can't construct event {event_class}: unexpected fields {unknown}")


def create_aggregate(aggregate_class: Any, event_class: Any, **kwargs: Any) -> Any:
    """The library's ``BaseAggregate._create`` for an aggregate whose ``__init__`` is its
    created event's ``@event`` method, called with keywords only (Task, Conversation): the
    id from ``create_id``, the created event with the aggregate's topic, then what the
    event's ``mutate`` does (``__base_init__``, the ``__init__`` body, ``apply``). The
    library's version copies and filters its keywords twice and builds the event through
    the frozen dataclass ``__init__``: most of a task creation, five per agent turn."""
    originator_id = aggregate_class.create_id(**kwargs)
    if not isinstance(originator_id, UUID):
        raise TypeError(f"{aggregate_class.__qualname__}.create_id returned {originator_id!r}")
    box = _STAMP.get()  # the command's timestamp (inline: this is the hot path)
    stamp = (
        kwargs.pop("timestamp", None)
        or (box is not None and box[0])
        or event_class.create_timestamp()
    )
    event = object.__new__(event_class)
    body = event.__dict__
    body["originator_id"] = originator_id
    body["originator_version"] = aggregate_class.INITIAL_VERSION
    body["timestamp"] = stamp
    topic = _TOPICS.get(aggregate_class)
    if topic is None:
        topic = _TOPICS[aggregate_class] = get_topic(aggregate_class)
    fields = {"originator_topic": topic, **kwargs}
    if tuple(fields) == _names(event_class)[1]:  # every field, in the field order
        body.update(fields)
    else:
        _fill(body, event_class, fields)
    agg = object.__new__(aggregate_class)
    agg.__base_init__(originator_id, aggregate_class.INITIAL_VERSION, stamp)
    agg.__init__(**kwargs)
    event.apply(agg)
    agg._pending_events.append(event)
    return agg


def _names(event_class: type) -> tuple[frozenset[str], tuple[str, ...]]:
    names = _NAMES.get(event_class)
    if names is None:
        order = tuple(name for name, _, _ in _layout(event_class))
        names = _NAMES[event_class] = (frozenset(order), order)
    return names


def trigger_event(self: Any, event_class: Any, **kwargs: Any) -> None:
    """The library's ``BaseAggregate.trigger_event`` (no explicit ``TOPIC`` in pico)."""
    originator_id = self._id
    if not isinstance(originator_id, UUID):  # the library event's __post_init__ check
        raise TypeError(
            f"{event_class} was initialized with a non-UUID originator_id: {originator_id!r}"
        )
    version = self._version + 1
    box = _STAMP.get()  # the command's timestamp (inline: this is the hot path)
    stamp = (
        kwargs.pop("timestamp", None)
        or (box is not None and box[0])
        or event_class.create_timestamp()
    )
    event = object.__new__(event_class)
    body = {"originator_id": originator_id, "originator_version": version, "timestamp": stamp}
    given, order = _NAMES.get(event_class) or _names(event_class)
    if tuple(kwargs) == order:  # every field given in the field order (most calls)
        body.update(kwargs)
    elif kwargs.keys() == given:  # every field given (the aggregates' own calls): no defaults
        for name in order:
            body[name] = kwargs[name]
    else:
        _fill(body, event_class, kwargs)
    object.__setattr__(event, "__dict__", body)
    event.apply(self)  # as the library's mutate: apply before the version moves
    self._version = version
    self._modified_on = stamp
    self._pending_events.append(event)
