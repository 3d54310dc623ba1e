"""The event codec: domain events to stored bodies and back, with class versions,
upcasting and schema validation before anything is folded.

Every stored event type has a version: its class's ``class_version`` (1 when the class
does not set one; the library writes ``"class_version"`` into a body only above 1). A
change to an event's shape bumps it and adds ``upcast_vN_vN+1(state)`` on the class, so an
old stored body reads as the current shape (eventsourcing's own convention, applied on
both decoding paths below). ``tests/contract/test_event_versions.py`` holds the catalogue of
every event type's version and fields: a shape change without a bump fails it.

A decoded body is validated against its class's fields before it becomes an event: the
exact set of field names, and each value's JSON type (``int``, ``str``, ``bool``,
``float``, ``X | None``, ``list[...]``, ``dict[...]``). A body that does not match raises
``EventSchemaError``; storage reports it as ``StorageCorruptError`` with its position, so
a damaged or foreign body is never folded (seed 000, "Reserved and not yet wired").
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import fields, is_dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import pydantic_core
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import (
    DatetimeAsISO,
    JSONTranscoder,
    Mapper,
    StoredEvent,
    UUIDAsHex,
)
from eventsourcing.utils import get_topic, resolve_topic
from pydantic_core import SchemaSerializer, core_schema

from pico.domain.ids import stream_uuid

__all__ = ["EventSchemaError", "event_schema", "make_mapper", "stored_event", "validate_state"]

#: Fields every event has, set from the stored record's columns, not its body.
_RECORD_FIELDS = frozenset({"originator_id", "originator_version"})


_new = object.__new__
_UNKNOWN = object()  # a class the mapper has not classified yet


def stored_event(
    originator_id: UUID | str, originator_version: int, topic: str, state: bytes
) -> StoredEvent:
    """``StoredEvent(originator_id, originator_version, topic, state)`` without the frozen
    dataclass ``__init__`` (an ``object.__setattr__`` per field: 0.63 against 1.05 us).
    Equal, hashing and printing alike; every commit's events and boundary are made with
    it. Filled key by key into the instance's own (key-sharing) dict: a new dict set as
    ``__dict__`` took 280 bytes an event against 207, and the memory backend keeps them."""
    event = _new(StoredEvent)
    fields = event.__dict__
    fields["originator_id"] = originator_id
    fields["originator_version"] = originator_version
    fields["topic"] = topic
    fields["state"] = state
    return event


class EventSchemaError(ValueError):
    """A stored body that does not match its event type's fields (names and JSON types)."""


def make_mapper() -> _PlainEventMapper:
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    return _PlainEventMapper(transcoder=transcoder)


#: A body's opening up to its timestamp's ISO text: the transcoder's tagged datetime.
_STAMP_OPENING = b'{"timestamp":{"_type_":"' + DatetimeAsISO.name.encode() + b'","_data_":"'


# Field annotations whose values the JSON transcoder writes as plain JSON (no transcoding).
_PLAIN_TYPE = re.compile(r"^(?:int|str|bool|float|None|list|dict|\[|\]|,|\||\s)*$")


