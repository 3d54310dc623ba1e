"""Steps for an agent session on the Anthropic adapter (issue 17): the session talks real
HTTP, through the ``anthropic`` SDK, to a stub server on loopback that answers in the
Messages API's wire format; the steps script its answers and read what it received."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import Agent, World
from pico.infrastructure.providers.anthropic import AnthropicProvider
from tests.anthropic_wire import MODEL, error_body, message_stream, text, text_reply
from tests.stub_http import Reply, StubServer


@dataclass
class AnthropicAgent(Agent):
    """The library's agent (its clock drives the work steps; its faux provider stays
    unused) with the stub server the session's Anthropic provider talks to."""

    stub: StubServer = field(default_factory=StubServer)


def _anthropic(world: World) -> AnthropicAgent:
    agent = world.agent
    assert isinstance(agent, AnthropicAgent), "the scenario's session is not on Anthropic"
    return agent


@pytest.fixture(autouse=True)
def anthropic_stub_stopped(world: World) -> Iterator[None]:
    """Stops a scenario's stub server on the scenario's loop, before the session closes."""
    yield
    if isinstance(world.agent, AnthropicAgent):
        world.run(world.agent.stub.__aexit__(None, None, None))


def _open(world: World, name: str, **kwargs: Any) -> World:
    clock = pico.FakeClock()
    agent = AnthropicAgent(pico.FauxProvider([]), clock)
    world.run(agent.stub.__aenter__())
    world.agent = agent
    provider = AnthropicProvider(base_url=agent.stub.url, api_key="test-key")
    world.harness = world.run(
        world.backend.open(provider=provider, model=MODEL, clock=clock, **kwargs)
    )
    world.names[name] = world.run(world.h.root()).id
    return world


@given(
    parsers.parse('an agent session with conversation "{name}" on the Anthropic API'),
    target_fixture="world",
)
def an_anthropic_session(world: World, name: str) -> World:
    return _open(world, name)


@given(
    parsers.parse(
        'an agent session with conversation "{name}" on the Anthropic API with a system '
        "prompt and tools"
    ),
    target_fixture="world",
)
def an_anthropic_session_with_tools(world: World, name: str) -> World:
    async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        return "ok"

    tools = [pico.Tool(n, n, {"type": "object"}, run) for n in ("read", "grep")]
    return _open(world, name, system="You review code. " * 20, tools=tools)


@given("the Anthropic API will be overloaded once")
def overloaded_once(world: World) -> None:
    _anthropic(world).stub.script(Reply(529, error_body("overloaded_error", "Overloaded")))


@given(parsers.parse('the Anthropic API will answer "{answer}"'))
def will_answer(world: World, answer: str) -> None:
    _anthropic(world).stub.script(text_reply(answer))


@given(
    parsers.parse(
        'the Anthropic API will answer "{answer}" reading {read:d} prompt tokens from its '
        "cache and writing {written:d}"
    )
)
def will_answer_from_cache(world: World, answer: str, read: int, written: int) -> None:
    _anthropic(world).stub.script(
        text_reply(answer, input_tokens=7, cache_read=read, cache_write=written)
    )


@given("the Anthropic API will stream an answer that never ends")
def never_ends(world: World) -> None:
    chunks = message_stream(text("an answer that goes on and on"))
    _anthropic(world).stub.script(Reply(sse=chunks[:4], hang=True))


@when("the Anthropic API is streaming the answer")
def is_streaming(world: World) -> None:
    world.run(asyncio.wait_for(_anthropic(world).stub.streaming.wait(), 5))


@then("the Anthropic API sees the connection close")
def sees_close(world: World) -> None:
    # Promptly: long before the SDK's 600-second read timeout.
    world.run(asyncio.wait_for(_anthropic(world).stub.disconnected.wait(), 2))


@then(parsers.parse("the Anthropic API was asked {count:d} times"))
def asked(world: World, count: int) -> None:
    assert len(_anthropic(world).stub.requests) == count


@then(
    "the request marked the system prompt, the last tool and the final message for the prompt cache"
)
def cache_marked(world: World) -> None:
    body = _anthropic(world).stub.requests[-1].json
    ephemeral = {"type": "ephemeral"}
    assert [b.get("cache_control") for b in body["system"]] == [ephemeral]
    assert [t.get("cache_control") for t in body["tools"]] == [None, ephemeral]
    *earlier, final = body["messages"]
    assert final["content"][-1]["cache_control"] == ephemeral
    assert all("cache_control" not in b for m in earlier for b in m["content"])


@then(
    parsers.parse(
        'the answer to "{question}" records {read:d} prompt tokens read from the cache and '
        "{written:d} written"
    )
)
def cache_recorded(world: World, question: str, read: int, written: int) -> None:
    conv = pico.ConversationHandle(world.h, world.run(world.h.root()).id)
    result = world.run(conv.result(world.id(question)))
    assert result is not None and result.entry_id is not None, result
    entry = world.run(world.h.entry(result.entry_id))
    assert entry is not None and entry.metadata is not None
    assert entry.metadata["usage"] == {
        "input": 7 + read + written,  # every prompt token, cached ones included
        "output": 12,
        "cache_read": read,
        "cache_write": written,
    }
