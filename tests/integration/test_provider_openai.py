"""The OpenAI adapter (issue 17) through a real Harness on SQLite, the real ``openai`` SDK
talking HTTP to a loopback stub server: what is asserted is what pico stored (entries,
usage, task states, the audit) and what the server received (request bodies, headers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import pico
from pico.infrastructure.providers.common import classify_status, retry_after
from pico.infrastructure.providers.openai import OpenAIProvider, request_body
from tests.openai_wire import (
    completion_stream,
    error_reply,
    make_provider,
    text_reply,
    tool_reply,
    turn_replies,
)
from tests.stub_http import Reply, StubServer

T = TypeVar("T")
KEY = "sk-test-SECRET-0123456789abcdef"
READ_SCHEMA: pico.JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


async def _bounded(work: Awaitable[T], seconds: float = 20.0) -> T:
    return await asyncio.wait_for(work, seconds)


class Reads:
    """A ``read`` tool that records every invocation."""

    def __init__(self) -> None:
        self.calls: list[pico.JsonObject] = []

    def tool(self, name: str = "read") -> pico.Tool:
        async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            self.calls.append(dict(args))
            return f"contents of {args['path']}"

        return pico.Tool(name, f"{name} a file", READ_SCHEMA, run, replay="safe")


async def _open(
    tmp_path: Path,
    stub: StubServer,
    *,
    provider: OpenAIProvider | None = None,
    tools: list[pico.Tool] | None = None,
    **kw: Any,
) -> pico.Harness:
    return await pico.Harness.open(
        f"sqlite:///{tmp_path / 'agent.db'}",
        provider=provider or OpenAIProvider(base_url=stub.url + "/v1", api_key=KEY),
        model="gpt-test",
        tools=tools or [],
        **kw,
    )


async def _wait_status(h: pico.Harness, kind: str, status: str) -> pico.TaskSnapshot:
    """The first task of ``kind`` once it reaches ``status`` (bounded)."""
    for _ in range(2000):
        found = [t for t in (await h.tasks(kind=kind, limit=10)).items if t.status == status]
        if found:
            return found[0]
        await asyncio.sleep(0.005)
    raise AssertionError(f"no {kind} task reached {status}")


def _audit_text(h: pico.Harness) -> str:
    return json.dumps([r.payload for r in h.audit(limit=100_000)])


async def test_a_text_answer_is_stored_with_its_usage(tmp_path: Path) -> None:
    async with StubServer() as stub:
        stub.script(text_reply("Hello there, friend.", prompt_tokens=31, completion_tokens=7))
        h = await _open(tmp_path, stub, system="be brief")
        c = await h.root()
        input_id, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "done"
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.content == {"text": "Hello there, friend."}
        assert answer.metadata is not None and answer.metadata["usage"] == {
            "input": 31,
            "output": 7,
        }
        (seen,) = stub.requests
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        body = seen.json
        assert body["model"] == "gpt-test" and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ]
        assert "tools" not in body
        assert input_id
        await h.close()


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_deltas_become_thinking(tmp_path: Path, field: str) -> None:
    async with StubServer() as stub:
        stub.script(
            Reply(
                sse=completion_stream(
                    reasoning=["Let me ", "think."], reasoning_field=field, text=["42"]
                )
            ),
            text_reply("again"),
        )
        h = await _open(tmp_path, stub)
        c = await h.root()
        _, result = await _bounded(c.prompt("meaning?"))
        assert result is not None and result.status == "done"
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.content == {"text": "42", "thinking": "Let me think."}
        # Thinking is not sent back: the next request carries the answer's text only.
        await _bounded(c.prompt("and?"))
        assert stub.requests[1].json["messages"][1] == {"role": "assistant", "content": "42"}
        await h.close()


async def test_parallel_tool_calls_with_fragmented_arguments_run_and_are_answered(
    tmp_path: Path,
) -> None:
    async with StubServer() as stub:
        reads = Reads()
        stub.script(
            tool_reply(
                ("call_A", "read", ['{"pa', 'th": "a', '.py"}']),
                ("call_B", "read", ['{"path"', ': "b.py"', "}"]),
                text="Reading both.",
            ),
            text_reply("Both files are fine."),
        )
        h = await _open(tmp_path, stub, tools=[reads.tool()])
        c = await h.root()
        _, result = await _bounded(c.prompt("check a.py and b.py"))
        assert result is not None and result.status == "done"
        assert sorted(reads.calls, key=str) == [{"path": "a.py"}, {"path": "b.py"}]
        first, second = (s.json for s in stub.requests)
        assert first["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "read a file",
                    "parameters": READ_SCHEMA,
                },
            }
        ]
        # The results travel as role=tool messages in call order, after the assistant's calls.
        assert second["messages"] == [
            {"role": "user", "content": "check a.py and b.py"},
            {
                "role": "assistant",
                "content": "Reading both.",
                "tool_calls": [
                    {
                        "id": "call_A",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "a.py"}'},
                    },
                    {
                        "id": "call_B",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "b.py"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_A", "content": "contents of a.py"},
            {"role": "tool", "tool_call_id": "call_B", "content": "contents of b.py"},
        ]
        assistant = (await c.entries(kind="assistant")).items
        assert assistant[-1].content == {"text": "Both files are fine."}
        await h.close()


async def test_cached_prompt_tokens_are_stored_as_cache_read(tmp_path: Path) -> None:
    async with StubServer() as stub:
        stub.script(
            text_reply("cached", prompt_tokens=2048, completion_tokens=5, cached_tokens=1920)
        )
        h = await _open(tmp_path, stub)
        c = await h.root()
        await _bounded(c.prompt("hi"))
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.metadata is not None
        assert answer.metadata["usage"] == {"input": 2048, "output": 5, "cache_read": 1920}
        await h.close()


async def test_a_retry_sends_the_options_captured_when_the_generation_was_created(
    tmp_path: Path,
) -> None:
    async with StubServer() as stub:
        clock = pico.FakeClock()
        provider = OpenAIProvider(
            base_url=stub.url + "/v1", api_key=KEY, options={"temperature": 0.2, "max_tokens": 64}
        )
        stub.script(error_reply(503, "overloaded", "server_error"), text_reply("fine"))
        h = await _open(tmp_path, stub, provider=provider, clock=clock, retry_delay=0.5)
        c = await h.root()
        question = await c.accept("hello")
        driving = asyncio.ensure_future(c.drive())
        generation = await _wait_status(h, "generation", "retry_wait")
        assert isinstance(generation.state, dict)
        assert generation.state["options"] == {"temperature": 0.2, "max_tokens": 64}
        provider.options = {"temperature": 0.9}  # the options of now are not the captured ones
        clock.advance(1.0)
        assert await _bounded(driving) == "idle"
        result = await c.result(question)
        assert result is not None and result.status == "done"
        sent = [(s.json["temperature"], s.json["max_tokens"]) for s in stub.requests]
        assert sent == [(0.2, 64), (0.2, 64)]
        await h.close()


async def test_a_rate_limited_request_waits_for_the_servers_retry_after(tmp_path: Path) -> None:
    async with StubServer() as stub:
        clock = pico.FakeClock()
        stub.script(
            error_reply(
                429,
                "Rate limit reached for gpt-test",
                "requests",
                "rate_limit_exceeded",
                headers={"retry-after": "7"},
            ),
            text_reply("after the wait"),
        )
        h = await _open(tmp_path, stub, clock=clock, retry_delay=0.5)
        c = await h.root()
        question = await c.accept("hello")
        driving = asyncio.ensure_future(c.drive())
        generation = await _wait_status(h, "generation", "retry_wait")
        assert generation.not_before == pytest.approx(clock.now() + 7.0)
        assert len(stub.requests) == 1
        clock.advance(6.0)
        await asyncio.sleep(0.05)
        assert len(stub.requests) == 1  # not before the server's hint
        clock.advance(1.5)
        assert await _bounded(driving) == "idle"
        result = await c.result(question)
        assert result is not None and result.status == "done"
        assert len(stub.requests) == 2
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.content == {"text": "after the wait"}
        await h.close()


@pytest.mark.parametrize("status", [500, 503, 529])
async def test_a_server_error_is_retried(tmp_path: Path, status: int) -> None:
    async with StubServer() as stub:
        stub.script(
            error_reply(status, "The server had an error", "server_error"), text_reply("ok")
        )
        h = await _open(tmp_path, stub, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "done"
        assert len(stub.requests) == 2
        (generation,) = (await h.tasks(kind="generation")).items
        assert isinstance(generation.state, dict) and generation.state["attempt"] == 1
        await h.close()


async def test_a_context_too_long_request_is_compacted_and_retried(tmp_path: Path) -> None:
    async with StubServer() as stub:
        stub.script(text_reply("first answer"), text_reply("second answer"))
        h = await _open(tmp_path, stub)
        c = await h.root()
        await _bounded(c.prompt("first question"))
        await _bounded(c.prompt("second question"))
        stub.script(
            error_reply(
                400,
                "This model's maximum context length is 128000 tokens. However, your messages "
                "resulted in 130000 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "context_length_exceeded",
            ),
            text_reply("the summary of it all"),
            text_reply("answered with less context"),
        )
        _, result = await _bounded(c.prompt("third question"))
        assert result is not None and result.status == "done"
        (collapse,) = (await h.tasks(kind="collapse")).items
        assert collapse.status == "done"
        generations = (await h.tasks(kind="generation")).items
        assert generations[-1].status == "done"
        final = stub.requests[-1].json["messages"]
        assert "the summary of it all" in json.dumps(final)
        assert (await c.entries(kind="assistant")).items[-1].content == {
            "text": "answered with less context"
        }
        await h.close()


async def test_authentication_fails_the_input_and_the_key_is_never_stored(tmp_path: Path) -> None:
    async with StubServer() as stub:
        stub.script(
            error_reply(
                401,
                f"Incorrect API key provided: {KEY}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "invalid_request_error",
                "invalid_api_key",
            )
        )
        h = await _open(tmp_path, stub, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "failed"
        assert result.reason is not None and "authentication" in result.reason
        assert "API key" in result.reason and "401" in result.reason
        assert len(stub.requests) == 1  # fatal: never retried
        assert KEY not in result.reason
        assert KEY not in _audit_text(h) and "SECRET" not in _audit_text(h)
        await h.close()


@pytest.mark.parametrize(
    ("status", "code", "words"),
    [
        (403, "unsupported_country_region_territory", "permission"),
        (404, "model_not_found", "model name"),
        (400, "invalid_value", "rejected"),
        (422, None, "rejected"),
    ],
)
async def test_other_client_errors_fail_the_input(
    tmp_path: Path, status: int, code: str | None, words: str
) -> None:
    async with StubServer() as stub:
        stub.script(error_reply(status, "the server says no", "invalid_request_error", code))
        h = await _open(tmp_path, stub, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "failed"
        assert result.reason is not None
        assert words in result.reason and "the server says no" in result.reason
        assert len(stub.requests) == 1
        await h.close()


async def test_a_stream_cut_mid_way_is_retried(tmp_path: Path) -> None:
    async with StubServer() as stub:
        whole = completion_stream(text=["partial ", "answer ", "that ", "never ends"])
        stub.script(Reply(sse=whole, cut_after=3), text_reply("the whole answer"))
        h = await _open(tmp_path, stub, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "done"
        assert len(stub.requests) == 2
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.content == {"text": "the whole answer"}
        await h.close()


async def test_a_stream_without_finish_reason_is_retried_with_its_usage(tmp_path: Path) -> None:
    async with StubServer() as stub:
        stub.script(
            Reply(sse=completion_stream(text=["cut"], finish=None, prompt_tokens=9)),
            text_reply("done", prompt_tokens=10, completion_tokens=2),
        )
        h = await _open(tmp_path, stub, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "done"
        (generation,) = (await h.tasks(kind="generation")).items
        assert isinstance(generation.state, dict)
        assert generation.state["usage"] == {"input": 19, "output": 14}  # both attempts counted
        await h.close()


async def test_a_tool_call_with_invalid_json_arguments_is_answered_with_an_error(
    tmp_path: Path,
) -> None:
    async with StubServer() as stub:
        reads = Reads()
        stub.script(
            tool_reply(("call_bad", "read", ['{"path": "a.py', "'oops"])),
            text_reply("sorry"),
        )
        h = await _open(tmp_path, stub, tools=[reads.tool()])
        c = await h.root()
        _, result = await _bounded(c.prompt("read a.py"))
        assert result is not None and result.status == "done"
        assert reads.calls == []  # never invoked
        content: Any = (await c.entries(kind="assistant")).items[0].content
        (call,) = content["tool_calls"]
        assert call["arguments"] == {} and "not valid JSON" in call["unusable"]
        assert '{"path": "a.py' in call["unusable"]
        (tool_message,) = [m for m in stub.requests[1].json["messages"] if m["role"] == "tool"]
        assert tool_message["tool_call_id"] == "call_bad"
        assert tool_message["content"].startswith("[tool error] ")
        await h.close()


async def test_abort_mid_stream_drops_the_connection(tmp_path: Path) -> None:
    async with StubServer() as stub:
        chunks = completion_stream(text=["a long ", "answer "], finish=None, usage=False)[:-1]
        stub.script(Reply(sse=chunks, hang=True))
        h = await _open(tmp_path, stub)
        c = await h.root()
        input_id = await c.accept("tell me everything")
        driving = asyncio.ensure_future(c.drive())
        await _bounded(stub.streaming.wait())
        await c.abort()
        await asyncio.wait_for(stub.disconnected.wait(), 5.0)  # the HTTP connection dropped
        assert await _bounded(driving) == "idle"
        result = await c.result(input_id)
        assert result is not None and result.status == "cancelled"
        assert [e.kind for e in (await c.entries()).items] == ["user"]  # no answer published
        await h.close()


async def test_a_workload_of_alternating_text_and_tool_turns(tmp_path: Path) -> None:
    async with StubServer() as stub:
        reads = Reads()
        turns = 30
        for turn in range(turns):
            stub.script(*turn_replies(turn))
        provider = make_provider(stub.url)
        assert isinstance(provider, OpenAIProvider)
        h = await _open(tmp_path, stub, provider=provider, tools=[reads.tool()])
        c = await h.root()
        for turn in range(turns):
            _, result = await _bounded(c.prompt(f"question {turn}"))
            assert result is not None and result.status == "done", (turn, result)
        assert stub.pending == 0
        answers: list[Any] = [
            e.content for e in (await c.entries(kind="assistant", limit=1000)).items
        ]
        texts: list[str] = [a["text"] for a in answers if a.get("text")]
        assert [t for t in texts if t.startswith("answer")] == [
            f"answer {t}: the parser is fine" if t % 2 == 0 else f"answer {t}: read file{t}.py"
            for t in range(turns)
        ]
        assert reads.calls == [{"path": f"file{t}.py"} for t in range(1, turns, 2)]
        await h.close()


async def test_an_unreachable_server_is_retried_then_fails_naming_the_connection(
    tmp_path: Path,
) -> None:
    async with StubServer() as stub:
        url = stub.url  # a port nothing listens on once the stub is gone
    provider = OpenAIProvider(base_url=url + "/v1", api_key=KEY)
    async with StubServer() as unused:
        h = await _open(tmp_path, unused, provider=provider, max_attempts=2, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "failed"
        assert result.reason is not None and "connection" in result.reason
        (generation,) = (await h.tasks(kind="generation")).items
        assert isinstance(generation.state, dict) and generation.state["attempt"] == 2
        await h.close()


async def test_a_server_that_stops_sending_times_out_and_is_retried(tmp_path: Path) -> None:
    async with StubServer() as stub:
        first = completion_stream(text=["slow"], finish=None, usage=False)[:-1]
        stub.script(Reply(sse=first, hang=True), text_reply("on time"))
        provider = OpenAIProvider(base_url=stub.url + "/v1", api_key=KEY, timeout=0.3)
        h = await _open(tmp_path, stub, provider=provider, retry_delay=0.01)
        c = await h.root()
        _, result = await _bounded(c.prompt("hi"))
        assert result is not None and result.status == "done"
        assert stub.disconnected.is_set()  # the timed-out stream's connection was dropped
        (answer,) = (await c.entries(kind="assistant")).items
        assert answer.content == {"text": "on time"}
        await h.close()


async def test_a_refusal_is_the_answer_with_stop_reason_refusal() -> None:
    async with StubServer() as stub:
        stub.script(Reply(sse=completion_stream(refusal=["I can't ", "help with that."])))
        provider = OpenAIProvider(base_url=stub.url + "/v1", api_key=KEY)
        request = pico.Request(
            model="gpt-test", messages=(pico.Message("user", (pico.TextPart("hm"),)),)
        )
        events = [e async for e in provider.stream(request)]
        done = events[-1]
        assert isinstance(done, pico.Done) and isinstance(done.outcome, pico.Response)
        assert done.outcome.stop_reason == "refusal"
        assert done.outcome.message.text == "I can't help with that."
        assert done.outcome.usage == pico.Usage(25, 12)
        await provider.aclose()


async def test_an_injected_client_is_used_and_left_open() -> None:
    import openai

    async with StubServer() as stub:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=stub.url + "/v1", max_retries=0)
        with pytest.raises(pico.InvalidArgumentError, match="client"):
            OpenAIProvider(client=client, api_key=KEY)
        provider = OpenAIProvider(client=client, options={"seed": 7})
        stub.script(text_reply("via the caller's client"))
        request = pico.Request(
            model="gpt-test",
            messages=(pico.Message("user", (pico.TextPart("hi"),)),),
            settings=provider.request_options(),
        )
        events = [e async for e in provider.stream(request)]
        done = events[-1]
        assert isinstance(done, pico.Done) and isinstance(done.outcome, pico.Response)
        assert done.outcome.message.text == "via the caller's client"
        assert stub.requests[0].json["seed"] == 7
        await provider.aclose()
        assert not client.is_closed()  # the caller's to close
        await client.close()


async def test_closing_the_stream_between_deltas_drops_the_connection() -> None:
    async with StubServer() as stub:
        chunks = completion_stream(text=["one ", "two "], finish=None, usage=False)[:-1]
        stub.script(Reply(sse=chunks, hang=True))
        provider = OpenAIProvider(base_url=stub.url + "/v1", api_key=KEY)
        request = pico.Request(
            model="gpt-test", messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        events = provider.stream(request)
        assert await events.__anext__() == pico.TextDelta("one ")
        await stub.streaming.wait()
        await events.aclose()  # what the generation does after an abort between frames
        await asyncio.wait_for(stub.disconnected.wait(), 2)
        await provider.aclose()


# ----------------------------------------------------------------- the adapter alone


def test_the_constructor_validates_its_arguments() -> None:
    with pytest.raises(pico.InvalidArgumentError, match="timeout"):
        OpenAIProvider(api_key="k", timeout=0)
    with pytest.raises(pico.InvalidArgumentError, match="max_retries"):
        OpenAIProvider(api_key="k", max_retries=-1)
    with pytest.raises(pico.InvalidArgumentError, match="base_url"):
        OpenAIProvider(api_key="k", base_url="localhost:8000")
    with pytest.raises(pico.InvalidArgumentError, match="api_key"):
        OpenAIProvider(api_key="")
    with pytest.raises(pico.InvalidArgumentError, match="'model'"):
        OpenAIProvider(api_key="k", options={"model": "x"})
    with pytest.raises(pico.InvalidJsonError):
        OpenAIProvider(api_key="k", options={"temperature": float("nan")})


def test_without_a_key_the_sdk_lookup_happens_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(pico.ConfigurationError, match="OPENAI_API_KEY"):
        OpenAIProvider()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    provider = OpenAIProvider(base_url="https://user:pw@example.test/v1?key=q")
    assert KEY not in json.dumps(provider.fingerprint()) and KEY not in repr(provider)
    assert provider.fingerprint() == {
        "api": "openai-chat",
        "base_url": "https://example.test/v1",
        "options": {},
    }


def test_the_wire_mapping_of_images_results_and_thinking() -> None:
    image = pico.ImagePart("image/png", "iVBORw0KGgo=")
    request = pico.Request(
        model="m",
        messages=(
            pico.Message("user", (pico.TextPart("look"), image)),
            pico.Message(
                "assistant",
                (pico.ThinkingPart("hmm"), pico.ToolCallPart("c1", "shot", {"n": 1})),
            ),
            pico.Message(
                "user",
                (
                    pico.ToolResultPart("c1", "boom", is_error=True, images=(image,)),
                    pico.TextPart("and now?"),
                ),
            ),
        ),
    )
    messages = request_body(request)["messages"]
    url = "data:image/png;base64,iVBORw0KGgo="
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shot", "arguments": '{"n": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "[tool error] boom"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "(images returned by tool call c1)"},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]


def test_wire_messages_are_reused_only_for_the_same_message_objects() -> None:
    from pico.infrastructure.providers.openai import WireCache

    first = pico.Message("user", (pico.TextPart("one"),))
    call = pico.Message("assistant", (pico.ToolCallPart("c1", "read", {"path": "a"}),))
    cache: WireCache = {}
    one = pico.Request(model="m", messages=(first, call))
    assert request_body(one, cache) == request_body(one)
    assert set(cache) == {id(first), id(call)}
    # The same objects are reused; a new object with other content is converted afresh.
    other = pico.Message("assistant", (pico.ToolCallPart("c1", "read", {"path": "b"}),))
    result = pico.Message("user", (pico.ToolResultPart("c1", "B"),))
    two = pico.Request(model="m", messages=(first, other, result))
    body = request_body(two, cache)
    assert body == request_body(two)
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"path": "b"}'
    assert set(cache) == {id(first), id(other), id(result)}  # only this request's


def test_retry_after_and_status_classification() -> None:
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({"retry-after": "-1"}) is None
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({}) is None and retry_after(None) is None
    assert [classify_status(s) for s in (408, 409, 429, 500, 503, 529)] == ["retryable"] * 6
    assert [classify_status(s) for s in (400, 401, 403, 404, 413, 422)] == ["fatal"] * 6


async def test_poll_is_fatal() -> None:
    provider = OpenAIProvider(api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(pico.ProviderError) as caught:
        await provider.poll("h")
    assert caught.value.kind == "fatal"
