"""Recorded Anthropic Messages API responses in their exact wire format, for the stub
server (issue 17): the server-sent events of a streamed message (``message_start``,
``content_block_start``, ``ping``, ``content_block_delta``, ``content_block_stop``,
``message_delta``, ``message_stop``), the ``error`` event and the JSON error bodies.

Also the benchmark's hooks: ``make_provider(url)`` and ``turn_replies(turn)`` (the stub
replies one workload turn consumes: even turns answer in text, odd turns call a tool,
then answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pico
from tests.stub_http import Reply, sse

__all__ = [
    "MODEL",
    "Block",
    "error_body",
    "error_event",
    "make_provider",
    "message_stream",
    "text",
    "text_reply",
    "thinking",
    "tool_reply",
    "tool_use",
    "turn_replies",
]

MODEL = "claude-test"

#: One content block as (start event data, delta event datas); its index is its place.
Block = tuple[dict[str, Any], list[dict[str, Any]]]


def text(value: str, *, chunks: int = 3) -> Block:
    """A text block whose text streams in about ``chunks`` deltas."""
    size = max(1, -(-len(value) // chunks))
    pieces = [value[i : i + size] for i in range(0, len(value), size)] or [""]
    return (
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": p} for p in pieces],
    )


def thinking(value: str, *, signature: str = "sig-abc") -> Block:
    """A thinking block: its text in two deltas, then its signature."""
    half = len(value) // 2
    return (
        {"type": "thinking", "thinking": "", "signature": ""},
        [
            {"type": "thinking_delta", "thinking": value[:half]},
            {"type": "thinking_delta", "thinking": value[half:]},
            {"type": "signature_delta", "signature": signature},
        ],
    )


def tool_use(call_id: str, name: str, fragments: Sequence[str]) -> Block:
    """A tool_use block whose input JSON arrives in the given fragments (as the API
    streams it: ``input`` starts empty, ``input_json_delta`` carries partial JSON)."""
    return (
        {"type": "tool_use", "id": call_id, "name": name, "input": {}},
        [{"type": "input_json_delta", "partial_json": f} for f in fragments],
    )


def message_stream(
    *blocks: Block,
    stop_reason: str = "end_turn",
    input_tokens: int = 25,
    output_tokens: int = 12,
    cache_read: int | None = None,
    cache_write: int | None = None,
    message_id: str = "msg_01Stub",
) -> list[bytes]:
    """The whole event stream of one message, byte for byte as the API sends it."""
    start_usage: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": 1,
        "cache_creation_input_tokens": cache_write,
        "cache_read_input_tokens": cache_read,
    }
    events: list[tuple[str | None, Any]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        ),
    ]
    for index, (start, deltas) in enumerate(blocks):
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        for delta in deltas:
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The JSON body of an error status (and the data of an ``error`` event)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event(kind: str, message: str) -> bytes:
    """An ``error`` event, as the API sends one mid-stream (e.g. overloaded_error)."""
    (chunk,) = sse(("error", error_body(kind, message)))
    return chunk


def text_reply(answer: str, **usage: Any) -> Reply:
    return Reply(sse=message_stream(text(answer), **usage))


def tool_reply(*calls: tuple[str, str, Sequence[str]], **usage: Any) -> Reply:
    """A message calling tools: each (call id, tool name, input fragments)."""
    return Reply(
        sse=message_stream(*(tool_use(*c) for c in calls), stop_reason="tool_use", **usage)
    )


def make_provider(url: str) -> pico.ModelProvider:
    """An Anthropic provider against the stub server at ``url`` (for the benchmarks)."""
    from pico.infrastructure.providers.anthropic import AnthropicProvider

    return AnthropicProvider(base_url=url, api_key="test-key")


def turn_replies(turn: int) -> list[Reply]:
    """The stub replies one workload turn consumes: an even turn answers in text; an odd
    turn calls the ``read`` tool (arguments in fragments), then answers."""
    if turn % 2 == 0:
        return [text_reply(f"answer {turn}: the parser is fine")]
    return [
        tool_reply((f"toolu_{turn:05d}", "read", ['{"pa', 'th": "file', f'{turn}.py"}}'])),
        text_reply(f"answer {turn}: read file{turn}.py"),
    ]
