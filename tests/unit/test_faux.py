"""The faux provider ships in the library: scripted, streamed, deferred, failing."""

from __future__ import annotations

import asyncio

import pytest

import pico
from pico import FauxDeferred, FauxFailure, FauxProvider, FauxResponse, Message, Request, TextPart
from pico.application.model import Done, StreamEvent, TextDelta, ThinkingDelta


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
