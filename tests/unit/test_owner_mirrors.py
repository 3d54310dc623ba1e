"""The owner's context tails, values under a prefix and written values
(projections/mirrors.py) on their own: what a kept tail can answer and what it must leave
to the store, the bounds, and that a new generation of the live-task mirror drops
everything kept under the old one."""

from __future__ import annotations

from pico.projections import mirrors
from pico.projections.mirrors import ContextTails, PrefixValues, WrittenValues
from pico.projections.ops import (
    AppendContext,
    DropValue,
    PutValue,
    ReplacePrefix,
    RetireWorking,
)


def _fresh(generation: list[int | None]) -> mirrors.Freshness:
    return lambda: generation[0]


def test_a_suffix_answers_only_after_its_first_position_and_appends_follow_its_last() -> None:
    tails = ContextTails(_fresh([1]))
    assert tails.current() == 1
    tails.keep(5, 9, (2, [(10, 100), (11, 101)]))  # a suffix: position 9 and before unknown
    assert tails.get(5, 10) == (2, [(11, 101)])
    assert tails.get(5, 11) == (2, [])
    assert tails.get(5, 40) == (2, [])
    assert tails.get(5, 9) is None  # element 10 is kept, but 9 and before are not known
    assert tails.get(5, None) is None  # the whole context: the store's
    tails.track([AppendContext(5, 70, (102, 103), 2)])
    assert tails.get(5, 11) == (2, [(12, 102), (13, 103)])
    tails.keep(6, None, (0, []))  # a whole, empty context
    tails.track([AppendContext(6, 71, (104,), 0)])
    assert tails.get(6, 0) == (0, [])
    assert tails._tails[6].last == 0 and tails._tails[6].elements == [(0, 104)]


def test_an_empty_answer_after_a_position_is_not_kept() -> None:
    tails = ContextTails(_fresh([1]))
    tails.current()
    tails.keep(5, 3, (0, []))  # the context ends at 3 or before: where is not said
    assert tails.get(5, 3) is None


def test_a_revision_mismatch_or_a_replacement_drops_the_conversation() -> None:
    tails = ContextTails(_fresh([1]))
    tails.current()
    tails.keep(5, None, (2, [(0, 100)]))
    tails.keep(6, None, (0, [(0, 200)]))
    tails.track([AppendContext(5, 70, (101,), 3), ReplacePrefix(6, 71, 200, 1, (201,), 1)])
    assert tails.get(5, 0) is None and tails.get(6, 0) is None


def test_tails_are_bounded_and_a_trimmed_tail_is_no_longer_complete() -> None:
    tails = ContextTails(_fresh([1]))
    tails.current()
    tails.keep(1, None, (0, [(0, 1)]))
    for i in range(mirrors.TAIL_ELEMENTS + 5):
        tails.track([AppendContext(1, 100 + i, (1000 + i,), 0)])
    tail = tails._tails[1]
    assert len(tail.elements) == mirrors.TAIL_ELEMENTS and not tail.complete
    assert tails.get(1, 0) is None  # trimmed away: the store's
    assert tail.last is not None
    assert tails.get(1, tail.last - 1) == (0, [(tail.last, tail.elements[-1][1])])
    for cid in range(2, mirrors.TAIL_CONVERSATIONS + 3):
        tails.keep(cid, None, (0, []))
    assert len(tails._tails) == mirrors.TAIL_CONVERSATIONS and 1 not in tails._tails


def test_values_under_a_prefix_follow_puts_drops_and_retirement() -> None:
    values = PrefixValues(_fresh([1]))
    values.current()
    values.keep("conversation:1", "pico.queue.", [("pico.queue.steer", "02", 5, "{}")])
    values.keep("working:w", "pico.queue.", [])
    values.track(
        [
            PutValue("conversation:1", "pico.queue.follow_up", "01", 6, '{"a":1}'),
            PutValue("conversation:1", "pico.queued", "03", 7, "{}"),  # not under the prefix
            PutValue("conversation:1", "pico.queue.", "", 8, "{}"),  # the cursor itself
            PutValue("conversation:2", "pico.queue.steer", "04", 9, "{}"),  # not kept
            DropValue("conversation:1", "pico.queue.steer", "02"),
            PutValue("working:w", "pico.queue.x", "05", 10, "{}"),
            RetireWorking("working:w", 10),
        ]
    )
    assert values.get("conversation:1", "pico.queue.") == [
        ("pico.queue.follow_up", "01", 6, '{"a":1}')
    ]
    assert values.get("conversation:2", "pico.queue.") is None
    assert values.get("working:w", "pico.queue.") is None


