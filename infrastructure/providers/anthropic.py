"""The Anthropic adapter (issue 17, §8.3): the ``ModelProvider`` port on the official
``anthropic`` SDK's streaming Messages API. It maps pico's messages to content blocks,
marks the stable prefix for the prompt cache, turns the server-sent events into text and
thinking deltas and one ``Response``, and classifies every failure into ``ProviderError``.

The SDK's own retries are off by default (``max_retries=0``): the generation task owns
retries durably (a retry survives a crash, honours ``retry-after`` and is audited).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

from pico.application.model import (
    Done,
    ImagePart,
    Message,
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
)
from pico.domain.errors import ConfigurationError, InvalidArgumentError
from pico.domain.json import JsonObject, JsonValue, strict_json
from pico.infrastructure.providers.common import (
    cause,
    classify_status,
    redact,
    retry_after,
    safe_url,
)

try:
    import anthropic
    import httpx2
except ImportError as missing:  # pragma: no cover - the extra is installed in dev
    raise ConfigurationError(
        "pico's Anthropic adapter needs the anthropic SDK, which is not installed "
        f"({missing}); install the extra: pip install 'pico-harness[anthropic]'"
    ) from missing

__all__ = ["AnthropicProvider"]

#: The stream class the SDK parses a Messages stream into (raw events, one per SSE event).
_EVENTS = anthropic.AsyncStream[anthropic.types.RawMessageStreamEvent]

#: Request fields the adapter builds itself: an option may not set them.
RESERVED_OPTIONS = frozenset({"model", "messages", "system", "tools", "stream", "max_tokens"})

#: The ephemeral prompt-cache breakpoint (the API allows at most four per request).
EPHEMERAL: JsonObject = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4

#: Phrases of a 400 ``invalid_request_error`` that mean the prompt does not fit the
#: model's context window: overflow (collapse and retry), not a fatal request error.
OVERFLOW_PHRASES = (
    "prompt is too long",
    "context window",
    "context length",
    "exceed context limit",
    "exceeds the context",
    "too many tokens",
)

#: Anthropic's stop reasons mapped to pico's. ``pause_turn`` (a server-tool turn the API
#: paused) ends the turn with what was said: pico offers no server tools, and the user's
#: next input continues. ``model_context_window_exceeded`` is an output cut short, like
#: ``max_tokens`` (so a tool call in it is never run).
STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "refusal",
    "pause_turn": "end_turn",
    "model_context_window_exceeded": "max_tokens",
}

#: How much of an unreadable tool input an ``unusable`` reason quotes.
RAW_PREFIX = 120


class AnthropicProvider:
    """Claude through the Messages API, streamed.

    Args:
        api_key: The API key. ``None`` lets the SDK read ``ANTHROPIC_API_KEY`` when the
            provider is constructed (never at import). It is never stored, logged or
            fingerprinted.
        base_url: Another endpoint (a proxy, a gateway); the API's own by default.
        timeout: Seconds the SDK waits for the server (connect, each read).
        max_retries: The SDK's own retries per attempt; 0 leaves retries to the
            generation task, which makes them durable.
        max_tokens: The answer's token limit (a request option, captured per generation).
        options: More request options sent as given: ``temperature``, ``top_p``,
            ``top_k``, ``stop_sequences``, ``thinking={"type": "enabled",
            "budget_tokens": N}``, ``metadata``, ... (strict JSON; not the fields the
            adapter builds: model, messages, system, tools, stream, max_tokens).
        cache: Mark the stable prefix of each request for the prompt cache (the system
            prompt, the tools, the last block of the final message).
        client: An ``anthropic.AsyncAnthropic`` to use instead of building one (then
            ``api_key``, ``base_url``, ``timeout`` and ``max_retries`` are its own).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 0,
        max_tokens: int = 4096,
        options: Mapping[str, JsonValue] | None = None,
        cache: bool = True,
        client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            _bad("api_key", "a non-empty string, or None to let the SDK read ANTHROPIC_API_KEY")
        if base_url is not None and (
            not isinstance(base_url, str)
            or urlsplit(base_url).scheme not in ("http", "https")
            or not urlsplit(base_url).hostname
        ):
            _bad("base_url", "an http(s) URL such as https://api.anthropic.com", base_url)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            _bad("timeout", "a finite number of seconds above 0", timeout)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            _bad("max_retries", "an int of at least 0", max_retries)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            _bad("max_tokens", "an int of at least 1", max_tokens)
        if not isinstance(cache, bool):
            _bad("cache", "True or False", cache)
        self._options = _checked_options(options)
        self._max_tokens = max_tokens
        self._cache = cache
        if client is not None:
            if not isinstance(client, anthropic.AsyncAnthropic):
                _bad("client", "an anthropic.AsyncAnthropic", type(client).__name__)
            if api_key is not None or base_url is not None:
                _bad("client", "given alone: api_key and base_url are the client's own")
            self._client = client
            self._owns_client = False
        else:
            self._owns_client = True
            self._client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, timeout=float(timeout), max_retries=max_retries
            )
        self._timeout = float(timeout)

    def request_options(self) -> JsonObject:
        """What a generation captures when it is created and every attempt sends:
        ``max_tokens`` and the constructor's options (never the key)."""
        return {"max_tokens": self._max_tokens, **self._options}  # checked and copied once

    def fingerprint(self) -> JsonObject:
        """The non-secret identity the resume gate hashes: the API, the endpoint's host,
        the request options and whether the prompt cache is used."""
        host = urlsplit(safe_url(self._client.base_url)).hostname or ""
        return {
            "api": "anthropic-messages",
            "host": host,
            "options": self.request_options(),
            "cache": self._cache,
        }

    async def aclose(self) -> None:
        """Close the SDK client's pooled connections (a client passed in is the caller's
        to close). Optional: a provider left open is collected with its pool."""
        if self._owns_client:
            await self._client.close()

    async def poll(self, handle: str) -> NoReturn:
        raise ProviderError(
            f"the Anthropic provider never defers a request, so it cannot poll {handle!r}; "
            "a generation stored with this handle was made by another provider",
            kind="fatal",
        )

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        """One streamed Messages request, built from ``request.settings`` (the options the
        generation captured), never from this provider's current options. Closing the
        iterator (an abort) closes the HTTP response, so the connection drops at once."""
        settings = dict(request.settings)
        max_tokens = settings.pop("max_tokens", self._max_tokens)
        for name in RESERVED_OPTIONS:
            settings.pop(name, None)
        body: JsonObject = {
            **settings,
            "model": request.model,
            "max_tokens": max_tokens,
            "messages": list[JsonValue](self._messages(request.messages)),
            "stream": True,
        }
        if request.system:
            system: JsonObject = {"type": "text", "text": request.system}
            if self._cache:
                system["cache_control"] = dict(EPHEMERAL)
            body["system"] = [system]
        if request.tools:
            tools: list[JsonValue] = []
            for t in request.tools:
                tools.append(
                    {"name": t.name, "description": t.description, "input_schema": t.parameters}
                )
            if self._cache:
                last = tools[-1]
                assert isinstance(last, dict)
                last["cache_control"] = dict(EPHEMERAL)
            body["tools"] = tools
        reading = _Reading()
        sdk_stream: Any = None
        try:
            # The body is pico's strict JSON already, so it is sent as encoded bytes: the
            # SDK's messages.create would walk and copy the whole context first (its
            # request preparation), the largest cost per request on a long conversation.
            sdk_stream = await self._client.post(
                "/v1/messages",
                cast_to=anthropic.types.Message,
                content=json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
                options={"headers": {"content-type": "application/json"}},
                stream=True,
                stream_cls=_EVENTS,
            )
            async for event in sdk_stream:
                for out in reading.take(event):
                    yield out
                if reading.stopped:
                    break
        except ProviderError:
            raise
        except anthropic.APIStatusError as error:
            raise self._secret_free(_status_error(error, reading.usage())) from None
        except anthropic.APITimeoutError:
            raise ProviderError(
                f"Anthropic did not answer within {self._timeout:g} s (timeout); the "
                "generation retries; raise timeout= if long answers are expected",
                kind="retryable",
                usage=reading.usage(),
            ) from None
        except anthropic.APIConnectionError as error:
            raise self._secret_free(
                ProviderError(
                    f"could not reach Anthropic at {safe_url(self._client.base_url)} "
                    f"({error.message} {cause(error)}); the generation retries; check the "
                    "network or base_url",
                    kind="retryable",
                    usage=reading.usage(),
                )
            ) from None
        except json.JSONDecodeError as error:
            raise ProviderError(
                f"Anthropic sent a stream event whose data is not JSON ({error}); the "
                "generation retries; a proxy between pico and the API may be altering it",
                kind="retryable",
                usage=reading.usage(),
            ) from None
        except (httpx2.HTTPError, httpx2.StreamError) as error:
            raise self._secret_free(
                ProviderError(
                    f"the connection to Anthropic broke mid-stream ({type(error).__name__}: "
                    f"{error}); the generation retries",
                    kind="retryable",
                    usage=reading.usage(),
                )
            ) from None
        except anthropic.AnthropicError as error:
            raise self._secret_free(
                ProviderError(
                    f"the Anthropic SDK failed before an answer ({type(error).__name__}: "
                    f"{error}); check the provider's configuration (api_key, base_url)",
                    kind="fatal",
                    usage=reading.usage(),
                )
            ) from None
        finally:
            if sdk_stream is not None:
                await sdk_stream.close()  # drops the connection when the body is unread
        if not reading.stopped:
            raise ProviderError(
                "the Anthropic stream ended before message_stop (the connection closed "
                "mid-answer); the generation retries",
                kind="retryable",
                usage=reading.usage(),
            )
        yield Done(reading.response())

    def _secret_free(self, error: ProviderError) -> ProviderError:
        """The error with the client's key or token masked, should a server (or a proxy)
        echo it in its message: a ProviderError's message is stored with the input."""
        message = redact(str(error), (self._client.api_key, self._client.auth_token))
        if message == str(error):
            return error
        return ProviderError(
            message, kind=error.kind, usage=error.usage, retry_after=error.retry_after
        )

    def _messages(self, messages: Sequence[Message]) -> list[JsonObject]:
        out: list[JsonObject] = []
        for message in messages:
            blocks: list[JsonValue] = [
                b for b in (_block(p) for p in message.parts) if b is not None
            ]
            if blocks:  # the API refuses an empty content list
                out.append({"role": message.role, "content": blocks})
        if self._cache and out:
            _mark_last(out[-1])
        return out


