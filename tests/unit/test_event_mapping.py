"""The event mapper's fast encoder writes what eventsourcing's JSON transcoder writes, and
anything it cannot vouch for goes through the transcoder."""

from __future__ import annotations

import enum
import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder, Mapper, StoredEvent, UUIDAsHex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pico.domain.conversation import Conversation
from pico.domain.exchange import EntryRef
from pico.domain.session import Session
from pico.domain.task import Task
from pico.infrastructure.storage import make_mapper


def _reference() -> Mapper[UUID]:
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    return Mapper(transcoder=transcoder)


def _task(*, not_before: float | None) -> Task:
    return Task.start(
        session_id="s",
        task_id=7,
        conversation_id=1,
        kind="tool",
        status="ready",
        role="ready",
        state='{"args":{"path":"f.py"}}',
        after=[3, 4],
        foreground=True,
        spawned_by=None,
        not_before=not_before,
        required_permit=None,
    )


def _events() -> list[Any]:
    session = Session(session_id="s")
    session.claim(owner="o", host="h", pid=1)
    session.designate_root(1)
    session.set_value(seq=2, namespace="n", key="k", value='{"x":"é 😀 \\u0000"}')
    session.commit(first=1, last=2)
    session.retire_working_scope(seq=3, scope="w/1")
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.append_entry(
        seq=5, kind="user", content='"naïve \\"quoted\\""', metadata=None, key="k", by_task_id=None
    )
    conv.append_context(seq=6, ids=[5], refs={5: EntryRef(5, 1)})
    task = _task(not_before=1733000000.25)
    task.patch(
        seq=8,
        status="done",
        role="terminal",
        state=None,
        after=[],
        not_before=None,
        required_permit="p",
    )
    return [*session.collect_events(), *conv.collect_events(), *task.collect_events()]


def test_every_domain_event_is_stored_exactly_as_the_transcoder_would_store_it() -> None:
    fast, reference = make_mapper(), _reference()
    events = _events()
    assert len({type(e) for e in events}) >= 9
    for event in events:
        stored, expected = fast.to_stored_event(event), reference.to_stored_event(event)
        assert stored == expected, type(event).__qualname__
        assert reference.to_domain_event(stored) == event


class Linked(Aggregate):
    class Noted(Aggregate.Event):
        other: UUID

    def note(self, other: UUID) -> None:
        self.trigger_event(self.Noted, other=other)


def test_a_field_the_fast_encoder_would_flatten_goes_through_the_transcoder() -> None:
    agg = Linked()
    other = uuid4()
    agg.note(other)
    noted = agg.collect_events()[-1]
    stored = make_mapper().to_stored_event(noted)
    assert b"uuid_hex" in stored.state  # the transcoder's tagged form, not a bare string
    assert _reference().to_domain_event(stored).other == other  # type: ignore[attr-defined]


def test_a_value_the_fast_encoder_refuses_fails_as_the_transcoder_fails() -> None:
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.collect_events()
    conv.append_entry(
        seq=5, kind="user", content="\ud800", metadata=None, key=None, by_task_id=None
    )
    event = conv.collect_events()[-1]
    with pytest.raises(UnicodeEncodeError):
        _reference().to_stored_event(event)
    with pytest.raises(UnicodeEncodeError):
        make_mapper().to_stored_event(event)


def test_a_commands_batch_and_its_decoded_events_are_stored_as_the_transcoder_would() -> None:
    """The fast encoder writes a command's events (one shared timestamp) from their own
    attribute dicts: the bytes are the transcoder's, whatever order the record fields
    hold (a decoded event keeps them last), with the class version last."""
    fast, reference = make_mapper(), _reference()
    events = _events()
    stamp = events[0].timestamp
    for event in events:
        object.__setattr__(event, "timestamp", stamp)  # one clock reading a command
    stored = fast.to_stored_events(events)
    assert stored == [reference.to_stored_event(e) for e in events]
    assert any(s.state.endswith(b',"class_version":2}') for s in stored)
    decoded = [fast.to_domain_event(s) for s in stored]
    assert list(vars(decoded[-1]))[-2:] == ["originator_id", "originator_version"]
    assert fast.to_stored_events(decoded) == stored


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_float_is_stored_as_the_transcoder_stores_it(value: float) -> None:
    """The fast encoder's serializer writes NaN and the infinities as the transcoder's
    ``json`` does (``NaN``, ``Infinity``), not as pydantic-core's default ``null``, which
    would decode as None: a stored event must read back as the event that was saved."""
    (event,) = _task(not_before=value).collect_events()
    stored = make_mapper().to_stored_event(event)
    assert stored == _reference().to_stored_event(event)
    back = make_mapper().to_domain_event(stored).not_before
    assert isinstance(back, float)
    assert back == value or (math.isnan(back) and math.isnan(value))


