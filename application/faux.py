"""A scripted model provider that ships with pico, so users test their agents without
spending tokens (and so do our tests).

    provider = FauxProvider([
        "Hello!",                                              # a final answer
        FauxResponse(tool_calls=[("read", {"path": "a.py"})]), # a tool call
        lambda request: f"you said {request.messages[-1].text}",  # a function of the request
        FauxDeferred(polls=2, then="done later"),              # deferred, resolves on poll 2
        FauxFailure("retryable", "overloaded", retry_after=5),  # an injected failure
    ], chunk_chars=4, cadence=0.01, clock=clock)
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pico.application.clock import Clock
from pico.application.model import (
    Deferred,
    Done,
    Message,
    Messages,
    Part,
    ProviderError,
    Request,
    Response,
    StopReason,
    StreamEvent,
    TextDelta,
    TextPart,
    ThinkingDelta,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    estimate_tokens,
)
from pico.domain.json import JsonObject, strict_json

__all__ = ["FauxDeferred", "FauxFailure", "FauxProvider", "FauxResponse", "estimate_tokens"]


@dataclass(frozen=True)
class FauxResponse:
    text: str = ""
    thinking: str = ""
    tool_calls: tuple[tuple[str, JsonObject], ...] | list[tuple[str, JsonObject]] = ()
    stop_reason: StopReason | None = None  # default: tool_use with calls, else end_turn
    report_usage: bool = True


@dataclass(frozen=True)
class FauxDeferred:
    polls: int
    then: FauxResponse | str


@dataclass(frozen=True)
class FauxFailure:
    kind: Literal["retryable", "overflow", "fatal"]
    message: str = "injected failure"
    retry_after: float | None = None
    usage: Usage | None = None  # what the failed attempt still cost


ScriptItem: TypeAlias = (
    str | FauxResponse | FauxDeferred | FauxFailure | Callable[[Request], "FauxResponse | str"]
)


#: Settled lists whose cumulative sizes the faux provider keeps (one a conversation it
#: serves; the projection keeps 64 conversations' too).
_SETTLED_LISTS = 64


def _chars(parts: Iterable[Part]) -> int:
    total = 0
    for p in parts:
        if isinstance(p, (TextPart, ThinkingPart)):
            total += len(p.text)
        elif isinstance(p, ToolCallPart):
            total += len(p.name) + len(str(p.arguments))
        elif isinstance(p, ToolResultPart):
            total += len(p.content)
    return total


@dataclass
class FauxProvider:
    script: list[ScriptItem]
    chunk_chars: int = 8
    cadence: float = 0.0  # seconds between streamed chunks (needs a clock)
    clock: Clock | None = None
    requests: list[Request] = field(default_factory=list)
    polls: list[str] = field(default_factory=list)
    _pending: dict[str, tuple[int, FauxResponse | str, Request]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __init__(
        self,
        script: Iterable[ScriptItem],
        *,
        chunk_chars: int = 8,
        cadence: float = 0.0,
        clock: Clock | None = None,
        keep_requests: bool = True,
    ) -> None:
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be at least 1")
        if cadence and clock is None:
            raise ValueError("a streaming cadence needs a clock (pico.FakeClock in tests)")
        self.script = list(script)
        self.chunk_chars = chunk_chars
        self.cadence = cadence
        self.clock = clock
        self.requests = []
        self.keep_requests = keep_requests  # False for long benchmarks: bookkeeping only
        self.request_count = 0
        self.polls = []
        self._pending = {}
        self._ids = itertools.count(1)
        # Cumulative sizes of each settled list a request shared (``Messages.settled``:
        # only ever appended to), by the list's identity, the most recent few: the usage
        # estimate measures only messages it has not measured (O(new messages) a request,
        # for every conversation the provider serves).
        self._settled: OrderedDict[int, tuple[list[Message], list[int]]] = OrderedDict()

    def _prompt_chars(self, request: Request) -> int:
        """Characters of the request's messages: its settled messages' from their
        cumulative sizes (measured once), the rest measured now. A request that is not a
        ``Messages`` (a caller's own tuple) is measured whole."""
        messages = request.messages
        if not isinstance(messages, Messages):
            return _chars(p for m in messages for p in m.parts)
        settled, count = messages.settled
        known = self._settled.get(id(settled))  # held while kept: an id not reused
        if known is None:
            known = (settled, [0])
            self._settled[id(settled)] = known
            while len(self._settled) > _SETTLED_LISTS:
                self._settled.popitem(last=False)
        self._settled.move_to_end(id(settled))
        sums = known[1]
        for message in settled[len(sums) - 1 : count]:
            sums.append(sums[-1] + _chars(message.parts))
        return sums[count] + _chars(p for m in messages.tail for p in m.parts)

    def _next(self, request: Request) -> FauxResponse | FauxDeferred | FauxFailure:
        if not self.script:
            raise ProviderError(
                "the faux provider's script is exhausted: add responses", kind="fatal"
            )
        item = self.script.pop(0)
        if callable(item) and not isinstance(item, (FauxResponse, FauxDeferred, FauxFailure)):
            item = item(request)
        return FauxResponse(text=item) if isinstance(item, str) else item

    def _response(self, scripted: FauxResponse | str, request: Request) -> Response:
        if isinstance(scripted, str):
            scripted = FauxResponse(text=scripted)
        parts: list[Part] = []
        if scripted.thinking:
            parts.append(ThinkingPart(scripted.thinking))
        if scripted.text:
            parts.append(TextPart(scripted.text))
        for name, arguments in scripted.tool_calls:
            args = strict_json(arguments, what="faux tool arguments")
            assert isinstance(args, dict)
            parts.append(ToolCallPart(f"call_{next(self._ids)}", name, args))
        stop = scripted.stop_reason or ("tool_use" if scripted.tool_calls else "end_turn")
        usage = None
        if scripted.report_usage:
            prompt = self._prompt_chars(request) + len(request.system)
            usage = Usage(estimate_tokens(prompt), estimate_tokens(_chars(parts)))
        return Response(Message("assistant", tuple(parts)), stop, usage)

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        self.request_count += 1
        if self.keep_requests:
            self.requests.append(request)
        item = self._next(request)
        if isinstance(item, FauxFailure):
            raise ProviderError(
                item.message, kind=item.kind, retry_after=item.retry_after, usage=item.usage
            )
        if isinstance(item, FauxDeferred):
            handle = f"faux-deferred-{next(self._ids)}"
            self._pending[handle] = (item.polls, item.then, request)
            yield Done(Deferred(handle))
            return
        response = self._response(item, request)
        for part in response.message.parts:
            if isinstance(part, (TextPart, ThinkingPart)):
                for k in range(0, len(part.text), self.chunk_chars):
                    if self.cadence and self.clock is not None:
                        await self.clock.sleep_until(self.clock.now() + self.cadence)
                    chunk = part.text[k : k + self.chunk_chars]
                    yield TextDelta(chunk) if isinstance(part, TextPart) else ThinkingDelta(chunk)
        yield Done(response)

    async def poll(self, handle: str) -> Response | Deferred:
        self.polls.append(handle)
        pending = self._pending.get(handle)
        if pending is None:
            raise ProviderError(f"unknown deferred handle {handle!r}", kind="fatal")
        remaining, then, request = pending
        if remaining > 1:
            self._pending[handle] = (remaining - 1, then, request)
            return Deferred(handle)
        del self._pending[handle]
        return self._response(then, request)