class _PlainEventMapper(Mapper[UUID]):
    """eventsourcing's mapper, with a faster encoder for event classes whose fields are all
    plain JSON plus the timestamp: pydantic-core's serializer (already a dependency) writes
    the same JSON as the transcoder's ``json`` encoder in ~half the time (every command
    maps ~4 events), from the event's own attribute dict (a serializer a class, which
    leaves the record fields out: no copy of the dict). Floats may be spelled differently
    (``1e-07`` vs ``1e-7``), which decodes to the same value. Snapshots, other classes and
    events not in their class's shape are written by ``_tagged`` (pydantic-core again,
    the transcoder's tags made by hand, every value checked); any value either refuses
    takes the transcoder as before. Both decoding paths upcast and validate."""

    def __init__(self, transcoder: JSONTranscoder) -> None:
        super().__init__(transcoder=transcoder)
        self._tags = transcoder.types  # the types the transcoder writes tagged: exact type
        # class -> _plain_encoding(class), None: not plain
        self._plain: dict[type, Any] = {}
        self._plain_classes: dict[str, Any] = {}  # topic -> plain class, None: not plain
        # The command's timestamp and the body's opening with it, made once.
        self._last_stamp: tuple[datetime | None, bytes] = (None, b"")

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        return self.to_stored_events((domain_event,))[0]

    def _stamped(self, stamp: datetime) -> tuple[datetime, bytes]:
        """A new command timestamp and the opening of a body with it (transcoded), made
        once and kept. One tuple, replaced whole: threads may share the mapper."""
        # The ISO text is digits, '-', ':', 'T', '.' and '+' only: no JSON escape, so it
        # is spliced in as it is (the bytes ``to_json`` of the transcoded dict wrote,
        # without the dict and the call: once a command).
        last = (stamp, _STAMP_OPENING + stamp.isoformat().encode("ascii") + b'"}')
        self._last_stamp = last
        return last

    def to_stored_events(self, domain_events: Sequence[Any]) -> list[StoredEvent]:
        """``to_stored_event`` of each event, in one call: a command's events are encoded
        together (the loop inline, not a method call an event)."""
        plain_of = self._plain
        out: list[StoredEvent] = []
        append = out.append
        for domain_event in domain_events:
            cls = type(domain_event)
            plain = plain_of.get(cls, _UNKNOWN)
            if plain is _UNKNOWN:
                plain = plain_of[cls] = _plain_encoding(cls)
            if plain is None:
                append(self._tagged(domain_event))
                continue
            topic, serializer, count, tail = plain
            body = domain_event.__dict__
            stamp = body.get("timestamp")
            if (
                type(stamp) is datetime
                and len(body) == count
                # The timestamp is the body's first field: the record fields lead an
                # event made by its class, a decoded one holds them last.
                and next(iter(body)) in _LEADING
            ):
                # A command's events share one timestamp object (domain/trigger.py): the
                # body's opening with it is made once.
                last = self._last_stamp
                if last[0] is not stamp:
                    last = self._stamped(stamp)
                try:
                    # The fields after the timestamp, in the body's order (the record
                    # fields and the timestamp excluded: no copy of the dict).
                    rest = serializer.to_json(body)
                except Exception:  # e.g. a lone surrogate: the transcoder decides
                    append(super().to_stored_event(domain_event))
                    continue
                data = (last[1] + b"," + rest[1:-1] if len(rest) > 2 else last[1]) + tail
                # stored_event(...), inline: a call an event.
                stored = _new(StoredEvent)
                record = stored.__dict__
                record["originator_id"] = body["originator_id"]
                record["originator_version"] = body["originator_version"]
                record["topic"] = topic
                record["state"] = data
                append(stored)
                continue
            # Not in its class's shape (a decoded event, an extra attribute): the way of
            # a class that is not plain, which checks every value.
            append(self._tagged(domain_event))
        return out

    def _tagged(self, domain_event: Any) -> StoredEvent:
        """An event the fast encoder does not write (one of a class that is not plain, a
        snapshot above all: a conversation's copies its whole context; or a plain class's
        event not in its class's shape) as the library's mapper writes it, in a sixth of
        the time on a long conversation: the values the transcoder would tag (a datetime, a
        UUID) at the body's top level and its state's are tagged here, and pydantic-core
        writes the rest once it is known to be plain JSON (``_plain_json``). Any other
        value anywhere (a UUID deeper down, a tuple, an ``IntEnum``, a dict with int keys)
        sends the event the library's way."""
        if self.compressor is not None or self.cipher is not None:
            return super().to_stored_event(domain_event)
        body = dict(vars(domain_event))
        originator_id = body.pop("originator_id")
        originator_version = body.pop("originator_version")
        version = getattr(type(domain_event), "class_version", 1)
        if version > 1:
            body["class_version"] = version
        state = body.get("state")
        if type(state) is dict:
            body["state"] = self._tag(state)
        body = self._tag(body)
        if not _plain_json(body.values()):  # not plain JSON: the transcoder decides
            return super().to_stored_event(domain_event)
        try:
            # NaN and the infinities as ``json`` writes them, not null.
            data = pydantic_core.to_json(body, inf_nan_mode="constants")
        except Exception:  # e.g. a lone surrogate: the transcoder decides (and explains)
            return super().to_stored_event(domain_event)
        return stored_event(originator_id, originator_version, get_topic(type(domain_event)), data)

    def _tag(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with each value of a type the transcoder tags in its tagged form
        (what its ``default`` hook returns); a copy only when there is one."""
        tags = self._tags
        out = values
        for key, value in values.items():
            transcoding = tags.get(type(value))
            if transcoding is not None:
                if out is values:
                    out = dict(values)
                out[key] = {"_type_": transcoding.name, "_data_": transcoding.encode(value)}
        return out

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """The library's decoding, faster for plain classes: pydantic-core parses the body
        (the timestamp is its only transcoded value, so a body holding exactly one
        ``"_type_"`` marker needs no object hook); anything else decodes as before. Opening
        a JSONL journal decodes every stored event, so this is most of its cost."""
        topic = stored_event.topic
        cls = self._plain_classes.get(topic)
        if cls is None:
            if topic in self._plain_classes:  # known not plain
                return self._library(stored_event)
            resolved = resolve_topic(topic)
            cls = resolved if _plain_topic(resolved) == topic else None
            self._plain_classes[topic] = cls
            if cls is None:
                return self._library(stored_event)
        body = stored_event.state
        if body.count(b'"_type_"') != 1:
            return self._library(stored_event)
        try:
            state = pydantic_core.from_json(body)
            stamp = state["timestamp"]
            if len(stamp) != 2 or stamp.get("_type_") != DatetimeAsISO.name:
                return self._library(stored_event)
            state["timestamp"] = datetime.fromisoformat(stamp["_data_"])
        except EventSchemaError:
            raise
        except Exception:  # the library's decoding explains what is wrong
            return self._library(stored_event)
        try:
            _upcast(cls, state)
            validate_state(cls, state)
        except EventSchemaError as exc:
            raise EventSchemaError(
                f"{exc} (stream {stored_event.originator_id} version "
                f"{stored_event.originator_version})"
            ) from None
        oid = stored_event.originator_id
        state["originator_id"] = stream_uuid(oid)
        state["originator_version"] = stored_event.originator_version
        event = object.__new__(cls)
        object.__setattr__(event, "__dict__", state)
        return event

    def _library(self, stored: StoredEvent) -> Any:
        """The library's decoding (it runs the same upcast_vN_vN+1 methods), with the
        refusal of a newer version and the schema check the fast path applies."""
        if b'"class_version"' in stored.state:
            try:
                recorded = json.loads(stored.state).get("class_version", 1)
            except (ValueError, AttributeError):
                recorded = 1  # the library explains an unreadable body
            current = getattr(resolve_topic(stored.topic), "class_version", 1)
            if type(recorded) is int and recorded > current:
                raise EventSchemaError(
                    f"{stored.topic} body has class_version {recorded}; this pico reads "
                    f"versions 1 to {current} (a newer pico wrote it: upgrade pico) (stream "
                    f"{stored.originator_id} version {stored.originator_version})"
                )
        event = super().to_domain_event(stored)
        try:
            validate_state(type(event), vars(event))
        except EventSchemaError as exc:
            raise EventSchemaError(
                f"{exc} (stream {stored.originator_id} version {stored.originator_version})"
            ) from None
        return event


def _upcast(cls: Any, state: dict[str, Any]) -> None:
    """eventsourcing's upcasting, as its mapper does it: ``upcast_vN_vN+1`` from the
    body's recorded version (1 when absent) to the class's."""
    version = getattr(cls, "class_version", 1)
    stored = state.pop("class_version", 1)
    if type(stored) is not int or stored < 1 or stored > version:
        raise EventSchemaError(
            f"{cls.__qualname__} body has class_version {stored!r}; this pico reads "
            f"versions 1 to {version} (a newer pico wrote it: upgrade pico)"
        )
    while stored < version:
        getattr(cls, f"upcast_v{stored}_v{stored + 1}")(state)
        stored += 1


#: The exact types a plain JSON value is made of: pydantic-core's inference writes each as
#: the library's ``json`` encoder does (a float's exponent aside, ``_plain_json``).
_SCALARS = frozenset({str, int, bool, float, type(None)})
_CONTAINERS = _SCALARS | {list, dict}
_KEYS = frozenset({str})
#: Deeper than this, a value is left to the transcoder (which has its own limit).
_PLAIN_DEPTH = 64


def _plain_json(values: Collection[Any], depth: int = 0) -> bool:
    """Are ``values`` plain JSON of exact built-in types, at any depth: ``str``, ``int``,
    ``bool``, ``float``, ``None``, ``list`` and ``dict`` with ``str`` keys? Then
    ``pydantic_core.to_json`` writes them as the library's ``json`` encoder does (insertion
    order, no ASCII escaping), but for a float's spelling, as for plain events: Python
    writes ``1e-07`` where pydantic-core writes ``1e-7``, the same value. Anything else (a
    UUID or datetime, a tuple, a subclass such as an ``IntEnum``, a key that is not a
    ``str``: pydantic-core writes ``None`` as ``"None"`` where ``json`` writes ``"null"``)
    is False. The types of a list's or a dict's members are collected in C (``map``), so
    a long context of ids is checked without a Python step an id."""
    kinds = set(map(type, values))
    if kinds <= _SCALARS:
        return True
    if not kinds <= _CONTAINERS or depth >= _PLAIN_DEPTH:
        return False
    for value in values:
        kind = type(value)
        if kind is dict:
            if not (set(map(type, value)) <= _KEYS and _plain_json(value.values(), depth + 1)):
                return False
        elif kind is list and not _plain_json(value, depth + 1):
            return False
    return True


#: The fields every stored body leaves out (the record's columns) or writes first (the
#: timestamp, transcoded).
_NOT_SERIALIZED = frozenset({"originator_id", "originator_version", "timestamp"})
#: An event's first attribute when its timestamp is its body's first field.
_LEADING = frozenset({"originator_id", "timestamp"})


def _plain_encoding(cls: type) -> tuple[str, SchemaSerializer, int, bytes] | None:
    """How the fast encoder writes a plain class's bodies (None: not plain): its topic, a
    serializer of its body fields after the timestamp (pydantic-core's own inference for
    each value, as ``to_json``; the record fields and the timestamp excluded), how many
    fields an instance has, and the body's end (its class version, where the library's
    mapper writes it: last)."""
    topic = _plain_topic(cls)
    if topic is None:
        return None
    names = [f.name for f in fields(cls)]
    serializer = SchemaSerializer(
        core_schema.typed_dict_schema(
            {
                name: core_schema.typed_dict_field(
                    core_schema.any_schema(), serialization_exclude=name in _NOT_SERIALIZED
                )
                for name in names
            }
        ),
        # NaN and the infinities as ``json`` writes them (the transcoder's), not as
        # pydantic-core's default null, which would decode as None.
        core_schema.CoreConfig(ser_json_inf_nan="constants"),
    )
    version = getattr(cls, "class_version", 1)
    tail = b"}" if version == 1 else b',"class_version":%d}' % version
    return topic, serializer, len(names), tail


def _plain_topic(cls: type) -> str | None:
    """The topic of an event class whose every field is plain JSON or the timestamp; None
    for any other class."""
    if not is_dataclass(cls) or issubclass(cls, Snapshot):
        return None
    for f in fields(cls):
        if f.name in _RECORD_FIELDS:
            continue
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "?")
        if f.name == "timestamp" and annotation == "datetime":
            continue
        if not _PLAIN_TYPE.match(annotation):
            return None
    return get_topic(cls)


# --------------------------------------------------------------------------- schemas
Check = Callable[[Any], bool]

#: A field's compiled check: name, description, the Python types its JSON value may decode
#: to, and a deep check of its items (None: the type is enough).
_Field = tuple[str, str, frozenset[type], Check | None]

_SCHEMAS: dict[type, dict[str, tuple[str, Check]] | None] = {}
_COMPILED: dict[type, tuple[_Field, ...] | None] = {}


def event_schema(cls: type) -> dict[str, tuple[str, Check]] | None:
    """Each body field of an event class: its annotation's text and a JSON type check;
    None for a class that is not a dataclass (nothing to check)."""
    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    schema: dict[str, tuple[str, Check]] | None = None
    if is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # an annotation this module cannot resolve: names only
            hints = {}
        schema = {}
        for f in fields(cls):
            if f.name in _RECORD_FIELDS:
                continue
            hint = hints.get(f.name, Any)
            schema[f.name] = (_describe(hint), _check(hint))
    _SCHEMAS[cls] = schema
    return schema


def _compiled(cls: type) -> tuple[_Field, ...] | None:
    """The schema as flat type sets, for the check every decoded event passes (cheap: a
    set lookup per field, a walk only over list and dict items)."""
    if cls in _COMPILED:
        return _COMPILED[cls]
    schema = event_schema(cls)
    out: tuple[_Field, ...] | None = None
    if schema is not None:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        out = tuple(
            (name, described, *_types(hints.get(name, Any), check))
            for name, (described, check) in schema.items()
        )
    _COMPILED[cls] = out
    return out


_ANY_TYPE: frozenset[type] = frozenset()  # empty: any type passes


def _types(hint: Any, check: Check) -> tuple[frozenset[type], Check | None]:
    simple = {int: int, str: str, bool: bool, type(None): type(None), datetime: datetime}
    if hint in simple:
        return frozenset({simple[hint]}), None
    if hint is float:
        return frozenset({float, int}), None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        parts = [_types(a, _check(a)) for a in typing.get_args(hint)]
        if all(deep is None and allowed for allowed, deep in parts):
            return frozenset().union(*(allowed for allowed, _ in parts)), None
        return _ANY_TYPE, check
    if origin is list or hint is list:
        return frozenset({list}), check if typing.get_args(hint) else None
    if origin is dict or hint is dict:
        return frozenset({dict}), check if typing.get_args(hint) else None
    return _ANY_TYPE, None


def validate_state(cls: type, state: dict[str, Any]) -> None:
    """Raise ``EventSchemaError`` unless ``state`` has exactly the class's body fields,
    each of its JSON type (``originator_id``/``originator_version`` may be present)."""
    compiled = _compiled(cls)
    if compiled is None:
        return
    present = len(state) - ("originator_id" in state) - ("originator_version" in state)
    try:
        for name, described, allowed, deep in compiled:
            value = state[name]
            if (allowed and type(value) not in allowed) or (deep is not None and not deep(value)):
                raise EventSchemaError(
                    f"{cls.__qualname__}.{name} must be {described}, got "
                    f"{type(value).__name__} {_short(value)}"
                )
    except KeyError:
        present = -1
    if present != len(compiled):
        names = state.keys() - _RECORD_FIELDS
        expected = {name for name, *_ in compiled}
        missing = sorted(expected - names)
        extra = sorted(names - expected)
        raise EventSchemaError(
            f"{cls.__qualname__} body does not match its fields"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(extra)}" if extra else "")
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _check(hint: Any) -> Check:
    """A JSON type check for one annotation; anything unrecognised accepts every value."""
    if hint is int:
        return lambda v: type(v) is int
    if hint is str:
        return lambda v: type(v) is str
    if hint is bool:
        return lambda v: type(v) is bool
    if hint is float:
        return lambda v: type(v) is float or type(v) is int
    if hint is type(None):
        return lambda v: v is None
    if hint is datetime:
        return lambda v: isinstance(v, datetime)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        checks = [_check(a) for a in args]
        return lambda v: any(c(v) for c in checks)
    if origin is list:
        item = _check(args[0]) if args else _any
        return lambda v: type(v) is list and all(item(x) for x in v)
    if origin is dict:
        key = _check(args[0]) if args else _any
        val = _check(args[1]) if len(args) > 1 else _any
        return lambda v: type(v) is dict and all(key(k) and val(x) for k, x in v.items())
    if hint is list:
        return lambda v: type(v) is list
    if hint is dict:
        return lambda v: type(v) is dict
    return _any


def _any(_: Any) -> bool:
    return True