def _strict_options(options: Mapping[str, JsonValue]) -> JsonObject:
    copied = strict_json(dict(options), what="options")
    assert isinstance(copied, dict)
    return copied


def _checked_options(options: Mapping[str, JsonValue] | None) -> JsonObject:
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        _bad("options", "a mapping of option names to JSON values", type(options).__name__)
    reserved = sorted(RESERVED_OPTIONS & set(options))
    if reserved:
        _bad(
            "options",
            "request options other than the ones the adapter builds "
            "(pass max_tokens= as its own argument)",
            reserved,
        )
    try:
        return _strict_options(options)
    except Exception as error:  # the strict-JSON gate's error names the bad value
        raise InvalidArgumentError(f"options must be strict JSON: {error}") from None


def _bad(argument: str, expected: str, given: object = None) -> NoReturn:
    shown = "" if given is None else f"; got {given!r}"
    raise InvalidArgumentError(f"AnthropicProvider {argument} must be {expected}{shown}")


def _block(part: object) -> JsonObject | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, ThinkingPart):
        # The API verifies thinking sent back by its signature; unsigned thinking (from
        # another provider, or stored before signatures were kept) is dropped, never forged.
        if part.signature:
            return {"type": "thinking", "thinking": part.text, "signature": part.signature}
        return None
    if isinstance(part, ToolCallPart):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": part.arguments}
    if isinstance(part, ToolResultPart):
        content: list[JsonValue] = []
        if part.content:
            content.append({"type": "text", "text": part.content})
        content.extend(_image(i) for i in part.images)
        result: JsonObject = {"type": "tool_result", "tool_use_id": part.call_id}
        if content:
            result["content"] = content
        if part.is_error:
            result["is_error"] = True
        return result
    if isinstance(part, ImagePart):
        return _image(part)
    return None


