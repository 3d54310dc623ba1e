"""The Anthropic adapter (issue 17) through a real harness on SQLite, against a loopback
stub server speaking the Messages API's wire format: the real ``anthropic`` SDK makes the
requests, so what is checked is what the server received and what pico stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import pytest

import pico
from pico.infrastructure.providers.anthropic import AnthropicProvider
from tests.anthropic_wire import (
    MODEL,
    error_body,
    error_event,
    message_stream,
    text,
    text_reply,
    thinking,
    tool_reply,
    tool_use,
    turn_replies,
)
from tests.stub_http import Reply, StubServer

KEY = "sk-ant-test-0123456789-secret"


@pytest.fixture
def stub() -> StubServer:
    """A stub server, started by the test (``async with stub:``) on the test's loop."""
    return StubServer()


def _provider(stub: StubServer, **kwargs: Any) -> AnthropicProvider:
    return AnthropicProvider(base_url=stub.url, api_key=KEY, **kwargs)


async def _open(
    tmp_path: Path, provider: pico.ModelProvider, **kwargs: Any
) -> tuple[pico.Harness, pico.ConversationHandle]:
    h = await pico.Harness.open(
        f"sqlite:///{tmp_path / 'agent.db'}", provider=provider, model=MODEL, **kwargs
    )
    return h, await h.root()


async def _prompt(c: pico.ConversationHandle, question: str) -> pico.InputResult:
    _, result = await asyncio.wait_for(c.prompt(question), 10)
    assert result is not None
    return result


async def _answer(h: pico.Harness, result: pico.InputResult) -> pico.Entry:
    assert result.status == "done" and result.entry_id is not None, result
    entry = await h.entry(result.entry_id)
    assert entry is not None
    return entry


async def _until(h: pico.Harness, kind: str, status: str) -> pico.TaskSnapshot:
    """The first task of ``kind`` once it reaches ``status`` (real I/O is in between)."""
    for _ in range(500):
        for task in (await h.tasks(kind=kind, limit=10)).items:
            if task.status == status:
                return task
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {kind} task reached {status}")


def _usage(entry: pico.Entry) -> pico.JsonValue:
    """The usage stored on an answer's metadata."""
    assert entry.metadata is not None
    return entry.metadata.get("usage")


def _recorder(log: list[tuple[str, pico.JsonObject]], name: str) -> pico.Tool:
    async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        log.append((name, args))
        return f"{name} says {json.dumps(args, sort_keys=True)}"

    return pico.Tool(name, f"the {name} tool", {"type": "object"}, run)


