"""Steps for a model served over the OpenAI API (issue 17): the real ``openai`` SDK talks
HTTP to a loopback stub server scripted with recorded Chat Completions responses; what is
checked is the session's history and what the server received."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import World
from pico.infrastructure.providers.openai import OpenAIProvider
from tests.openai_wire import error_reply, text_reply, tool_reply
from tests.stub_http import StubServer

READ_SCHEMA: pico.JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@dataclass
class Served:
    stub: StubServer
    clock: pico.FakeClock
    conversation: pico.ConversationHandle
    ran: list[pico.JsonObject] = field(default_factory=list)
    questions: dict[str, int] = field(default_factory=dict)
    driving: asyncio.Future[Any] | None = None


def _served(world: World) -> Served:
    served = world.addresses.get("openai")
    assert isinstance(served, Served), "the scenario has no OpenAI-served session"
    return served


async def _until(check: Any, what: str) -> None:
    for _ in range(2000):
        if await check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting until {what}")


@given("a session whose model is served over the OpenAI API")
def openai_session(world: World, request: pytest.FixtureRequest) -> None:
    stub = StubServer()
    world.run(stub.__aenter__())
    request.addfinalizer(lambda: world.run(stub.__aexit__(None, None, None)))
    clock = pico.FakeClock()
    served_ran: list[pico.JsonObject] = []

    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        served_ran.append(dict(args))
        return f"contents of {args['path']}"

    provider = OpenAIProvider(base_url=stub.url + "/v1", api_key="test-key")
    world.harness = world.run(
        world.backend.open(
            provider=provider,
            model="gpt-test",
            clock=clock,
            retry_delay=0.5,
            tools=[pico.Tool("read", "read a file", READ_SCHEMA, read)],
        )
    )
    conversation = world.run(world.h.root())
    world.addresses["openai"] = Served(stub, clock, conversation, served_ran)


@given(
    parsers.parse("the server will refuse the next request as rate limited for {seconds:d} seconds")
)
def openai_rate_limited(world: World, seconds: int) -> None:
    _served(world).stub.script(
        error_reply(
            429,
            "Rate limit reached for gpt-test",
            "requests",
            "rate_limit_exceeded",
            headers={"retry-after": str(seconds)},
        )
    )


@given("the server will refuse the next request as too long for the model's context")
def openai_too_long(world: World) -> None:
    _served(world).stub.script(
        error_reply(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
        )
    )


@given(parsers.parse('the server will then answer "{text}"'))
def openai_then_answers(world: World, text: str) -> None:
    _served(world).stub.script(text_reply(text))


@given(parsers.parse('the server will call the tool "{name}" with the arguments {raw}'))
def openai_calls_tool(world: World, name: str, raw: str) -> None:
    half = len(raw) // 2
    _served(world).stub.script(tool_reply(("call_unreadable", name, [raw[:half], raw[half:]])))


@given(parsers.parse("the conversation already has {count:d} answered questions"))
def openai_history(world: World, count: int) -> None:
    served = _served(world)
    for n in range(count):
        served.stub.script(text_reply(f"answer {n}"))
        _, result = world.run(served.conversation.prompt(f"question {n}"))
        assert result is not None and result.status == "done"


@when(parsers.parse('the user asks the server "{question}"'))
def openai_user_asks(world: World, question: str) -> None:
    served = _served(world)
    served.questions[question] = world.run(served.conversation.accept(question))

    async def start() -> asyncio.Future[Any]:
        return asyncio.ensure_future(served.conversation.drive())

    served.driving = world.run(start())


@when("the question settles")
def openai_question_settles(world: World) -> None:
    served = _served(world)
    assert served.driving is not None
    assert world.run(asyncio.wait_for(served.driving, 20)) == "idle"


@when(parsers.parse("{seconds:d} seconds pass for the server"))
def openai_time_passes(world: World, seconds: int) -> None:
    served = _served(world)
    served.clock.advance(float(seconds))
    openai_question_settles(world)


@then(parsers.parse("the question waits {seconds:d} seconds before it is asked again"))
def openai_question_waits(world: World, seconds: int) -> None:
    served = _served(world)
    found: list[pico.TaskSnapshot] = []

    async def waiting() -> bool:
        page = await world.h.tasks(kind="generation", limit=10)
        found[:] = [t for t in page.items if t.status == "retry_wait"]
        return bool(found)

    world.run(_until(waiting, "the generation waits for a retry"))
    assert found[0].not_before == pytest.approx(served.clock.now() + seconds)


@then(parsers.parse("the server was asked {count:d} time"))
@then(parsers.parse("the server was asked {count:d} times"))
def openai_asked(world: World, count: int) -> None:
    assert len(_served(world).stub.requests) == count


@then(parsers.parse('"{question}" is answered with "{text}"'))
def openai_answered(world: World, question: str, text: str) -> None:
    served = _served(world)
    result = world.run(served.conversation.result(served.questions[question]))
    assert result is not None and result.status == "done", result
    assert result.entry_id is not None
    (entry,) = world.run(world.h.get_entries([result.entry_id])).values()
    assert isinstance(entry.content, dict) and entry.content["text"] == text


@then("the conversation was compacted once")
def openai_compacted(world: World) -> None:
    collapses = world.run(world.h.tasks(kind="collapse", limit=10)).items
    assert [t.status for t in collapses] == ["done"]


@then(parsers.parse('the last request to the server carried "{text}"'))
def openai_last_request_carried(world: World, text: str) -> None:
    assert text in json.dumps(_served(world).stub.requests[-1].json["messages"])


@then(parsers.parse('the tool "{name}" was not run'))
def openai_tool_not_run(world: World, name: str) -> None:
    assert _served(world).ran == []


@then("the server was sent an error result for that call")
def openai_error_result_sent(world: World) -> None:
    messages = _served(world).stub.requests[-1].json["messages"]
    (result,) = [m for m in messages if m["role"] == "tool"]
    assert result["tool_call_id"] == "call_unreadable"
    assert result["content"].startswith("[tool error] ")
