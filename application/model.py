"""The model provider port (§8.3) and the provider-neutral message shapes.

Projection (§2.2) turns selected entries into ``Message`` values; a ``ModelProvider``
streams a ``Response`` for a ``Request``. Errors are classified so the generation task can
choose retry, overflow compaction or failure without knowing the provider.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from pico.domain.errors import PicoError
from pico.domain.json import JsonObject, JsonValue

__all__ = [
    "Deferred",
    "Done",
    "ImagePart",
    "Message",
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

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: JsonObject


@dataclass(frozen=True)
class Request:
    model: str
    messages: tuple[Message, ...]
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