def _cache_marks(body: Any) -> list[str]:
    """Where a request body carries cache_control breakpoints, as paths."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            if "cache_control" in value:
                assert value["cache_control"] == {"type": "ephemeral"}
                found.append(path)
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    walk(body, "")
    return sorted(found)


# --- streaming ---------------------------------------------------------------------------


async def test_a_text_answer_is_streamed_and_stored_with_its_usage(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        stub.script(Reply(sse=message_stream(text("The parser recurses per token."))))
        h, c = await _open(tmp_path, _provider(stub), system="You review code.")
        answer = await _answer(h, await _prompt(c, "Why is the parser slow?"))
        assert answer.kind == "assistant"
        assert isinstance(answer.content, dict)
        assert answer.content["text"] == "The parser recurses per token."
        assert _usage(answer) == {"input": 25, "output": 12}
        # Check: the request the server got, in the Messages API's own shape.
        (seen,) = stub.requests
        assert (seen.method, seen.path) == ("POST", "/v1/messages")
        body = seen.json
        assert body["model"] == MODEL and body["stream"] is True and body["max_tokens"] == 4096
        assert body["system"][0]["text"] == "You review code."
        assert [m["role"] for m in body["messages"]] == ["user"]
        assert body["messages"][0]["content"][0]["text"] == "Why is the parser slow?"
        assert KEY in " ".join(seen.headers.values())  # the key went to the server, only there
        await h.close()


async def test_thinking_streams_as_thinking_deltas_and_is_stored(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        stub.script(Reply(sse=message_stream(thinking("Count the calls."), text("Two calls."))))
        provider = _provider(stub, options={"thinking": {"type": "enabled", "budget_tokens": 2048}})
        request = pico.Request(
            model=MODEL,
            messages=(pico.Message("user", (pico.TextPart("How many?"),)),),
            settings=provider.request_options(),
        )
        events = [e async for e in provider.stream(request)]
        assert [type(e).__name__ for e in events] == [
            "ThinkingDelta",
            "ThinkingDelta",
            "TextDelta",
            "TextDelta",
            "TextDelta",
            "Done",
        ]
        assert "".join(e.text for e in events if isinstance(e, pico.ThinkingDelta)) == (
            "Count the calls."
        )
        assert stub.requests[0].json["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        # Through a harness: the thinking is stored with the answer.
        stub.script(Reply(sse=message_stream(thinking("Count the calls."), text("Two calls."))))
        h, c = await _open(tmp_path, provider)
        answer = await _answer(h, await _prompt(c, "How many?"))
        assert answer.content == {
            "text": "Two calls.",
            "thinking": "Count the calls.",
            "thinking_blocks": [{"text": "Count the calls.", "signature": "sig-abc"}],
        }
        await h.close()


async def test_signed_thinking_goes_back_with_the_tool_turn_it_preceded(
    tmp_path: Path, stub: StubServer
) -> None:
    """With thinking on, the API requires the signed thinking block before a tool_use to
    come back unchanged in the request that carries the tool's result."""
    async with stub:
        stub.script(
            Reply(
                sse=message_stream(
                    thinking("I should look.", signature="sig-look"),
                    tool_use("toolu_1", "look", ['{"what": ', '"x"}']),
                    stop_reason="tool_use",
                )
            ),
            text_reply("Seen."),
        )

        async def look(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            return "x is here"

        tool = pico.Tool("look", "Look", {"type": "object", "properties": {}}, look)
        provider = _provider(stub, options={"thinking": {"type": "enabled", "budget_tokens": 1024}})
        h, c = await _open(tmp_path, provider, tools=[tool])
        answer = await _answer(h, await _prompt(c, "Look at x"))
        assert answer.content == {"text": "Seen."}
        assistant = stub.requests[1].json["messages"][1]
        assert assistant["role"] == "assistant"
        assert assistant["content"][0] == {
            "type": "thinking",
            "thinking": "I should look.",
            "signature": "sig-look",
        }
        assert assistant["content"][1]["type"] == "tool_use"
        await h.close()


async def test_parallel_tool_calls_with_fragmented_input_run_and_return_in_call_order(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        log: list[tuple[str, pico.JsonObject]] = []
        grep_done = asyncio.Event()

        async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            await asyncio.wait_for(grep_done.wait(), 5)  # finishes after grep: completion order
            log.append(("read", args))  # differs from call order
            return "def parse(): ..."

        async def grep(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            log.append(("grep", args))
            grep_done.set()
            return "parser.py:3"

        tools = [
            pico.Tool("read", "Read a file", {"type": "object"}, read),
            pico.Tool("grep", "Search", {"type": "object"}, grep),
        ]
        stub.script(
            tool_reply(
                ("toolu_01", "read", ['{"pa', 'th": "pars', 'er.py"}']),
                ("toolu_02", "grep", ["", '{"pattern": ', '"def", "n": 3}']),
            ),
            text_reply("parse() is defined at line 3."),
        )
        h, c = await _open(tmp_path, _provider(stub), tools=tools)
        answer = await _answer(h, await _prompt(c, "Where is parse defined?"))
        assert answer.content == {"text": "parse() is defined at line 3."}
        assert log == [("grep", {"pattern": "def", "n": 3}), ("read", {"path": "parser.py"})]
        # Check: the second request carries both tool_use blocks and the results in call order.
        first, second = (r.json for r in stub.requests)
        assert [t["name"] for t in first["tools"]] == ["read", "grep"]
        assert first["tools"][0]["input_schema"] == {"type": "object"}
        _user, assistant, results = second["messages"]
        assert [b["type"] for b in assistant["content"]] == ["tool_use", "tool_use"]
        assert [(b["id"], b["name"], b["input"]) for b in assistant["content"]] == [
            ("toolu_01", "read", {"path": "parser.py"}),
            ("toolu_02", "grep", {"pattern": "def", "n": 3}),
        ]
        assert results["role"] == "user"
        assert [(b["type"], b["tool_use_id"]) for b in results["content"]] == [
            ("tool_result", "toolu_01"),
            ("tool_result", "toolu_02"),
        ]
        assert results["content"][0]["content"][0]["text"].endswith("def parse(): ...")
        assert "is_error" not in results["content"][0]
        await h.close()


async def test_tool_input_that_is_not_json_becomes_an_error_result_without_a_call(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        log: list[tuple[str, pico.JsonObject]] = []
        stub.script(
            tool_reply(("toolu_bad", "read", ['{"path": "a.py', '", oops}'])),
            text_reply("Sorry, let me try again later."),
        )
        h, c = await _open(tmp_path, _provider(stub), tools=[_recorder(log, "read")])
        answer = await _answer(h, await _prompt(c, "Read a.py"))
        assert answer.content == {"text": "Sorry, let me try again later."}
        assert log == []  # never invoked
        (tool_entry,) = [e for e in (await c.entries()).items if e.kind == "tool"]
        assert isinstance(tool_entry.content, dict) and tool_entry.content["is_error"] is True
        assert "not valid JSON" in str(tool_entry.content["content"])
        assert "oops" in str(tool_entry.content["content"])  # a prefix of the raw text
        result_block = stub.requests[1].json["messages"][2]["content"][0]
        assert result_block["tool_use_id"] == "toolu_bad" and result_block["is_error"] is True
        await h.close()


# --- prompt caching ----------------------------------------------------------------------


async def test_the_stable_prefix_is_marked_for_the_cache_and_cache_usage_is_stored(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        log: list[tuple[str, pico.JsonObject]] = []
        stub.script(
            tool_reply(("toolu_1", "read", ['{"path": "a.py"}']), cache_write=900, input_tokens=10),
            text_reply("done", cache_read=900, cache_write=40, input_tokens=5, output_tokens=3),
        )
        h, c = await _open(
            tmp_path,
            _provider(stub),
            system="A long, stable system prompt.",
            tools=[_recorder(log, "grep"), _recorder(log, "read")],
        )
        result = await _prompt(c, "Read a.py")
        answer = await _answer(h, result)
        # Input counts every prompt token, cached ones included (Anthropic's excludes them).
        assert _usage(answer) == {
            "input": 5 + 900 + 40,
            "output": 3,
            "cache_read": 900,
            "cache_write": 40,
        }
        (assistant_call,) = [
            e for e in (await c.entries()).items if (e.metadata or {}).get("tool_calls")
        ]
        assert _usage(assistant_call) == {"input": 910, "output": 12, "cache_write": 900}
        # Check: breakpoints on the system prompt, the last tool, the final message's last block.
        first, second = (r.json for r in stub.requests)
        assert _cache_marks(first) == [".messages[0].content[0]", ".system[0]", ".tools[1]"]
        assert _cache_marks(second) == [".messages[2].content[0]", ".system[0]", ".tools[1]"]
        assert second["messages"][2]["content"][0]["type"] == "tool_result"
        assert len(_cache_marks(second)) <= 4  # the API's limit
        await h.close()


async def test_without_the_cache_no_breakpoint_is_sent(tmp_path: Path, stub: StubServer) -> None:
    async with stub:
        stub.script(text_reply("hi"))
        h, c = await _open(tmp_path, _provider(stub, cache=False), system="stable")
        await _answer(h, await _prompt(c, "hello"))
        assert _cache_marks(stub.requests[0].json) == []
        await h.close()


# --- request options ---------------------------------------------------------------------


async def test_a_retry_sends_the_options_captured_when_the_generation_was_created(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        clock = pico.FakeClock()
        provider = _provider(stub, max_tokens=512, options={"temperature": 0.2})
        stub.script(
            Reply(529, error_body("overloaded_error", "Overloaded")),
            text_reply("fine"),
            text_reply("again"),
        )
        h, c = await _open(tmp_path, provider, clock=clock, retry_delay=0.5)
        question = await c.accept("hello")
        driving = asyncio.ensure_future(c.drive())
        generation = await _until(h, "generation", "retry_wait")
        assert isinstance(generation.state, dict)
        assert generation.state["options"] == {"max_tokens": 512, "temperature": 0.2}
        # The provider's options change; the waiting generation keeps what it captured.
        changed = _provider(stub, max_tokens=64, options={"temperature": 0.9})
        provider._options, provider._max_tokens = changed._options, changed._max_tokens
        clock.advance(1.0)
        assert await asyncio.wait_for(driving, 10) == "idle"
        await _answer(h, await c.result(question) or pico.InputResult("missing"))
        sent = [(r.json["max_tokens"], r.json["temperature"]) for r in stub.requests]
        assert sent == [(512, 0.2), (512, 0.2)]
        # A generation created now captures the options of now.
        await _prompt(c, "again")
        assert (stub.requests[-1].json["max_tokens"], stub.requests[-1].json["temperature"]) == (
            64,
            0.9,
        )
        await h.close()


# --- errors ------------------------------------------------------------------------------


async def test_a_rate_limit_waits_for_retry_after_then_succeeds(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        clock = pico.FakeClock()
        stub.script(
            Reply(
                429,
                error_body("rate_limit_error", "Number of request tokens has exceeded your limit."),
                headers={"retry-after": "7"},
            ),
            text_reply("answered after the wait"),
        )
        h, c = await _open(tmp_path, _provider(stub), clock=clock, retry_delay=0.5)
        question = await c.accept("hello")
        driving = asyncio.ensure_future(c.drive())
        generation = await _until(h, "generation", "retry_wait")
        assert generation.not_before == pytest.approx(clock.now() + 7.0)  # not retry_delay
        assert len(stub.requests) == 1
        clock.advance(3.0)
        await asyncio.sleep(0.05)
        assert len(stub.requests) == 1  # still waiting
        clock.advance(5.0)
        assert await asyncio.wait_for(driving, 10) == "idle"
        result = await c.result(question)
        assert result is not None
        assert (await _answer(h, result)).content == {"text": "answered after the wait"}
        assert len(stub.requests) == 2
        await h.close()


@pytest.mark.parametrize(
    "failure",
    [
        Reply(529, error_body("overloaded_error", "Overloaded")),
        Reply(
            sse=[
                *message_stream(text("partial"))[:3],
                error_event("overloaded_error", "Overloaded"),
            ]
        ),
        Reply(500, error_body("api_error", "Internal server error")),
        Reply(sse=message_stream(text("a long answer cut short"), input_tokens=30), cut_after=4),
    ],
    ids=["529", "error-event", "500", "stream-cut"],
)
async def test_an_overloaded_or_broken_attempt_is_retried(
    tmp_path: Path, stub: StubServer, failure: Reply
) -> None:
    async with stub:
        stub.script(failure, text_reply("second time lucky"))
        h, c = await _open(tmp_path, _provider(stub), retry_delay=0.01)
        answer = await _answer(h, await _prompt(c, "hello"))
        assert answer.content == {"text": "second time lucky"}
        assert len(stub.requests) == 2
        (generation,) = (await h.tasks(kind="generation", limit=5)).items
        assert isinstance(generation.state, dict) and generation.state["attempt"] == 1
        if failure.sse:  # the failed attempt's known usage is recorded too (§8.3)
            before = 30 if failure.cut_after else 25
            assert _usage(answer) == {"input": before + 25, "output": 1 + 12}
        else:
            assert _usage(answer) == {"input": 25, "output": 12}
        await h.close()


async def test_a_prompt_too_long_collapses_the_context_then_retries(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        stub.script(
            Reply(
                400,
                error_body(
                    "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
                ),
            ),
            text_reply("Summary: three questions about the parser."),
            text_reply("answered with less context"),
        )
        h, c = await _open(tmp_path, _provider(stub))
        for i in range(3):
            await c.append("user", f"question {i}")
            await c.append("assistant", {"text": f"answer {i}"})
        answer = await _answer(h, await _prompt(c, "one more question"))
        assert answer.content == {"text": "answered with less context"}
        (collapse,) = (await h.tasks(kind="collapse", limit=5)).items
        assert collapse.status == "done"
        (generation,) = (await h.tasks(kind="generation", limit=5)).items
        assert generation.status == "done"  # the same generation, retried once
        retried = stub.requests[2].json["messages"]
        assert retried[0]["content"][0]["text"].startswith("Summary: three questions")
        assert len(retried) < len(stub.requests[0].json["messages"])
        await h.close()


async def test_a_bad_key_fails_the_input_and_is_stored_nowhere(
    tmp_path: Path, stub: StubServer
) -> None:
    async with stub:
        # The server echoes the key it refused (proxies do): it must not reach the history.
        stub.script(Reply(401, error_body("authentication_error", f"invalid x-api-key {KEY}")))
        h, c = await _open(tmp_path, _provider(stub), retry_delay=0.01)
        result = await _prompt(c, "hello")
        assert result.status == "failed"
        assert result.reason is not None and "authentication" in result.reason
        assert "api_key" in result.reason  # what to check
        assert len(stub.requests) == 1  # fatal: never retried
        records = h.audit(limit=10_000)
        assert records and KEY not in json.dumps([r.payload for r in records], default=str)
        assert KEY not in result.reason and "***" in result.reason
        await h.close()


@pytest.mark.parametrize(
    ("reply", "kind", "words"),
    [
        (Reply(403, error_body("permission_error", "no access")), "fatal", "permission"),
        (Reply(404, error_body("not_found_error", "model: claude-x")), "fatal", "model name"),
        (Reply(400, error_body("invalid_request_error", "temperature: bad")), "fatal", "400"),
        (Reply(413, error_body("request_too_large", "too many bytes")), "fatal", "413"),
        (
            Reply(
                400,
                error_body(
                    "invalid_request_error",
                    "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000",
                ),
            ),
            "overflow",
            "context window",
        ),
        (Reply(408, error_body("timeout_error", "slow")), "retryable", "408"),
        (Reply(409, b"conflict"), "retryable", "409"),
        (Reply(503, b"<html>unavailable</html>"), "retryable", "503"),
        (
            Reply(sse=[*message_stream(text("x"))[:2], error_event("api_error", "boom")]),
            "retryable",
            "mid-stream",
        ),
        (
            Reply(sse=[*message_stream(text("x"))[:2], error_event("invalid_request_error", "no")]),
            "fatal",
            "mid-stream",
        ),
        (
            Reply(
                sse=[*message_stream(text("x"))[:2], b"event: content_block_delta\ndata: {no\n\n"]
            ),
            "retryable",
            "not JSON",
        ),
        (
            Reply(sse=[*message_stream(text("x"))[:2], error_event("rate_limit_error", "slow")]),
            "retryable",
            "rate limited",
        ),
        (
            Reply(
                sse=[
                    *message_stream(text("x"))[:2],
                    error_event("invalid_request_error", "prompt is too long: 300000 tokens"),
                ]
            ),
            "overflow",
            "context window",
        ),
    ],
)
async def test_each_failure_is_classified(
    stub: StubServer, reply: Reply, kind: str, words: str
) -> None:
    async with stub:
        stub.script(reply)
        provider = _provider(stub)
        request = pico.Request(
            model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        with pytest.raises(pico.ProviderError) as caught:
            async for _ in provider.stream(request):
                pass
        assert caught.value.kind == kind
        assert words in str(caught.value)
        assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [({"retry-after-ms": "1500"}, 1.5), ({"retry-after": "4"}, 4.0), ({}, None)],
)
async def test_an_overloaded_answer_carries_the_servers_retry_after(
    stub: StubServer, headers: dict[str, str], wait: float | None
) -> None:
    async with stub:
        stub.script(Reply(529, error_body("overloaded_error", "Overloaded"), headers=headers))
        request = pico.Request(
            model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        with pytest.raises(pico.ProviderError) as caught:
            async for _ in _provider(stub).stream(request):
                pass
        assert caught.value.kind == "retryable" and caught.value.retry_after == wait
        assert "overloaded" in str(caught.value)


async def test_an_unreachable_server_is_retryable() -> None:
    async with StubServer() as gone:
        url = gone.url
    provider = AnthropicProvider(base_url=url, api_key=KEY, timeout=5)
    request = pico.Request(model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),))
    with pytest.raises(pico.ProviderError) as caught:
        async for _ in provider.stream(request):
            pass
    assert caught.value.kind == "retryable" and "could not reach Anthropic" in str(caught.value)


async def test_an_unreachable_server_names_its_endpoint_without_credentials() -> None:
    async with StubServer() as gone:
        port = gone.port
    secret = "tok-in-the-url-" + KEY[-6:]
    provider = AnthropicProvider(
        base_url=f"http://user:{secret}@127.0.0.1:{port}/?token={secret}", api_key=KEY, timeout=5
    )
    request = pico.Request(model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),))
    with pytest.raises(pico.ProviderError) as caught:
        async for _ in provider.stream(request):
            pass
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message  # which endpoint failed
    assert secret not in message and KEY not in message, message


# --- cancellation ------------------------------------------------------------------------


async def test_an_abort_mid_stream_drops_the_connection(tmp_path: Path, stub: StubServer) -> None:
    async with stub:
        chunks = message_stream(text("a very long answer that never ends"))
        stub.script(Reply(sse=chunks[:4], hang=True))  # start, block start, ping, one delta
        h, c = await _open(tmp_path, _provider(stub))
        question = await c.accept("tell me everything")
        driving = asyncio.ensure_future(c.drive())
        await asyncio.wait_for(stub.streaming.wait(), 5)
        assert not stub.disconnected.is_set()
        await c.abort()
        # Check: the server sees the client go away promptly, not at the 600 s timeout.
        await asyncio.wait_for(stub.disconnected.wait(), 2)
        assert await asyncio.wait_for(driving, 5) == "idle"
        result = await c.result(question)
        assert result is not None and result.status == "cancelled"
        assert [e.kind for e in (await c.entries()).items] == ["user"]
        await h.close()


# --- a workload --------------------------------------------------------------------------


async def test_a_few_dozen_turns_alternate_text_and_tools(tmp_path: Path, stub: StubServer) -> None:
    async with stub:
        log: list[tuple[str, pico.JsonObject]] = []
        h, c = await _open(tmp_path, _provider(stub), tools=[_recorder(log, "read")])
        turns = 24
        for turn in range(turns):
            stub.script(*turn_replies(turn))
            answer = await _answer(h, await _prompt(c, f"question {turn}"))
            assert isinstance(answer.content, dict)
            assert str(answer.content["text"]).startswith(f"answer {turn}:")
        assert stub.pending == 0
        assert log == [("read", {"path": f"file{t}.py"}) for t in range(1, turns, 2)]
        assert len(stub.requests) == turns + turns // 2
        # The last request carries the whole history (4 messages per tool turn, 2 per text turn).
        assert len(stub.requests[-1].json["messages"]) == 3 * turns - 1
        await h.close()


# --- construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("api_key", ""),
        ("base_url", "api.anthropic.com"),
        ("timeout", 0),
        ("timeout", float("nan")),
        ("max_retries", -1),
        ("max_retries", True),
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("options", {"model": "x"}),
        ("options", {"max_tokens": 5}),
        ("options", {"temperature": float("inf")}),
        ("cache", "yes"),
        ("client", object()),
    ],
)
def test_a_bad_argument_is_refused_naming_it(argument: str, value: Any) -> None:
    with pytest.raises(pico.InvalidArgumentError, match=argument):
        AnthropicProvider(**{"api_key": "k", argument: value})


def test_options_and_fingerprint_name_no_secret() -> None:
    provider = AnthropicProvider(
        api_key=KEY,
        base_url="https://gateway.example.com/anthropic",
        max_tokens=1000,
        options={"temperature": 0.3, "top_p": 0.9},
    )
    assert provider.request_options() == {"max_tokens": 1000, "temperature": 0.3, "top_p": 0.9}
    assert provider.fingerprint() == {
        "api": "anthropic-messages",
        "host": "gateway.example.com",
        "options": {"max_tokens": 1000, "temperature": 0.3, "top_p": 0.9},
        "cache": True,
    }
    assert KEY not in json.dumps(provider.fingerprint())
    assert AnthropicProvider(api_key="k").fingerprint()["host"] == "api.anthropic.com"


async def test_poll_is_refused_because_it_never_defers() -> None:
    with pytest.raises(pico.ProviderError) as caught:
        await AnthropicProvider(api_key="k").poll("handle-1")
    assert caught.value.kind == "fatal"


def test_images_and_signed_thinking_map_to_content_blocks() -> None:
    provider = AnthropicProvider(api_key="k", cache=False)
    image = pico.ImagePart("image/png", "iVBORw0KGgo=")
    messages: Sequence[pico.Message] = (
        pico.Message("user", (pico.TextPart("look"), image)),
        pico.Message("assistant", (pico.ThinkingPart("unsigned"), pico.TextPart(""))),
        pico.Message(
            "assistant",
            (pico.ThinkingPart("unsigned"), pico.ToolCallPart("t1", "shot", {"x": 1})),
        ),
        pico.Message("user", (pico.ToolResultPart("t1", "", is_error=True, images=(image,)),)),
    )
    blocks = provider._messages(tuple(messages))
    source = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    assert blocks == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image", "source": source}],
        },
        # an assistant message of unsigned thinking and empty text has no block: dropped
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {"x": 1}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "image", "source": source}],
                    "is_error": True,
                }
            ],
        },
    ]


