"""A request's messages (``pico.Messages``): a prefix of an append-only list plus a tail,
read exactly as the tuple of the same messages would be, and never changed by later
appends to the list it shares."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pico
from pico import FauxProvider, Message, Messages, TextPart


def _m(i: int) -> Message:
    return Message("user" if i % 2 else "assistant", (TextPart(f"m{i}"),))


@given(
    settled=st.integers(0, 6),
    count=st.integers(0, 6),
    tail=st.integers(0, 4),
    start=st.none() | st.integers(-12, 12),
    stop=st.none() | st.integers(-12, 12),
    step=st.none() | st.sampled_from([1, 2, -1, 3]),
)
def test_messages_read_as_the_tuple_of_the_same_messages(
    settled: int, count: int, tail: int, start: int | None, stop: int | None, step: int | None
) -> None:
    count = min(count, settled)
    prefix = [_m(i) for i in range(settled)]
    rest = tuple(_m(100 + i) for i in range(tail))
    seq = Messages(prefix, count, rest)
    expected = (*prefix[:count], *rest)
    assert len(seq) == len(expected)
    assert tuple(seq) == expected and list(seq) == list(expected)
    assert seq[start:stop:step] == expected[start:stop:step]
    assert type(seq[start:stop:step]) is tuple
    for i in range(-len(expected) - 2, len(expected) + 2):
        if -len(expected) <= i < len(expected):
            assert seq[i] is expected[i]
        else:
            with pytest.raises(IndexError):
                seq[i]
    # Equal to the tuple and the list of the same messages, both ways, and hashed alike.
    assert seq == expected and expected == seq and seq == list(expected)
    assert hash(seq) == hash(expected)
    assert seq + (_m(7),) == (*expected, _m(7))  # noqa: RUF005 (the + under test)
    assert (_m(7),) + seq == (_m(7), *expected)  # noqa: RUF005
    assert repr(seq) == f"Messages({expected!r})"


def test_later_appends_to_the_shared_list_do_not_change_a_request() -> None:
    settled = [_m(0), _m(1)]
    first = Messages(settled, 2, (_m(2),))
    settled.extend([_m(2), _m(3)])  # the projection settles more for a later request
    assert tuple(first) == (_m(0), _m(1), _m(2))
    assert first != Messages(settled, 4)
    assert first != (_m(0), _m(1))  # a shorter sequence differs


def test_copies_and_pickles_hold_only_the_requests_own_messages() -> None:
    settled = [_m(0), _m(1), _m(2), _m(3)]
    seq = Messages(settled, 2, (_m(9),))
    assert copy.copy(seq) is seq  # immutable
    deep: object = copy.deepcopy(seq)  # a tuple, whatever the annotations say
    assert type(deep) is tuple and deep == (_m(0), _m(1), _m(9))
    loaded = pickle.loads(pickle.dumps(seq))
    assert type(loaded) is tuple and loaded == (_m(0), _m(1), _m(9))
    request = pico.Request(model="m", messages=seq)
    assert dataclasses.asdict(request)["messages"] == (_m(0), _m(1), _m(9))
    with pytest.raises(TypeError):
        seq[1.0]  # type: ignore[call-overload]


def test_a_count_beyond_the_list_is_refused() -> None:
    with pytest.raises(ValueError):
        Messages([_m(0)], 2)
    with pytest.raises(ValueError):
        Messages([_m(0)], -1)


async def test_consecutive_requests_share_the_settled_context_instead_of_copying_it() -> None:
    provider = FauxProvider(["one", "two", "three"])
    h = await pico.Harness.open("memory://", session="s", provider=provider)
    c = await h.root()
    for text in ("a", "b", "c"):
        await c.prompt(text)
    first, second, third = provider.requests
    sent = [request.messages for request in provider.requests]
    assert all(isinstance(messages, Messages) for messages in sent)
    assert [m.text for m in third.messages] == ["a", "one", "b", "two", "c"]
    # The third request shares the list of settled messages the second did: no copy.
    assert isinstance(second.messages, Messages) and isinstance(third.messages, Messages)
    assert third.messages._settled is second.messages._settled
    assert tuple(second.messages) == tuple(third.messages[: len(second.messages)])
    # The earlier request still reads as it was sent.
    assert [m.text for m in first.messages] == ["a"]
    assert [m.text for m in second.messages] == ["a", "one", "b"]
    await h.close()
