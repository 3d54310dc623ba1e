"""An execution's stop signal and the model stream it stops (application/tasks.py
``StopSignal``, application/flows/streaming.py): the stream runs in the execution's own
task, and setting the signal cancels that task where the stream waits. Each test forces
one order of the signal against the stream's steps with futures, never with timing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from pico.application.flows.streaming import _stream
from pico.application.model import (
    Done,
    Message,
    ProviderError,
    Request,
    Response,
    StreamEvent,
    TextDelta,
    TextPart,
)
from pico.application.tasks import StopSignal

REQUEST = Request(model="m", messages=(Message("user", (TextPart("hi"),)),))
ANSWER = Response(Message("assistant", (TextPart("hello"),)), "end_turn", None)


class _Provider:
    """A stream of two steps: one text delta, then (once ``gate`` resolves) the answer.
    ``before_done`` runs inside the stream's last step, before it yields the answer."""

    def __init__(self, before_done: Callable[[], None] = lambda: None) -> None:
        self.gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.before_done = before_done
        self.closed = False
        self.swallow = False

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        try:
            yield TextDelta("hel")
            try:
                await self.gate
            except asyncio.CancelledError:
                if not self.swallow:
                    raise
            self.before_done()
            yield Done(ANSWER)
        finally:
            self.closed = True


class _Converting(_Provider):
    """A provider whose stream turns a cancellation into its own error, or (``swallow``)
    catches it and answers anyway."""

    def __init__(self, *, swallow: bool) -> None:
        super().__init__()
        self.swallow = swallow

    async def _events(self) -> AsyncIterator[StreamEvent]:
        yield TextDelta("hel")
        try:
            await self.gate
        except asyncio.CancelledError:
            if not self.swallow:
                raise ProviderError("connection dropped", kind="retryable") from None
        yield Done(ANSWER)


class _Execution:
    """The two things a stream uses of its execution: the signal and working commands."""

    def __init__(self, signal: asyncio.Event) -> None:
        self.signal = signal

    async def working(self, build: Callable[[Any], Any]) -> Any:
        raise AssertionError("no frame fills in these streams")


async def _run(provider: _Provider, ctx: _Execution) -> Any:
    return await _stream(provider, REQUEST, ctx, frames=None)  # type: ignore[arg-type]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _after(task: asyncio.Task[Any], then: Callable[[], Awaitable[Any]]) -> Any:
    """What ``task``'s coroutine sees after its stream: it is not left cancelled."""
    result = await task
    return result, await then()


async def test_a_signal_set_while_the_stream_waits_stops_it_and_leaves_the_task_usable() -> None:
    provider, signal = _Provider(), StopSignal()

    async def execution() -> tuple[Any, int, str]:
        outcome = await _run(provider, _Execution(signal))
        await asyncio.sleep(0)  # the execution goes on awaiting: not cancelled
        task = asyncio.current_task()
        assert task is not None
        return outcome, task.cancelling(), "went on"

    task = asyncio.ensure_future(execution())
    await _settle()  # the stream waits on the provider's gate
    assert not provider.closed
    signal.set()
    assert await task == (None, 0, "went on")
    assert provider.closed  # the provider's stream was closed (best-effort cancellation)
    assert signal._callbacks == []


async def test_a_signal_set_in_the_streams_last_step_is_taken_back_before_the_caller_awaits() -> (
    None
):
    signal = StopSignal()
    provider = _Provider(before_done=signal.set)  # set inside the step that yields the answer

    async def execution() -> tuple[Any, int]:
        outcome = await _run(provider, _Execution(signal))
        await asyncio.sleep(0)  # the pending cancellation was ours: it must not land here
        task = asyncio.current_task()
        assert task is not None
        return outcome, task.cancelling()

    task = asyncio.ensure_future(execution())
    await _settle()
    provider.gate.set_result(None)
    assert await task == (None, 0)  # stopped: the answer is discarded, as the race did


async def test_a_stream_that_swallows_the_stop_is_still_stopped_and_uncancelled() -> None:
    provider, signal = _Provider(), StopSignal()
    provider.swallow = True  # catches the cancellation and yields its answer anyway

    async def execution() -> tuple[Any, int]:
        outcome = await _run(provider, _Execution(signal))
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return outcome, task.cancelling()

    task = asyncio.ensure_future(execution())
    await _settle()
    signal.set()
    assert await task == (None, 0)


@pytest.mark.parametrize("signal_first", [True, False])
async def test_another_cancellation_of_the_task_propagates_with_or_without_the_signal(
    signal_first: bool,
) -> None:
    provider, signal = _Provider(), StopSignal()
    task = asyncio.ensure_future(_run(provider, _Execution(signal)))
    await _settle()
    if signal_first:
        signal.set()
        task.cancel()
    else:
        task.cancel()
        signal.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.closed