async def test_a_stream_without_message_stop_is_retryable_with_its_usage(
    stub: StubServer,
) -> None:
    async with stub:
        chunks = message_stream(tool_use("t1", "read", ['{"path": "a']), input_tokens=40)
        stub.script(Reply(sse=chunks[:-3]))  # ends cleanly, but before the block and message stop
        provider = _provider(stub)
        request = pico.Request(
            model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        with pytest.raises(pico.ProviderError) as caught:
            async for _ in provider.stream(request):
                pass
        assert caught.value.kind == "retryable" and "message_stop" in str(caught.value)
        assert caught.value.usage == pico.Usage(40, 1)


async def test_closing_the_stream_between_deltas_drops_the_connection(stub: StubServer) -> None:
    async with stub:
        chunks = message_stream(text("a very long answer that never ends"))
        stub.script(Reply(sse=chunks[:4], hang=True))
        provider = _provider(stub)
        request = pico.Request(
            model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        events = provider.stream(request)
        first = await anext(events)  # suspended at its yield, not inside the SDK's read
        assert isinstance(first, pico.TextDelta)
        await stub.streaming.wait()
        await events.aclose()  # what the generation does on an abort
        await asyncio.wait_for(stub.disconnected.wait(), 2)


async def test_an_injected_client_is_used_and_left_open(stub: StubServer) -> None:
    async with stub:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=stub.url, max_retries=0)
        provider = AnthropicProvider(client=client)
        assert provider.fingerprint()["host"] == "127.0.0.1"
        stub.script(text_reply("via the caller's client"))
        request = pico.Request(
            model=MODEL, messages=(pico.Message("user", (pico.TextPart("hi"),)),)
        )
        events = [e async for e in provider.stream(request)]
        done = events[-1]
        assert isinstance(done, pico.Done) and isinstance(done.outcome, pico.Response)
        assert done.outcome.message.text == "via the caller's client"
        await provider.aclose()
        assert not client.is_closed()  # the caller's to close
        await client.close()
        owned = _provider(stub)
        await owned.aclose()
        assert owned._client.is_closed()
