"""The faux provider ships in the library: scripted, streamed, deferred, failing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pico
from pico import FauxDeferred, FauxFailure, FauxProvider, FauxResponse, Message, Request, TextPart
from pico.application.model import Done, Messages, StreamEvent, TextDelta, ThinkingDelta


def _request(text: str = "hello there") -> Request:
    return Request(model="faux", messages=(Message("user", (TextPart(text),)),))


async def _collect(provider: FauxProvider, request: Request) -> list[StreamEvent]:
    return [event async for event in provider.stream(request)]


async def test_text_streams_in_chunks_then_done_with_estimated_usage() -> None:
    provider = FauxProvider(["The parser recurses."], chunk_chars=5)
    events = await _collect(provider, _request("x" * 40))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert deltas == ["The p", "arser", " recu", "rses."]
    done = events[-1]
    assert isinstance(done, Done) and isinstance(done.outcome, pico.Response)
    assert done.outcome.message.text == "The parser recurses."
    assert done.outcome.stop_reason == "end_turn"
    assert done.outcome.usage == pico.Usage(input_tokens=10, output_tokens=5)
    assert provider.requests[0].messages[0].text == "x" * 40


async def test_thinking_then_tool_calls_with_ids() -> None:
    provider = FauxProvider(
        [
            FauxResponse(
                thinking="hmm",
                text="reading",
                tool_calls=[("read", {"path": "a.py"}), ("grep", {"q": "parse"})],
            )
        ]
    )
    events = await _collect(provider, _request())
    assert isinstance(events[0], ThinkingDelta) and events[0].text == "hmm"
    done = events[-1]
    assert isinstance(done, Done) and isinstance(done.outcome, pico.Response)
    calls = done.outcome.message.tool_calls
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_1", "read", {"path": "a.py"}),
        ("call_2", "grep", {"q": "parse"}),
    ]
    assert done.outcome.stop_reason == "tool_use"


async def test_a_response_can_be_a_function_of_the_request() -> None:
    provider = FauxProvider([lambda request: f"you said: {request.messages[-1].text}"])
    events = await _collect(provider, _request("ping"))
    done = events[-1]
    assert isinstance(done, Done) and isinstance(done.outcome, pico.Response)
    assert done.outcome.message.text == "you said: ping"


async def test_deferred_handles_resolve_after_n_polls() -> None:
    provider = FauxProvider([FauxDeferred(polls=3, then="finally")])
    events = await _collect(provider, _request())
    done = events[-1]
    assert isinstance(done, Done) and isinstance(done.outcome, pico.Deferred)
    handle = done.outcome.handle
    assert isinstance(await provider.poll(handle), pico.Deferred)
    assert isinstance(await provider.poll(handle), pico.Deferred)
    final = await provider.poll(handle)
    assert isinstance(final, pico.Response) and final.message.text == "finally"
    with pytest.raises(pico.ProviderError):
        await provider.poll(handle)


@pytest.mark.parametrize("kind", ["retryable", "overflow", "fatal"])
async def test_injected_failures_are_classified(kind: str) -> None:
    provider = FauxProvider([FauxFailure(kind, "boom", retry_after=7)])  # type: ignore[arg-type]
    with pytest.raises(pico.ProviderError) as raised:
        await _collect(provider, _request())
    assert raised.value.kind == kind and raised.value.retry_after == 7


async def test_unreported_usage_is_unknown_not_zero() -> None:
    provider = FauxProvider([FauxResponse(text="x", report_usage=False)])
    done = (await _collect(provider, _request()))[-1]
    assert isinstance(done, Done) and isinstance(done.outcome, pico.Response)
    assert done.outcome.usage is None


async def test_an_exhausted_script_is_a_clear_error() -> None:
    provider = FauxProvider([])
    with pytest.raises(pico.ProviderError, match="exhausted"):
        await _collect(provider, _request())


async def test_streaming_cadence_follows_the_clock() -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(["abcdef"], chunk_chars=2, cadence=1.0, clock=clock)
    received: list[str] = []

    async def consume() -> None:
        async for event in provider.stream(_request()):
            if isinstance(event, TextDelta):
                received.append(event.text)

    task = asyncio.ensure_future(consume())
    for expected in (["ab"], ["ab", "cd"], ["ab", "cd", "ef"]):
        for _ in range(5):
            await asyncio.sleep(0)
        assert received == expected[:-1]  # the next chunk waits for the clock
        clock.advance(1.0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert received == expected
    await task


def test_a_cadence_without_a_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="clock"):
        FauxProvider(["x"], cadence=0.5)


# Requests as the projection makes them: ``Messages`` over a conversation's settled list
# (only ever appended to; a replacement starts a new list that keeps the other messages'
# objects), with a few messages after it; two conversations served by one provider in
# turn; now and then a caller's plain tuple. Texts are whole tokens (four characters
# each), so the usage estimate is exactly a quarter of the characters.
_step = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(0, 6)),
    st.tuples(st.just("replace"), st.integers(0, 40), st.integers(0, 6)),
    st.tuples(st.just("switch"), st.just(0), st.just(0)),
    st.tuples(st.just("tuple"), st.just(0), st.just(0)),
    st.tuples(st.just("older"), st.integers(0, 40), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, min_size=1, max_size=16), st.lists(st.integers(0, 5), min_size=16))
def test_the_usage_estimate_counts_every_message_of_each_request(
    steps: list[tuple[str, int, int]], tails: list[int]
) -> None:
    provider = FauxProvider(["ok"] * len(steps))
    settled: list[list[Message]] = [[], []]
    current = 0
    for (op, a, b), tail_size in zip(steps, tails, strict=False):
        count = len(settled[current])
        if op == "append":
            settled[current] += [Message("user", (TextPart("word" * b),)) for _ in range(a)]
            count = len(settled[current])
        elif op == "replace" and settled[current]:
            fresh = list(settled[current])
            fresh[a % len(fresh)] = Message("user", (TextPart("text" * b),))
            settled[current] = fresh
        elif op == "switch":
            current = 1 - current
            count = len(settled[current])
        elif op == "older":  # a request holding fewer settled messages than measured
            count = a % (count + 1)
        tail = tuple(Message("assistant", (TextPart("tail" * tail_size),)) for _ in range(2))
        messages: Sequence[Message] = Messages(settled[current], count, tail)
        if op == "tuple":
            messages = tuple(messages)
        events = asyncio.run(_collect(provider, Request(model="faux", messages=messages)))
        done = events[-1]
        assert isinstance(done, Done) and isinstance(done.outcome, pico.Response)
        assert done.outcome.usage is not None
        chars = sum(len(m.text) for m in messages)
        assert done.outcome.usage.input_tokens == chars // 4