async def test_an_unset_signal_returns_the_answer_and_keeps_no_callback() -> None:
    provider, signal = _Provider(), StopSignal()
    later: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def execution() -> tuple[Any, str]:
        outcome = await _run(provider, _Execution(signal))
        return outcome, await later  # the execution goes on after its stream

    task = asyncio.ensure_future(execution())
    await _settle()
    provider.gate.set_result(None)
    await _settle()
    assert signal._callbacks == []
    signal.set()  # while the execution awaits something else: it must not be cancelled
    await _settle()
    later.set_result("went on")
    assert await task == (ANSWER, "went on")


async def test_a_plain_event_signal_still_stops_the_stream() -> None:
    """A caller's own TaskExecution may hand a plain asyncio.Event: the racing path."""
    provider, signal = _Provider(), asyncio.Event()
    task = asyncio.ensure_future(_run(provider, _Execution(signal)))
    await _settle()
    signal.set()
    assert await task is None
    assert provider.closed


def test_a_stop_signal_runs_each_callback_once_and_not_a_removed_one() -> None:
    signal = StopSignal()
    calls: list[str] = []
    signal.on_set(lambda: calls.append("a"))
    remove_b = signal.on_set(lambda: calls.append("b"))
    signal.on_set(lambda: calls.append("c"))
    remove_b()
    signal.set()
    signal.set()
    assert calls == ["a", "c"]
    assert signal.is_set()
    remove_b()  # removing after the set is harmless


@pytest.mark.parametrize("swallow", [False, True])
@pytest.mark.parametrize("signal_class", [StopSignal, asyncio.Event])
async def test_another_cancellation_wins_even_when_the_stream_converts_or_swallows_it(
    swallow: bool, signal_class: type[asyncio.Event]
) -> None:
    """A shutdown's cancel reaches the provider's stream now that it runs in the
    execution's task: turned into a ProviderError or swallowed, it still raises
    CancelledError, as it did when the execution sat in the race."""
    provider, signal = _Converting(swallow=swallow), signal_class()
    task = asyncio.ensure_future(_run(provider, _Execution(signal)))
    await _settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("signal_class", [StopSignal, asyncio.Event])
async def test_a_timeout_around_the_execution_is_a_timeout_not_a_provider_error(
    signal_class: type[asyncio.Event],
) -> None:
    provider, signal = _Converting(swallow=False), signal_class()

    async def execution() -> str:
        try:
            async with asyncio.timeout(0):
                await _run(provider, _Execution(signal))
        except TimeoutError:
            return "timeout"
        return "no timeout"

    assert await execution() == "timeout"


async def test_a_stop_counts_from_the_cancellations_the_task_came_in_with() -> None:
    """An execution that swallowed an earlier cancellation (its count stays 1) is still
    stopped, not cancelled, by the signal."""
    provider, signal = _Provider(), StopSignal()

    async def execution() -> tuple[Any, int]:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):  # swallowed, never uncancelled
            await asyncio.sleep(0)
        outcome = await _run(provider, _Execution(signal))
        await asyncio.sleep(0)
        return outcome, task.cancelling()

    task = asyncio.ensure_future(execution())
    await _settle()
    signal.set()
    assert await task == (None, 1)


async def test_a_stop_set_in_the_streams_own_step_does_not_land_at_the_next_await() -> None:
    """The signal is set inside the execution's own step (a lease-lost callback, say) and
    the stream then raises a CancelledError of its own in that same step: the stop's
    cancellation, still pending, is taken here, not at the caller's next await."""
    signal = StopSignal()

    class _SetsAndCancels(_Provider):
        async def _events(self) -> AsyncIterator[StreamEvent]:
            yield TextDelta("hel")
            signal.set()
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            await cancelled  # raises at once, without yielding to the loop
            yield Done(ANSWER)

    async def execution() -> tuple[Any, int]:
        outcome = await _run(_SetsAndCancels(), _Execution(signal))
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return outcome, task.cancelling()

    assert await asyncio.ensure_future(execution()) == (None, 0)


class _Fatal(BaseException):
    """Stands in for KeyboardInterrupt and SystemExit: never an outcome of a stream."""


async def test_a_base_exception_that_is_no_cancellation_passes_through_a_stop() -> None:
    signal = StopSignal()

    class _Dies(_Provider):
        async def _events(self) -> AsyncIterator[StreamEvent]:
            yield TextDelta("hel")
            try:
                await self.gate
            except asyncio.CancelledError:
                raise _Fatal() from None
            yield Done(ANSWER)

    task = asyncio.ensure_future(_run(_Dies(), _Execution(signal)))
    await _settle()
    signal.set()
    with pytest.raises(_Fatal):
        await task
