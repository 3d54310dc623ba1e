"""Given events -> command -> new events. No I/O."""

from __future__ import annotations

from typing import Any

import pytest
from eventsourcing.domain import Aggregate

from pico.domain.conversation import Conversation
from pico.domain.errors import (
    CommandRejectedError,
    ContextEditError,
    ExchangeSplitError,
    InvalidJsonError,
    SequenceExhaustedError,
)
from pico.domain.exchange import EntryRef, complete_exchange
from pico.domain.ids import MAX_SEQ
from pico.domain.json import dumps, strict_json
from pico.domain.session import Session
from pico.domain.task import Task
from pico.projections.ops import PROJECTED, AppendContext, PutCommit, PutEntry, project


def _conversation_with(ids: list[int]) -> Conversation:
    conv = Conversation.start(session_id="s", conversation_id=1)
    for i in ids:
        conv.append_entry(
            seq=i, kind="user", content='"x"', metadata=None, key=None, by_task_id=None
        )
    conv.append_context(seq=ids[-1] + 1, ids=ids, refs={i: EntryRef(i, 1) for i in ids})
    conv.collect_events()
    return conv


def test_sequence_exhaustion_rejects_at_the_largest_safe_integer() -> None:
    session = Session(session_id="s")
    session.head = MAX_SEQ - 1
    assert session.next_seq(0) == MAX_SEQ
    with pytest.raises(SequenceExhaustedError):
        session.next_seq(1)


def test_a_commit_must_follow_the_high_water_mark() -> None:
    session = Session(session_id="s")
    session.commit(first=1, last=3)
    with pytest.raises(CommandRejectedError):
        session.commit(first=5, last=6)  # a gap in allocation
    assert session.head == 3 and session.main_head == 3


def test_a_rejected_context_edit_emits_no_event_and_changes_nothing() -> None:
    conv = _conversation_with([2, 3])
    with pytest.raises(ContextEditError):
        conv.append_context(seq=9, ids=[3], refs={3: EntryRef(3, 1)})
    assert conv.collect_events() == []
    assert conv.context == [2, 3]


def test_prefix_replacement_event_carries_what_replay_needs() -> None:
    conv = _conversation_with([2, 3, 4, 5])
    conv.append_entry(
        seq=7, kind="summary", content='"s"', metadata=None, key=None, by_task_id=None
    )
    conv.replace_context_prefix(seq=8, through=3, replacement=[7], refs={7: EntryRef(7, 1)})
    events = conv.collect_events()
    replaced = events[-1]
    assert isinstance(replaced, Conversation.ContextPrefixReplaced)
    assert (replaced.removed, replaced.replacement, replaced.revision) == (2, [7], 1)
    assert conv.context == [7, 4, 5]


def test_complete_exchange_requires_every_call_answered_after_its_call() -> None:
    refs = {1: EntryRef(1, 1, ("a", "b")), 2: EntryRef(2, 1, (), "b"), 3: EntryRef(3, 1, (), "a")}
    delta = complete_exchange(1, [1, 2, 3], refs)
    assert delta.calls == {"1": ["a", "b"]} and delta.answers == {"2": "b", "3": "a"}
    with pytest.raises(ExchangeSplitError):
        complete_exchange(1, [1, 2], refs)
    with pytest.raises(ExchangeSplitError):
        complete_exchange(1, [2, 1, 3], refs)


def _entry_commit() -> tuple[list[Any], list[Any]]:
    """One command's events: a conversation's entry and its context append, and the
    session's commit boundary (conversation events, session events)."""
    conv = Conversation.start(session_id="s", conversation_id=1)
    conv.collect_events()
    conv.append_entry(seq=5, kind="user", content='"x"', metadata=None, key="k", by_task_id=None)
    conv.append_context(seq=6, ids=[5], refs={5: EntryRef(5, 1)})
    session = Session(session_id="s")
    session.head = 4
    session.collect_events()
    session.commit(first=5, last=6)
    return list(conv.collect_events()), list(session.collect_events())


def test_projector_orders_by_sequence_and_stamps_the_commit_end() -> None:
    conv_events, session_events = _entry_commit()
    events = [*session_events, *conv_events]  # session first on purpose
    ops = project(events)
    assert [type(o) for o in ops] == [PutEntry, AppendContext, PutCommit]
    entry = ops[0]
    assert isinstance(entry, PutEntry) and entry.commit_end == 6 and entry.key == "k"


def test_projector_projects_an_event_of_a_subclass_as_its_known_class() -> None:
    """``project`` dispatches on an event's exact class; an event of a subclass (pico
    defines none) is projected as the known class it derives from, as an ``isinstance``
    chain would, and an event class it does not know makes no rows."""
    conv_events, session_events = _entry_commit()
    events = [*conv_events, *session_events]

    class LaterEntry(Conversation.EntryAppended):
        pass

    entry = object.__new__(LaterEntry)
    vars(entry).update(vars(events[0]))
    unknown = object.__new__(Session.ChainStarted)
    vars(unknown).update(seq=7, anchor="sha256:" + "0" * 64, events=3)
    assert project([entry, *events[1:]]) == project(events)
    assert project([entry, unknown, *events[1:]]) == project(events)  # and again: remembered
    assert project([unknown]) == []


def test_every_event_class_is_projected_or_named_as_making_no_rows() -> None:
    """``project`` dispatches on the classes it lists (``PROJECTED``): a new event class
    must be listed there (and given its branch) or named here as making no rows, never
    left to make none silently."""
    no_rows = {
        Session.Event,
        Conversation.Event,
        Task.Event,
        Session.ChainStarted,
        Session.ConfigurationRecorded,
        Session.ConfigurationChanged,
    }
    classes = {
        v
        for aggregate in (Session, Conversation, Task)
        for v in vars(aggregate).values()
        if isinstance(v, type) and issubclass(v, Aggregate.Event)
    }
    assert len(set(PROJECTED)) == len(PROJECTED)
    assert classes - no_rows == set(PROJECTED)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1: 2}, (1,), {"a": b"x"}, {3}])
def test_strict_json_rejects_what_is_not_json(bad: object) -> None:
    with pytest.raises(InvalidJsonError):
        dumps(bad)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


class _Text(str):
    pass


def test_strict_json_fast_path_agrees_with_the_checker_at_its_edges() -> None:
    # The path-free fast check hands every doubtful value to the full checker: the
    # depth limit, nested bad values and built-in subclasses keep their verdict and message.
    assert dumps(_nested(200)).startswith("[" * 200)  # nesting 200 deep is allowed
    with pytest.raises(InvalidJsonError, match="deeper than 200"):
        dumps(_nested(201))
    with pytest.raises(InvalidJsonError, match=r"payload\.a\[1\]: nan"):
        dumps({"a": [1, float("nan")]})
    assert dumps({"k": _Text("v")}) == '{"k":"v"}'  # a str subclass is still a string
    assert dumps([True, None, 1.5, "x"]) == '[true,null,1.5,"x"]'


def test_strict_json_copies() -> None:
    value = {"a": [1, {"b": None}]}
    copy = strict_json(value)
    assert copy == value and copy is not value
