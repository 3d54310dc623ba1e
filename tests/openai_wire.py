"""Recorded OpenAI Chat Completions responses in their exact wire format, for the stub
server (issue 17): a streamed completion is ``data: {chunk}\\n\\n`` lines of
``chat.completion.chunk`` objects (a first delta with the role, content or tool-call
fragments by index, a last choice chunk with ``finish_reason``, then, with
``stream_options.include_usage``, a chunk with no choices and the usage), ending with
``data: [DONE]``. Error statuses carry ``{"error": {message, type, param, code}}``.

Also the benchmark's hooks: ``make_provider(url)`` and ``turn_replies(turn)`` (the stub
replies one workload turn consumes: even turns answer in text, odd turns call the ``read``
tool, then answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pico
from tests.stub_http import Reply, sse

__all__ = [
    "MODEL",
    "completion_stream",
    "error_body",
    "error_reply",
    "make_provider",
    "pieces",
    "text_reply",
    "tool_reply",
    "turn_replies",
]

MODEL = "gpt-test"
CREATED = 1764633600


def _chunk(
    delta: dict[str, Any] | None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    completion_id: str = "chatcmpl-Stub01",
) -> dict[str, Any]:
    choices: list[dict[str, Any]] = []
    if delta is not None:
        choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish})
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "service_tier": "default",
        "system_fingerprint": "fp_stub",
        "choices": choices,
        "usage": usage,
    }


def pieces(value: str, chunks: int = 3) -> list[str]:
    """``value`` in about ``chunks`` pieces (at least one)."""
    size = max(1, -(-len(value) // chunks))
    return [value[i : i + size] for i in range(0, len(value), size)] or [""]


def completion_stream(
    *,
    text: Sequence[str] = (),
    reasoning: Sequence[str] = (),
    reasoning_field: str = "reasoning_content",
    calls: Sequence[tuple[str, str, Sequence[str]]] = (),
    refusal: Sequence[str] = (),
    finish: str | None = "stop",
    prompt_tokens: int = 25,
    completion_tokens: int = 12,
    cached_tokens: int = 0,
    usage: bool = True,
) -> list[bytes]:
    """The whole byte stream of one streamed completion: ``reasoning`` pieces (sent as
    the extra delta field ``reasoning_field``, as vLLM/DeepSeek/OpenRouter do), ``text``
    pieces, ``refusal`` pieces (a refusal's own delta field), then each call (id, name,
    argument fragments) by index: its first fragment carries the id, the name and empty
    arguments, the rest only argument pieces. Calls
    interleave their fragments round-robin (parallel calls do). ``finish=None``: no
    finish chunk (a server that stopped early)."""
    events: list[dict[str, Any]] = [
        _chunk({"role": "assistant", "content": "", "refusal": None}),
    ]
    for piece in reasoning:
        events.append(_chunk({reasoning_field: piece}))
    for piece in text:
        events.append(_chunk({"content": piece}))
    for piece in refusal:
        events.append(_chunk({"refusal": piece}))
    longest = max((len(c[2]) for c in calls), default=0)
    for index, (call_id, name, _) in enumerate(calls):
        events.append(
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
    for step in range(longest):
        for index, (_, _, fragments) in enumerate(calls):
            if step < len(fragments):
                events.append(
                    _chunk(
                        {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": fragments[step]}}
                            ]
                        }
                    )
                )
    if finish is not None:
        events.append(_chunk({}, finish=finish))
    if usage:
        events.append(
            _chunk(
                None,
                usage={
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
                    "completion_tokens_details": {
                        "reasoning_tokens": 0,
                        "audio_tokens": 0,
                        "accepted_prediction_tokens": 0,
                        "rejected_prediction_tokens": 0,
                    },
                },
            )
        )
    return [*sse(*((None, e) for e in events)), *sse((None, "[DONE]"))]


def text_reply(answer: str, *, chunks: int = 3, **kw: Any) -> Reply:
    return Reply(sse=completion_stream(text=pieces(answer, chunks), **kw))


def tool_reply(*calls: tuple[str, str, Sequence[str]], text: str = "", **kw: Any) -> Reply:
    """A completion calling tools: each (call id, tool name, argument fragments)."""
    return Reply(
        sse=completion_stream(
            text=pieces(text) if text else (), calls=calls, finish="tool_calls", **kw
        )
    )


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error status, as the API sends it."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_reply(status: int, message: str, kind: str, code: str | None = None, **kw: Any) -> Reply:
    return Reply(status, error_body(message, kind, code), **kw)


def make_provider(url: str) -> pico.ModelProvider:
    """An OpenAI provider against the stub server at ``url`` (for the benchmarks)."""
    from pico.infrastructure.providers.openai import OpenAIProvider

    return OpenAIProvider(base_url=url + "/v1", api_key="test-key")


def turn_replies(turn: int) -> list[Reply]:
    """The stub replies one workload turn consumes: an even turn answers in text; an odd
    turn calls the ``read`` tool (arguments in fragments), then answers."""
    if turn % 2 == 0:
        return [text_reply(f"answer {turn}: the parser is fine")]
    return [
        tool_reply((f"call_{turn:05d}", "read", ['{"pa', 'th": "file', f'{turn}.py"}}'])),
        text_reply(f"answer {turn}: read file{turn}.py"),
    ]
