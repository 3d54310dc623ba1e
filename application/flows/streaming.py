"""One model-provider stream into a task's working scope, shared by generation (§8.3) and
collapse (§8.5): text frames of ``FRAME_CHARS`` written as they fill, the execution's stop
signal raced for the whole stream, and known usage accumulated (unknown is not zero).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from pico.application.flows.common import append_frame
from pico.application.model import (
    Deferred,
    Done,
    ModelProvider,
    ProviderError,
    Request,
    Response,
    TextDelta,
    Usage,
)
from pico.application.tasks import StopSignal, TaskExecution
from pico.application.telemetry import Telemetry
from pico.domain.json import JsonObject, JsonValue

__all__ = ["FRAME_CHARS", "add_usage", "stream_response"]


#: Streamed text is written to the working scope in frames of about this many characters:
#: one working commit per frame, not per token (a bounded buffer, drained before settling).
FRAME_CHARS = 512


async def stream_response(
    provider: ModelProvider,
    request: Request,
    ctx: TaskExecution,
    frames: Any,
    telemetry: Telemetry,
) -> Response | Deferred | None:
    """Consume one provider stream, writing frames to the working scope, racing the
    execution's stop signal: an abort stops streaming at once (None). Frames are buffered:
    a frame of ``FRAME_CHARS`` is written (awaited) as soon as it fills; the rest is
    superseded by the settlement, which carries the whole message. The request is one
    ``chat {model}`` span of ``telemetry`` (telemetry.py)."""
    if ctx.signal.is_set():
        return None
    with telemetry.request(provider, request) as span:
        outcome = await _stream(provider, request, ctx, frames)
        telemetry.responded(span, outcome)
        return outcome


async def _stream(
    provider: ModelProvider, request: Request, ctx: TaskExecution, frames: Any
) -> Response | Deferred | None:
    events = provider.stream(request).__aiter__()

    async def consume() -> Response | Deferred:
        buffer: list[str] = []
        buffered = 0
        async for event in events:
            if isinstance(event, TextDelta):
                buffer.append(event.text)
                buffered += len(event.text)
                if buffered >= FRAME_CHARS:
                    await ctx.working(append_frame(frames, "".join(buffer)))
                    buffer.clear()
                    buffered = 0
            elif isinstance(event, Done):
                # The settlement publishes the whole message and retires this working scope
                # in one command: writing the last partial frame first would be pure waste.
                return event.outcome
        raise ProviderError("the stream ended without a response", kind="retryable")

    signal = ctx.signal
    if isinstance(signal, StopSignal):
        return await _until_stopped(signal, consume(), events)
    # A plain event (a caller's own TaskExecution): one race for the whole stream, not one
    # per step: the stop signal cancels the consumer wherever it waits.
    consumer = asyncio.ensure_future(consume())
    stop = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait({consumer, stop}, return_when=asyncio.FIRST_COMPLETED)
        if stop.done() or not consumer.done():
            return None  # stopped: whatever the consumer had is discarded (finally)
        return consumer.result()
    finally:
        stop.cancel()
        if not consumer.done():
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
        await _close(events)


async def _until_stopped(
    signal: StopSignal, consume: Coroutine[Any, Any, Response | Deferred], events: Any
) -> Response | Deferred | None:
    """``consume`` in this task, stopped where it waits when ``signal`` is set: setting it
    cancels this task, and that one cancellation is taken back here (as ``asyncio.timeout``
    does), so a stream costs no task of its own and no task watching the signal (two
    tasks and four steps of the event loop a stream). None when stopped: whatever the
    stream returned or raised on its way out is discarded, as the racing consumer's was.

    Any other cancellation of this task (a shutdown, an ``asyncio.timeout`` around the
    execution) raises ``CancelledError`` here, as it did when the task sat in the race,
    even when the provider's stream swallowed it or turned it into another error: what
    decides is the task's count of cancellations, against the count it came in with."""
    task = asyncio.current_task()
    assert task is not None
    entry = task.cancelling()
    fired = False

    def stop() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    remove = signal.on_set(stop)
    try:
        raised: BaseException | None = None
        outcome: Response | Deferred | None = None
        try:
            outcome = await consume
        except (Exception, asyncio.CancelledError) as exc:  # sorted out below, by whose
            raised = exc  # cancellation it is (KeyboardInterrupt and the like pass through)
        finally:
            remove()
        if fired:
            await _take_back(task)
        if task.cancelling() > entry:  # someone else's cancellation is outstanding
            if isinstance(raised, asyncio.CancelledError):
                raise raised
            raise asyncio.CancelledError() from raised
        if fired:
            return None
        if raised is not None:
            raise raised
        return outcome
    finally:
        await _close(events)


async def _take_back(task: asyncio.Task[Any]) -> None:
    """Take back the one cancellation ``_until_stopped`` gave ``task``: raised by the
    stream already, swallowed or turned into another error on the way, or still pending
    (the signal was set after the stream's last wait, or in this task's own step).
    Pending, it is raised here, where it is ours, not at the caller's next await."""
    with contextlib.suppress(asyncio.CancelledError):  # ours, or another's as well: the
        await asyncio.sleep(0)  # caller compares the counts
    task.uncancel()


async def _close(events: Any) -> None:
    closer = getattr(events, "aclose", None)
    if closer is not None:
        await closer()  # best-effort provider cancellation


def add_usage(previous: JsonValue, usage: Usage | None) -> JsonValue:
    """Accumulate known usage; unknown (None) adds nothing and is not zero. Cache counts
    appear once some attempt reported them."""
    if usage is None:
        return previous
    base = previous if isinstance(previous, dict) else {}
    reported = usage.as_json()
    total: JsonObject = {}
    for key in ("input", "output", "cache_read", "cache_write"):
        if key in reported or key in base:
            before, now = base.get(key, 0), reported.get(key, 0)
            total[key] = (before if isinstance(before, int) else 0) + (
                now if isinstance(now, int) else 0
            )
    return total
