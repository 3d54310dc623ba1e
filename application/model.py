"""The model provider port (§8.3) and the provider-neutral message shapes.

Projection (§2.2) turns selected entries into ``Message`` values; a ``ModelProvider``
streams a ``Response`` for a ``Request``. Errors are classified so the generation task can
choose retry, overflow compaction or failure without knowing the provider.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, Literal, Protocol, TypeAlias, overload

from pico.domain.errors import PicoError
from pico.domain.json import JsonObject, JsonValue

__all__ = [
    "Deferred",
    "Done",
    "ImagePart",
    "Message",
    "Messages",
    "ModelProvider",
    "Part",
    "ProviderError",
    "Request",
    "Response",
    "StopReason",
    "StreamEvent",
    "TextDelta",
    "TextPart",
    "ThinkingDelta",
    "ThinkingPart",
    "ToolCallPart",
    "ToolResultPart",
    "ToolSpec",
    "Usage",
    "estimate_tokens",
]

Role = Literal["user", "assistant"]
StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence", "refusal"]


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ThinkingPart:
    """The model's reasoning. ``signature`` is the provider's proof of it where the API
    signs thinking (Anthropic): kept with the entry and sent back with it, as the API
    requires on a turn that continues after tool results."""

    text: str
    signature: str = ""


@dataclass(frozen=True)
class ToolCallPart:
    """A tool call. ``unusable`` is set (with ``arguments`` empty) when a provider got
    arguments it could not read as a JSON object (a stream cut inside them, invalid JSON):
    the call is recorded and answered with an error result, never invoked (§8.3)."""

    id: str
    name: str
    arguments: JsonObject
    unusable: str = ""


@dataclass(frozen=True)
class ImagePart:
    """An image as base64 data with its media type."""

    mime: str
    data: str


@dataclass(frozen=True)
class ToolResultPart:
    call_id: str
    content: str
    is_error: bool = False
    images: tuple[ImagePart, ...] = ()


Part: TypeAlias = TextPart | ThinkingPart | ToolCallPart | ToolResultPart | ImagePart


@dataclass(frozen=True)
class Message:
    """One provider message. Tool results travel in a user message (seed 000, "Folding")."""

    role: Role
    parts: tuple[Part, ...]

    # List comprehensions, not generators: a generator is resumed once an item.
    @property
    def text(self) -> str:
        return "".join([p.text for p in self.parts if isinstance(p, TextPart)])

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple([p for p in self.parts if isinstance(p, ToolCallPart)])


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: JsonObject


class Messages(Sequence[Message]):
    """A request's messages: an immutable sequence that shares the settled part of a
    conversation's context with the requests before it. It holds the first ``count``
    messages of ``settled``, a list only ever appended to (the projection cache's), then
    ``tail``. A request of a long conversation thus costs no copy of its whole context
    (a tuple of 10,000 messages takes ~20 us to build, and a turn builds two).

    Reads like a tuple: indexing, slices (a tuple), iteration, ``len``, ``+`` (a tuple),
    and equal to any sequence of equal messages (a tuple or list among them)."""

    __slots__ = ("_count", "_settled", "_tail")

    def __init__(self, settled: list[Message], count: int, tail: tuple[Message, ...] = ()) -> None:
        if not 0 <= count <= len(settled):
            raise ValueError(f"count {count} is outside the settled list ({len(settled)})")
        self._settled = settled
        self._count = count
        self._tail = tail

    def __len__(self) -> int:
        return self._count + len(self._tail)

    @property
    def settled(self) -> tuple[list[Message], int]:
        """The settled list this request shares with the conversation's other requests
        (only ever appended to) and how many of its first messages the request holds;
        ``tail`` follows them. A provider may cache what it derives per settled message."""
        return self._settled, self._count

    @property
    def tail(self) -> tuple[Message, ...]:
        return self._tail

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...
    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        count = self._count
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return tuple(self)[index]
            head = tuple(self._settled[start : min(stop, count)]) if start < count else ()
            return head + self._tail[max(start - count, 0) : max(stop - count, 0)]
        i = operator.index(index)
        size = count + len(self._tail)
        if i < 0:
            i += size
        if not 0 <= i < size:
            raise IndexError("message index out of range")
        return self._settled[i] if i < count else self._tail[i - count]

    def __iter__(self) -> Iterator[Message]:
        return chain(islice(self._settled, self._count), self._tail)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (tuple, list, Messages)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[Message]) -> tuple[Message, ...]:
        return (*self, *other)

    def __radd__(self, other: Sequence[Message]) -> tuple[Message, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return f"Messages({tuple(self)!r})"

    # Copies and pickles hold only this request's messages, as a tuple: never the rest of
    # the shared settled list (``copy.deepcopy``, ``dataclasses.asdict``, ``pickle``).
    def __copy__(self) -> Messages:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[Message, ...]:
        return tuple(copy.deepcopy(m, memo) for m in self)

    def __reduce__(self) -> tuple[type[tuple[Message, ...]], tuple[tuple[Message, ...]]]:
        return (tuple, (tuple(self),))


@dataclass(frozen=True)
class Request:
    """What a provider is asked: ``messages`` is a ``Messages`` when the harness projected
    them (it shares the settled context with earlier requests); any sequence of messages
    (a tuple) is accepted."""

    model: str
    messages: Sequence[Message]
    system: str = ""
    tools: tuple[ToolSpec, ...] = ()
    settings: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """Tokens one request used, as the provider reported them. ``input_tokens`` counts
    every prompt token (cached ones included); ``cache_read_tokens`` and
    ``cache_write_tokens`` say how many of them a prompt cache served or stored, where the
    API reports it (0: not reported or none)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def as_json(self) -> JsonObject:
        """The stored shape: input and output always; cache counts only when reported,
        so a provider without a cache stores what it stored before they existed."""
        out: JsonObject = {"input": self.input_tokens, "output": self.output_tokens}
        if self.cache_read_tokens:
            out["cache_read"] = self.cache_read_tokens
        if self.cache_write_tokens:
            out["cache_write"] = self.cache_write_tokens
        return out


@dataclass(frozen=True)
class Response:
    message: Message
    stop_reason: StopReason
    usage: Usage | None  # None: the provider reported nothing (unknown, not zero)


@dataclass(frozen=True)
class Deferred:
    """The provider accepted the request and will answer later; poll with the handle."""

    handle: str
    usage: Usage | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True)
class Done:
    outcome: Response | Deferred


StreamEvent: TypeAlias = TextDelta | ThinkingDelta | Done


def estimate_tokens(chars: int) -> int:
    """Tokens estimated from characters (about four per token), never zero for content."""
    return math.ceil(chars / 4)


class ProviderError(PicoError):
    """A provider failure, classified: ``retryable`` (rate limit, overload, network),
    ``overflow`` (the context is too long: compact and retry) or ``fatal``."""

    def __init__(
        self,
        message: str,
        *,
        kind: Literal["retryable", "overflow", "fatal"],
        usage: Usage | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.kind = kind
        self.usage = usage
        self.retry_after = retry_after
        super().__init__(message)


class ModelProvider(Protocol):
    """Streams one request. The last event is always ``Done``; failures raise
    ``ProviderError``. ``poll`` resolves a deferred handle (again deferred, or done)."""

    def stream(self, request: Request) -> AsyncIterator[StreamEvent]: ...
    async def poll(self, handle: str) -> Response | Deferred: ...
