"""The retry budget is a ``Harness.open`` setting (§8.3): ``max_attempts`` and
``retry_delay`` are captured by each generation when it is created."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pico
from pico import FauxFailure, FauxProvider
from tests.backends import Backend


async def test_max_attempts_bounds_the_retries_of_a_generation(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider([FauxFailure("retryable", "busy"), FauxFailure("retryable", "busy")])
    h = await backend.open(provider=provider, clock=clock, max_attempts=2, retry_delay=0.5)
    c = await h.root()
    question = await c.accept("hello")
    driving = asyncio.ensure_future(c.drive())  # waits for the retry timer on the clock
    for _ in range(100):
        await asyncio.sleep(0)
    (generation,) = (await h.tasks(conversation_ids=[c.id], kind="generation")).items
    assert generation.status == "retry_wait"  # the first attempt failed, a retry is timed
    assert generation.not_before == pytest.approx(clock.now() + 0.5)  # retry_delay * 1
    assert isinstance(generation.state, dict) and generation.state["max_attempts"] == 2
    clock.advance(1.0)
    assert await asyncio.wait_for(driving, 5) == "idle"
    result = await c.result(question)
    assert result is not None and result.status == "failed"  # the second attempt was the last
    assert provider.request_count == 2
    await h.close()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", True),
        ("max_attempts", 2.0),
        ("retry_delay", -1.0),
        ("retry_delay", float("inf")),
        ("retry_delay", "1"),
    ],
)
async def test_a_bad_retry_budget_is_refused_before_anything_opens(
    backend: Backend, option: str, value: object
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(pico.InvalidArgumentError, match=option):
        await backend.open(provider=FauxProvider([]), **options)
    h = await backend.open(provider=FauxProvider([]))  # nothing was created or claimed
    await h.close()


class _OptionsProvider(FauxProvider):
    """A faux provider with request options, like a real adapter's temperature."""

    options: dict[str, Any] = {"temperature": 0.2}

    def request_options(self) -> dict[str, Any]:
        return dict(self.options)


async def test_request_options_are_captured_when_a_generation_is_created(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = _OptionsProvider([FauxFailure("retryable", "busy"), "fine"])
    h = await backend.open(provider=provider, clock=clock, retry_delay=0.5)
    c = await h.root()
    question = await c.accept("hello")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(100):
        await asyncio.sleep(0)
    (generation,) = (await h.tasks(conversation_ids=[c.id], kind="generation")).items
    assert generation.status == "retry_wait"
    assert isinstance(generation.state, dict)
    assert generation.state["options"] == {"temperature": 0.2}
    # Check: the retry sends what the first attempt sent, not the provider's options now.
    provider.options = {"temperature": 0.9}
    clock.advance(1.0)
    assert await asyncio.wait_for(driving, 5) == "idle"
    result = await c.result(question)
    assert result is not None and result.status == "done"
    assert [dict(r.settings) for r in provider.requests] == [{"temperature": 0.2}] * 2
    # A generation created now captures the options of now.
    await c.accept("again")
    provider.script.append("ok")
    await c.drive()
    assert dict(provider.requests[-1].settings) == {"temperature": 0.9}
    await h.close()


async def test_a_provider_without_request_options_stores_none(backend: Backend) -> None:
    h = await backend.open(provider=FauxProvider(["hi"]))
    c = await h.root()
    await c.accept("hello")
    await c.drive()
    (generation,) = (await h.tasks(conversation_ids=[c.id], kind="generation")).items
    assert isinstance(generation.state, dict) and "options" not in generation.state
    await h.close()


class _BadOptionsProvider(FauxProvider):
    def request_options(self) -> Any:
        return ["temperature", 0.2]


async def test_request_options_that_are_not_a_json_object_are_refused_and_change_nothing(
    backend: Backend,
) -> None:
    h = await backend.open(provider=_BadOptionsProvider(["hi"]))
    c = await h.root()
    with pytest.raises(pico.InvalidJsonError, match="request_options"):
        await c.accept("hello")
    # Check: nothing was admitted and the handle stays usable.
    assert (await c.entries()).items == ()
    assert (await h.tasks(conversation_ids=[c.id], kind="generation")).items == ()
    await c.append("user", "still usable")
    await h.close()