@pytest.mark.parametrize(
    "stamp",
    [
        datetime(2026, 12, 6, 23, 8, 8, 268858, tzinfo=UTC),
        datetime(2026, 12, 6, 23, 8, 8, tzinfo=UTC),  # no fraction in its text
        datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
        datetime(2040, 2, 29, 0, 0, 0, 1, tzinfo=timezone(timedelta(seconds=5445))),
        datetime(1999, 12, 31, 23, 59, 59, 999999),  # naive
    ],
)
def test_a_timestamps_text_is_the_transcoders_whatever_its_form(stamp: datetime) -> None:
    """The fast encoder writes the command's timestamp once, as the opening of every body
    of the command (``_PlainEventMapper._stamped``): the bytes are the transcoder's for
    every form its ISO text takes (a fraction or none, any offset or none, a year of one
    digit), and the timestamp decodes back to the same value."""
    events = _events()
    for event in events:
        object.__setattr__(event, "timestamp", stamp)
    fast = make_mapper()
    assert fast.to_stored_events(events) == [_reference().to_stored_event(e) for e in events]
    assert fast.to_domain_event(fast.to_stored_events(events)[0]).timestamp == stamp


def test_an_event_holding_more_than_its_fields_is_stored_with_all_of_them() -> None:
    """What the serializer of a class's fields would drop, the transcoder's way keeps."""
    events = _events()
    event = events[-1]
    object.__setattr__(event, "note", "kept")
    stored = make_mapper().to_stored_event(event)
    assert stored == _reference().to_stored_event(event)
    assert b'"note":"kept"' in stored.state


def test_an_extra_attribute_of_no_json_type_is_stored_as_the_transcoder_tags_it() -> None:
    """An attribute beside a plain class's fields is checked like any value of a class
    that is not plain: a UUID is written in the transcoder's tagged form, not as a bare
    string that would decode as text."""
    event = _events()[-1]
    other = uuid4()
    object.__setattr__(event, "other", other)
    stored = make_mapper().to_stored_event(event)
    assert stored == _reference().to_stored_event(event)
    assert _reference().to_domain_event(stored).other == other  # type: ignore[attr-defined]


def test_a_decoded_body_with_its_fields_in_another_order_is_stored_in_that_order() -> None:
    """A body another writer ordered differently (its timestamp last) re-encodes as the
    transcoder would: the order it was read in, not the class's."""
    fast, reference = make_mapper(), _reference()
    stored = fast.to_stored_event(_events()[-1])
    state = json.loads(stored.state)
    state["timestamp"] = state.pop("timestamp")  # moved to the end
    moved = StoredEvent(
        stored.originator_id, stored.originator_version, stored.topic, _compact(state)
    )
    decoded = fast.to_domain_event(moved)
    again = fast.to_stored_event(decoded)
    assert again == reference.to_stored_event(decoded)
    assert again.state == moved.state