def test_a_new_generation_drops_what_the_old_one_kept() -> None:
    generation: list[int | None] = [1]
    tails, values = ContextTails(_fresh(generation)), PrefixValues(_fresh(generation))
    assert tails.current() == 1 and values.current() == 1
    tails.keep(5, None, (0, [(0, 100)]))
    values.keep("conversation:5", "pico.queue.", [])
    generation[0] = 2  # the live-task mirror was read again, or dropped
    assert tails.current() == 2 and values.current() == 2
    assert tails.get(5, 0) is None and values.get("conversation:5", "pico.queue.") is None
    generation[0] = None  # no mirror: nothing is kept or answered
    assert tails.current() is None and values.current() is None


def test_a_value_set_past_its_bound_is_left_to_the_store() -> None:
    values = PrefixValues(_fresh([1]))
    values.current()
    many = [("pico.queue.steer", f"{i:04d}", i, "{}") for i in range(mirrors.PREFIX_VALUES + 1)]
    values.keep("conversation:1", "pico.queue.", many)
    assert values.get("conversation:1", "pico.queue.") is None  # too long: not kept
    values.keep("conversation:1", "pico.queue.", many[:-1])
    assert values.get("conversation:1", "pico.queue.") == many[:-1]
    values.track([PutValue("conversation:1", "pico.queue.steer", "9999", 9999, "{}")])
    assert values.get("conversation:1", "pico.queue.") is None  # grew past it: dropped


def test_written_values_answer_what_was_written_and_nothing_else() -> None:
    values = WrittenValues(_fresh([1]))
    assert values.get("session", "pico.input-result", "01") == (False, None)  # never loads
    assert values.current() == 1
    values.track(
        [
            PutValue("session", "pico.input-result", "01", 5, '{"status":"running"}'),
            PutValue("conversation/1", "app.note", "", 6, '"a"'),
            PutValue("working/w", "app.frame", "x", 7, "[]"),
            PutValue("session", "pico.input-result", "01", 8, '{"status":"done"}'),
            DropValue("conversation/1", "app.note", ""),
            RetireWorking("working/w", 9),
        ]
    )
    assert values.get("session", "pico.input-result", "01") == (True, (8, '{"status":"done"}'))
    assert values.get("conversation/1", "app.note", "") == (True, None)  # deleted: absent
    assert values.get("working/w", "app.frame", "x") == (False, None)  # retired: the store's
    assert values.get("session", "pico.input-result", "02") == (False, None)
    assert values._count == 2


def test_written_values_are_dropped_by_a_new_generation_and_answer_nothing_without_one() -> None:
    generation: list[int | None] = [1]
    values = WrittenValues(_fresh(generation))
    values.track([PutValue("session", "app.v", "", 3, "1")])
    # Kept before any read: the first read's generation is not the one it was kept under.
    assert values.get("session", "app.v", "") == (False, None)
    values.track([PutValue("session", "app.v", "", 4, "2")])
    assert values.get("session", "app.v", "") == (True, (4, "2"))
    generation[0] = 2  # another writer changed the store, or the owner's batch was lost
    assert values.get("session", "app.v", "") == (False, None)
    assert values._scopes == {} and values._count == 0
    values.track([PutValue("session", "app.v", "", 5, "3")])
    generation[0] = None  # no mirror
    assert values.get("session", "app.v", "") == (False, None)


def test_written_values_start_over_past_their_bound() -> None:
    values = WrittenValues(_fresh([1]))
    assert values.current() == 1
    values.track(
        [PutValue("session", "app.v", f"{i:05d}", i, "0") for i in range(mirrors.WRITTEN_VALUES)]
    )
    assert values._count == mirrors.WRITTEN_VALUES
    assert values.get("session", "app.v", "00000") == (True, (0, "0"))
    values.track([PutValue("conversation/1", "app.v", "new", 9999, "1")])
    assert values._count == 1  # one past the bound: everything else left to the store
    assert values.get("session", "app.v", "00000") == (False, None)
    assert values.get("conversation/1", "app.v", "new") == (True, (9999, "1"))
