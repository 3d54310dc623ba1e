"""The OpenAI-compatible model provider (§8.3, issue 17): the ``ModelProvider`` port over
the official ``openai`` SDK's Chat Completions API, streamed.

    from pico.providers import OpenAIProvider

    provider = OpenAIProvider(api_key=..., options={"temperature": 0.2})
    harness = await pico.Harness.open("sqlite:///agent.db", provider=provider, model="gpt-4.1")

Any server speaking the Chat Completions wire format works through ``base_url`` (vLLM,
Ollama, llama.cpp, LiteLLM, Azure's OpenAI-compatible endpoint). The wire mapping, the error
classification and the reasons for each choice are in docs/providers.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import openai

from pico.application.model import (
    Deferred,
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
from pico.domain.json import JsonObject, JsonValue, is_strict_json, strict_json
from pico.infrastructure.providers.common import (
    cause,
    classify_status,
    redact,
    retry_after,
    safe_url,
)

__all__ = ["OpenAIProvider"]

#: Request fields the adapter builds itself: an option may not replace them.
RESERVED_OPTIONS = frozenset({"model", "messages", "tools", "stream", "stream_options", "n"})

#: An ``is_error`` tool result is sent as its content behind this prefix: Chat Completions
#: has no error flag on a tool message, and the model must know the call failed.
ERROR_PREFIX = "[tool error] "

_FINISH: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}

_OVERFLOW_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "prompt is too long",
    "too many tokens",
)


class OpenAIProvider:
    """A ``ModelProvider`` for OpenAI's Chat Completions API and compatible servers.

    Args:
        api_key: the API key. ``None``: the SDK's own lookup at construction
            (``OPENAI_API_KEY``); nothing is read from the environment at import. The key is
            sent only as the request's ``Authorization`` header: it is never stored, never
            part of ``fingerprint()`` and never in an error message (a server's message
            echoing it is redacted).
        base_url: the API root, e.g. ``http://localhost:8000/v1`` for a compatible server
            (``None``: the SDK's default, ``OPENAI_BASE_URL`` or api.openai.com).
        organization: the OpenAI organization header (``None``: the SDK's default).
        timeout: seconds per request before it fails as retryable.
        max_retries: the SDK's own immediate retries; 0 by default because pico's
            generation task owns retries durably: each attempt is committed, a server's
            retry-after is honoured through the task's timer, and ``Harness.open
            (max_attempts=, retry_delay=)`` bounds them.
        options: request options sent with every request (``temperature``, ``top_p``,
            ``max_tokens``, ``max_completion_tokens``, ``seed``, ``reasoning_effort``,
            ``parallel_tool_calls``, or any field a compatible server accepts), as JSON. A
            generation captures them when it is created; changing ``provider.options``
            affects generations created afterwards only.
        client: a ready ``openai.AsyncOpenAI`` (then ``api_key``, ``base_url`` and
            ``organization`` must be None; its own timeout and retries apply).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        organization: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 0,
        options: Mapping[str, JsonValue] | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        for name, value in (
            ("api_key", api_key),
            ("base_url", base_url),
            ("organization", organization),
        ):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidArgumentError(f"OpenAIProvider({name}=...) must be a non-empty string")
        if base_url is not None and urlsplit(base_url).scheme not in ("http", "https"):
            raise InvalidArgumentError(
                "OpenAIProvider(base_url=...) must be an http:// or https:// URL such as "
                "'https://api.openai.com/v1'"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise InvalidArgumentError("OpenAIProvider(timeout=...) must be a positive number")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgumentError(
                "OpenAIProvider(max_retries=...) must be an int >= 0 (0: pico retries)"
            )
        self.options: JsonObject = _options(options)
        if client is not None:
            if not isinstance(client, openai.AsyncOpenAI):
                raise InvalidArgumentError("OpenAIProvider(client=...) must be openai.AsyncOpenAI")
            if api_key is not None or base_url is not None or organization is not None:
                raise InvalidArgumentError(
                    "OpenAIProvider: pass either client= or api_key/base_url/organization, "
                    "not both (the client carries its own)"
                )
            self._client = client
            self._owns_client = False
        else:
            try:
                self._client = openai.AsyncOpenAI(
                    api_key=api_key,
                    base_url=base_url,
                    organization=organization,
                    timeout=float(timeout),
                    max_retries=max_retries,
                )
            except openai.OpenAIError as error:
                raise ConfigurationError(
                    "OpenAIProvider has no API key: pass api_key=... or set the "
                    f"OPENAI_API_KEY environment variable ({type(error).__name__})"
                ) from None
            self._owns_client = True
        self._timeout = float(timeout)
        self._wire: WireCache = {}
        self._secret = api_key if api_key is not None else _client_key(self._client)

    def __repr__(self) -> str:
        return f"OpenAIProvider(base_url={self.base_url!r}, options={self.options!r})"

    @property
    def base_url(self) -> str:
        """The API root without credentials or query (what ``fingerprint()`` names)."""
        return safe_url(self._client.base_url)

    def request_options(self) -> JsonObject:
        """The options a generation captures when it is created (never secrets)."""
        return dict(self.options)

    def fingerprint(self) -> JsonObject:
        """The non-secret identity the resume gate compares: the API, the base URL (no
        credentials, no query) and the options. Never the API key."""
        return {"api": "openai-chat", "base_url": self.base_url, "options": dict(self.options)}

    async def aclose(self) -> None:
        """Close the HTTP client's connection pool if this provider made the client (one
        passed as ``client=`` is the caller's to close). Optional: an open pool is
        harmless until the process ends."""
        if self._owns_client:
            await self._client.close()

    async def poll(self, handle: str) -> Response | Deferred:
        raise ProviderError(
            f"OpenAIProvider never defers a request, so there is nothing to poll ({handle!r})",
            kind="fatal",
        )

    async def stream(self, request: Request) -> AsyncGenerator[StreamEvent, None]:
        """Stream one Chat Completions request built from ``request.settings`` (the options
        the generation captured), never from this provider's current options."""
        options = {k: v for k, v in request.settings.items() if k not in RESERVED_OPTIONS}
        # The body is already the wire's plain JSON, so it travels as ``extra_body`` (sent
        # as given) with an empty typed ``messages``: the SDK's recursive transform of typed
        # params costs about 0.65 ms of CPU per message on the event loop (279 ms per
        # request at 400 messages, measured with openai 3.57), O(context) on every request.
        body = {**options, **request_body(request, self._wire)}
        assembly = _Assembly()
        try:
            sdk_stream = await self._client.chat.completions.create(
                model=request.model,
                messages=[],
                stream=True,
                stream_options={"include_usage": True},
                extra_body=body,
            )
        except Exception as error:  # every SDK failure is classified, none escapes raw
            raise self._classify(error, None) from None
        try:
            try:
                async for chunk in sdk_stream:
                    for event in assembly.add(chunk):
                        yield event
            except Exception as error:
                raise self._classify(error, assembly.usage) from None
            yield Done(assembly.response())
        finally:
            # An abort (the consumer cancelled, or the generator closed) drops the HTTP
            # connection here, so the server stops generating promptly. A failure to close
            # a connection that is already broken must not replace the classified error.
            with contextlib.suppress(Exception):
                await sdk_stream.close()

    def _classify(self, error: Exception, usage: Usage | None) -> ProviderError:
        if isinstance(error, ProviderError):
            return error
        host = self.base_url
        if isinstance(error, openai.APITimeoutError):
            return ProviderError(
                f"the OpenAI request to {host} timed out after {self._timeout:g}s; "
                "it is retried (raise OpenAIProvider(timeout=...) for long answers)",
                kind="retryable",
                usage=usage,
            )
        if isinstance(error, openai.APIConnectionError) or _is_transport(error):
            return ProviderError(
                f"the connection to {host} failed ({self._redact(cause(error))}); it is "
                "retried: check base_url and the network if it persists",
                kind="retryable",
                usage=usage,
            )
        if isinstance(error, openai.APIStatusError):
            return self._status_error(error, usage)
        if isinstance(error, openai.APIError):
            # An error event inside a 200 stream: no status, the body says what.
            said = self._redact(_server_message(error))
            if _overflows(error.code, said):
                return ProviderError(
                    f"the model's context is too long ({said}): compact the conversation",
                    kind="overflow",
                    usage=usage,
                )
            return ProviderError(
                f"the OpenAI stream from {host} reported an error ({said}); it is retried",
                kind="retryable",
                usage=usage,
            )
        return ProviderError(
            f"the openai client failed unexpectedly ({type(error).__name__}: "
            f"{self._redact(str(error))}); this is a bug in the adapter or the SDK",
            kind="fatal",
            usage=usage,
        )

    def _status_error(self, error: openai.APIStatusError, usage: Usage | None) -> ProviderError:
        status = error.status_code
        said = self._redact(_server_message(error))
        where = f"HTTP {status} from {self.base_url}: {said}"
        kind: Literal["retryable", "overflow", "fatal"] = classify_status(status)
        if status in (400, 413, 422) and _overflows(error.code, said):
            return ProviderError(
                f"the model's context is too long ({where}); pico compacts the conversation "
                "once and retries; reduce the context or choose a model with a larger window",
                kind="overflow",
                usage=usage,
            )
        if kind == "retryable":
            wait = retry_after(error.response.headers)
            what = "rate limited" if status == 429 else "the server is busy or failed"
            return ProviderError(
                f"{what} ({where}); it is retried"
                + (f" after the server's {wait:g}s" if wait is not None else ""),
                kind="retryable",
                usage=usage,
                retry_after=wait,
            )
        if status == 401:
            advice = "authentication failed: check the API key (api_key= or OPENAI_API_KEY)"
        elif status == 403:
            advice = "permission denied: check that the key may use this model and project"
        elif status == 404:
            advice = "not found: check the model name (Harness.open(model=...)) and the base_url"
        else:
            advice = "the request was rejected: check the request options and tool schemas"
        return ProviderError(f"{advice} ({where})", kind="fatal", usage=usage)

    def _redact(self, text: str) -> str:
        return redact(text, (self._secret,))


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Assembly:
    """One streamed response as it arrives: text, reasoning, calls by index, usage."""

    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage | None = None
    refused: bool = False

    def add(self, chunk: Any) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        reported = getattr(chunk, "usage", None)
        if reported is not None:
            details = getattr(reported, "prompt_tokens_details", None)
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            self.usage = Usage(
                input_tokens=int(getattr(reported, "prompt_tokens", 0) or 0),
                output_tokens=int(getattr(reported, "completion_tokens", 0) or 0),
                cache_read_tokens=int(cached or 0),
            )
        for choice in getattr(chunk, "choices", None) or ():
            if getattr(choice, "index", 0) != 0:
                continue  # one choice is asked for (n is reserved)
            delta = choice.delta
            if delta is not None:
                extra = getattr(delta, "model_extra", None) or {}
                reasoning = extra.get("reasoning_content") or extra.get("reasoning")
                if isinstance(reasoning, str) and reasoning:
                    self.thinking.append(reasoning)
                    events.append(ThinkingDelta(reasoning))
                if delta.content:
                    self.text.append(delta.content)
                    events.append(TextDelta(delta.content))
                refusal = getattr(delta, "refusal", None)
                if isinstance(refusal, str) and refusal:
                    # A refusal arrives in its own field: it is the answer's text.
                    self.refused = True
                    self.text.append(refusal)
                    events.append(TextDelta(refusal))
                for fragment in delta.tool_calls or ():
                    call = self.calls.setdefault(fragment.index, _Call())
                    if fragment.id and not call.id:
                        call.id = fragment.id
                    function = fragment.function
                    if function is not None:
                        if function.name and not call.name:
                            call.name = function.name
                        if function.arguments:
                            call.arguments.append(function.arguments)
            if choice.finish_reason:
                self.finish = choice.finish_reason
        return events

    def response(self) -> Response:
        if self.finish is None:
            raise ProviderError(
                "the stream ended before the response was complete (no finish_reason); "
                "it is retried",
                kind="retryable",
                usage=self.usage,
            )
        parts: list[TextPart | ThinkingPart | ToolCallPart] = []
        if self.thinking:
            parts.append(ThinkingPart("".join(self.thinking)))
        if self.text:
            parts.append(TextPart("".join(self.text)))
        calls = [_tool_call(self.calls[i]) for i in sorted(self.calls)]
        parts.extend(calls)
        stop = "refusal" if self.refused else _FINISH.get(self.finish, "end_turn")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some compatible servers say "stop" after tool calls
        return Response(Message("assistant", tuple(parts)), stop, self.usage)


def _tool_call(call: _Call) -> ToolCallPart:
    call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
    raw = "".join(call.arguments)
    if not call.name:
        return ToolCallPart(call_id, "", {}, unusable="the server sent a tool call without a name")
    if not raw.strip():
        return ToolCallPart(call_id, call.name, {})  # a call without arguments
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        return ToolCallPart(
            call_id,
            call.name,
            {},
            unusable=f"the arguments are not valid JSON ({error.msg} at {error.pos}): {shown}",
        )
    if not isinstance(parsed, dict) or not is_strict_json(parsed):
        return ToolCallPart(
            call_id,
            call.name,
            {},
            unusable=f"the arguments are not a JSON object: {shown}",
        )
    return ToolCallPart(call_id, call.name, parsed)


#: Wire messages by ``Message`` object: (the message, its wire messages).
WireCache = dict[int, tuple[Message, list[dict[str, Any]]]]


def request_body(request: Request, cache: WireCache | None = None) -> dict[str, Any]:
    """The Chat Completions fields for ``request`` (model, messages, tools). With a
    ``cache`` (the previous request's), a message object seen before is not converted
    again (projection reuses message objects across requests, so each request converts
    only its new messages); the cache is replaced by this request's messages."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    seen: WireCache = {}
    for message in request.messages:
        known = cache.get(id(message)) if cache is not None else None
        if known is not None and known[0] is message:
            wire = known[1]
        elif message.role == "assistant":
            wire = [_assistant(message)]
        else:
            wire = _user(message)
        seen[id(message)] = (message, wire)
        messages.extend(wire)
    if cache is not None:
        cache.clear()
        cache.update(seen)
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in request.tools
        ]
    return body


def _assistant(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant"}
    text = message.text
    calls = message.tool_calls
    out["content"] = text if text or not calls else None
    if calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]
    return out


def _user(message: Message) -> list[dict[str, Any]]:
    """Tool results first (role=tool, one per result in order: they must follow the
    assistant's tool_calls), then one user message with the text and images; a tool
    result's images follow in a user message (a tool message carries text only)."""
    out: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ToolResultPart):
            text = ERROR_PREFIX + part.content if part.is_error else part.content
            out.append({"role": "tool", "tool_call_id": part.call_id, "content": text})
            if part.images:
                content.append(
                    {"type": "text", "text": f"(images returned by tool call {part.call_id})"}
                )
                content.extend(_image(i) for i in part.images)
        elif isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append(_image(part))
    if content:
        if all(c["type"] == "text" for c in content) and len(content) == 1:
            out.append({"role": "user", "content": content[0]["text"]})
        else:
            out.append({"role": "user", "content": content})
    elif not out:
        out.append({"role": "user", "content": ""})
    return out


def _image(part: ImagePart) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{part.mime};base64,{part.data}"}}


def _options(options: Mapping[str, JsonValue] | None) -> JsonObject:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgumentError(
            "OpenAIProvider(options=...) must be a mapping such as {'temperature': 0.2}"
        )
    for key in options:
        if not isinstance(key, str):
            raise InvalidArgumentError("OpenAIProvider(options=...) keys must be strings")
        if key in RESERVED_OPTIONS:
            raise InvalidArgumentError(
                f"OpenAIProvider(options=...) may not set {key!r}: the adapter builds it "
                "(the model comes from Harness.open(model=...), tools from the harness)"
            )
    value = strict_json(dict(options), what="OpenAIProvider(options=...)")
    assert isinstance(value, dict)
    return value


def _overflows(code: str | None, message: str) -> bool:
    text = f"{code or ''} {message}".lower()
    return any(marker in text for marker in _OVERFLOW_MARKERS)


def _server_message(error: openai.APIError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(error.message)


def _is_transport(error: BaseException) -> bool:
    """An HTTP transport error the SDK let through (older SDKs do, mid-stream)."""
    root = type(error).__module__.split(".")[0]
    return root in ("httpx", "httpx2", "httpcore", "h11", "anyio") or isinstance(error, OSError)


def _client_key(client: openai.AsyncOpenAI) -> str:
    key = getattr(client, "api_key", None)
    return key if isinstance(key, str) else ""