def _image(part: ImagePart) -> JsonObject:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": part.mime, "data": part.data},
    }


def _mark_last(message: JsonObject) -> None:
    """The cache breakpoint of the final message: its last block that may carry one
    (not a thinking block), so the next request's prefix reads this one's from cache."""
    blocks = message["content"]
    assert isinstance(blocks, list)
    for block in reversed(blocks):
        if isinstance(block, dict) and block.get("type") != "thinking":
            block["cache_control"] = dict(EPHEMERAL)
            return


@dataclass
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    signature: str = ""
    call_id: str = ""
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    part: TextPart | ThinkingPart | ToolCallPart | None = None


@dataclass
class _Reading:
    """What one stream said so far: the blocks by index, the stop reason, the usage."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    stop_reason: StopReason = "end_turn"
    stopped: bool = False
    started: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def take(self, event: Any) -> list[StreamEvent]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self.started = True
            self._count(event.message.usage)
        elif kind == "content_block_start":
            return self._start(event.index, event.content_block)
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            block = self.blocks.get(event.index)
            if block is not None:
                self._finish(block)
        elif kind == "message_delta":
            reason = event.delta.stop_reason
            if reason is not None:
                self.stop_reason = STOP_REASONS.get(reason, "end_turn")
            self._count(event.usage)
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _start(self, index: int, content: Any) -> list[StreamEvent]:
        kind = getattr(content, "type", "")
        block = _Block(kind)
        self.blocks[index] = block
        if kind == "text" and content.text:
            block.text.append(content.text)
            return [TextDelta(content.text)]
        if kind == "thinking" and content.thinking:
            block.text.append(content.thinking)
            block.signature = content.signature or ""
            return [ThinkingDelta(content.thinking)]
        if kind == "tool_use":
            block.call_id, block.name = content.id, content.name
            if isinstance(content.input, dict) and content.input:
                block.fragments.append(json.dumps(content.input))
        return []

    def _delta(self, index: int, delta: Any) -> list[StreamEvent]:
        block = self.blocks.get(index)
        if block is None:
            return []
        kind = getattr(delta, "type", "")
        if kind == "text_delta":
            block.text.append(delta.text)
            return [TextDelta(delta.text)]
        if kind == "thinking_delta":
            block.text.append(delta.thinking)
            return [ThinkingDelta(delta.thinking)]
        if kind == "signature_delta":
            block.signature = delta.signature
        elif kind == "input_json_delta":
            block.fragments.append(delta.partial_json)
        return []

    def _finish(self, block: _Block) -> None:
        if block.part is not None:
            return
        if block.kind == "text":
            block.part = TextPart("".join(block.text))
        elif block.kind == "thinking":
            # The signature is stored with the entry and sent back with a tool turn.
            block.part = ThinkingPart("".join(block.text), block.signature)
        elif block.kind == "tool_use":
            arguments, unusable = _arguments("".join(block.fragments))
            block.part = ToolCallPart(block.call_id, block.name, arguments, unusable)

    def _count(self, usage: Any) -> None:
        # message_start reports the prompt; message_delta's counts are cumulative.
        if usage is None:
            return
        if getattr(usage, "input_tokens", None) is not None:
            self.input_tokens = usage.input_tokens
        if getattr(usage, "output_tokens", None) is not None:
            self.output_tokens = usage.output_tokens
        if getattr(usage, "cache_read_input_tokens", None) is not None:
            self.cache_read = usage.cache_read_input_tokens
        if getattr(usage, "cache_creation_input_tokens", None) is not None:
            self.cache_write = usage.cache_creation_input_tokens

    def usage(self) -> Usage | None:
        """What the stream reported so far; None before message_start (unknown)."""
        if not self.started:
            return None
        return Usage(
            self.input_tokens + self.cache_read + self.cache_write,
            self.output_tokens,
            self.cache_read,
            self.cache_write,
        )

    def response(self) -> Response:
        parts: list[TextPart | ThinkingPart | ToolCallPart] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            self._finish(block)  # a block the stream never stopped still counts
            if block.part is not None:
                parts.append(block.part)
        return Response(Message("assistant", tuple(parts)), self.stop_reason, self.usage())


def _arguments(raw: str) -> tuple[JsonObject, str]:
    """A tool call's arguments from its streamed fragments, or {} and why they are
    unusable (the call is then answered with an error result, never invoked)."""
    if not raw.strip():
        return {}, ""
    try:
        value = strict_json(json.loads(raw), what="tool input")
    except Exception as error:
        return {}, f"the tool input is not valid JSON ({error}); it began {raw[:RAW_PREFIX]!r}"
    if not isinstance(value, dict):
        return {}, f"the tool input is not a JSON object; it began {raw[:RAW_PREFIX]!r}"
    return value, ""


def _status_error(error: anthropic.APIStatusError, usage: Usage | None) -> ProviderError:
    """An error status (or an ``error`` event mid-stream, which the SDK raises with the
    stream's own status, 200) classified by the error type first, then the status."""
    status = error.status_code
    kind_name = error.type or ""
    said = error.api_message or _body_text(error.body)
    where = f"status {status}" if status != 200 else "an error event mid-stream"
    request_id = f" (request id {error.request_id})" if error.request_id else ""
    head = f"Anthropic answered {where}, {kind_name or 'error'}: {said}{request_id}"
    wait = retry_after(dict(error.response.headers))
    kind: Literal["retryable", "overflow", "fatal"]
    if kind_name == "overloaded_error" or status == 529:
        kind, advice = "retryable", "Anthropic is overloaded; the generation retries"
    elif kind_name == "rate_limit_error" or status == 429:
        kind, advice = "retryable", "rate limited; the generation retries"
    elif (kind_name in ("invalid_request_error", "") and status in (400, 200, 413)) and any(
        phrase in said.lower() for phrase in OVERFLOW_PHRASES
    ):
        kind = "overflow"
        advice = "the prompt exceeds the model's context window; the context is compacted"
    elif kind_name == "authentication_error" or status == 401:
        kind = "fatal"
        advice = "check the API key (api_key=, or ANTHROPIC_API_KEY when api_key is None)"
    elif kind_name == "permission_error" or status == 403:
        kind, advice = "fatal", "the key may not use this model or feature; check its workspace"
    elif kind_name == "not_found_error" or status == 404:
        kind, advice = "fatal", "check the model name and base_url"
    elif status == 200:  # mid-stream: only the server's own failures are worth a retry
        kind = "retryable" if kind_name in ("api_error", "timeout_error") else "fatal"
        advice = "the generation retries" if kind == "retryable" else "fix the request"
    else:
        kind = classify_status(status)
        advice = (
            "the generation retries"
            if kind == "retryable"
            else "the same request would fail again; fix the request or its options"
        )
    if kind == "retryable" and wait is not None:
        advice += f" after {wait:g} s (retry-after)"
    return ProviderError(
        f"{head}; {advice}",
        kind=kind,
        usage=usage,
        retry_after=wait if kind == "retryable" else None,
    )


def _body_text(body: object) -> str:
    if body is None:
        return "no message"
    text = body if isinstance(body, str) else json.dumps(body, default=str)
    return text[:300]