def _compact(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()


# ----------------------------------------------------------------- not-plain events
def _long_conversation() -> Conversation:
    """A conversation whose snapshot copies a context of entries and tool exchanges."""
    conv = Conversation.start(session_id="s", conversation_id=1)
    seq = 1
    for turn in range(20):
        seq += 1
        conv.append_entry(
            seq=seq, kind="user", content=f"turn {turn} é", metadata=None, key=None,
            by_task_id=None,
        )  # fmt: skip
        conv.append_context(seq=seq + 1, ids=[seq], refs={seq: EntryRef(seq, 1)})
        seq += 1
    conv.collect_events()
    return conv


def _spy(mapper: Mapper[UUID]) -> list[Any]:
    """Every value the mapper's transcoder is asked to encode."""
    seen: list[Any] = []
    encode = mapper.transcoder.encode

    def spy(obj: Any) -> bytes:
        seen.append(obj)
        return encode(obj)

    mapper.transcoder.encode = spy  # type: ignore[method-assign]
    return seen


def test_a_conversations_snapshot_is_written_as_the_transcoder_would_without_it() -> None:
    """A snapshot (no plain class: its state is whatever the aggregate holds) is written
    byte for byte as the library's mapper writes it, its datetimes tagged, and without
    the transcoder when every value below the top level is plain JSON."""
    conv = _long_conversation()
    snapshot = Conversation.Snapshot.take(conv)
    fast, reference = make_mapper(), _reference()
    transcoded = _spy(fast)
    stored = fast.to_stored_event(snapshot)
    assert transcoded == []  # the fast way
    assert stored == reference.to_stored_event(snapshot)
    assert stored.state.count(b'"_type_":"datetime_iso"') == 3  # timestamp, created, modified
    again = reference.to_domain_event(stored)
    assert again.mutate(None).context == conv.context  # type: ignore[attr-defined]


def test_an_event_with_a_uuid_field_is_written_tagged_without_the_transcoder() -> None:
    agg = Linked()
    agg.note(uuid4())
    noted = agg.collect_events()[-1]
    fast = make_mapper()
    transcoded = _spy(fast)
    assert fast.to_stored_event(noted) == _reference().to_stored_event(noted)
    assert transcoded == []


class _Level(enum.IntEnum):
    HIGH = 3


class _Name(enum.StrEnum):
    ONE = "one"


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text()
    | st.uuids()
    | st.datetimes(timezones=st.just(UTC)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(
            st.integers(0, 9) | st.none() | st.booleans() | st.floats(), inner, max_size=2
        )
        | st.sampled_from([_Level.HIGH, _Name.ONE])
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(state=st.dictionaries(st.text(max_size=6), _JSONISH, max_size=6))
@example(state={"small": [1e-07]})  # Python's spelling; pydantic-core writes 1e-7
@example(state={"far": {"up": float("inf"), "down": -float("inf"), "none": float("nan")}})
@example(state={"kinds": [_Level.HIGH, _Name.ONE], "at": {"level": _Level.HIGH}})
@example(state={"keys": {None: 1}})  # json writes "null"; pydantic-core would write "None"
@example(state={"tiny": 6.103515625e-05})  # pydantic-core writes 0.00006103515625
@example(state={"bad": ["\ud800"]})  # a lone surrogate (st.text() draws none): both refuse
@example(state={"ids": {"a": [1, True, None, "\x00\u2028é"]}, "at": [uuid4()]})
def test_a_snapshot_of_any_state_is_written_as_the_library_writes_it(state: dict[str, Any]) -> None:
    """Whatever a state holds (floats, tuples, int keys, UUIDs and datetimes at any depth,
    control characters, lone surrogates), the mapper writes the library's bytes or fails
    as the library fails: the fast way never writes a body of its own, but for a float's
    spelling (``1e-7`` for ``1e-07``, ``0.00006103515625`` for ``6.103515625e-05``), as
    plain events write it: the same value, so the same text once Python re-spells it."""
    conv = _long_conversation()
    snapshot = Conversation.Snapshot.take(conv)
    object.__setattr__(snapshot, "state", {**snapshot.state, **state})
    try:
        expected: StoredEvent | type[BaseException] = _reference().to_stored_event(snapshot)
    except Exception as exc:
        expected = type(exc)
    try:
        stored: StoredEvent | type[BaseException] = make_mapper().to_stored_event(snapshot)
    except Exception as exc:
        stored = type(exc)
    if isinstance(stored, StoredEvent) and isinstance(expected, StoredEvent):
        if stored.state != expected.state:  # a float spelled otherwise, nothing else
            assert _floats(state)
            assert _respelled(stored.state) == _respelled(expected.state)
        assert (stored.originator_id, stored.topic) == (expected.originator_id, expected.topic)
    else:
        assert stored == expected


def _respelled(body: bytes) -> str:
    """A body as Python's ``json`` writes it again: every float in Python's spelling."""
    return json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False)


def _floats(value: Any) -> bool:
    """Does ``value`` hold a float anywhere (a key included)?"""
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_floats(k) or _floats(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_floats(v) for v in value)
    return False
