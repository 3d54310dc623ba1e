"""Agent turns end to end on the faux provider (§5.4, §8.1, §8.3, §8.4), every backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pico
from pico import FauxDeferred, FauxFailure, FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject
from tests.backends import Backend

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


def _tools(invoked: list[str]) -> list[pico.Tool]:
    async def read(args: JsonObject, ctx: ToolContext) -> str:
        invoked.append(f"read {args['path']}")
        return f"contents of {args['path']}"

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        invoked.append(f"grep {args['path']}")
        await asyncio.sleep(0)
        return "2 matches"

    async def stop(args: JsonObject, ctx: ToolContext) -> str:
        ctx.terminate()
        return "stopping"

    async def new_context(args: JsonObject, ctx: ToolContext) -> str:
        ctx.handoff(f"continue with {args['path']}")
        return "handing off"

    return [
        pico.Tool("read", "Read a file", SCHEMA, read, replay="safe"),
        pico.Tool("grep", "Search a file", SCHEMA, grep),
        pico.Tool("stop", "Stop", {"type": "object"}, stop),
        pico.Tool("new_context", "Hand off", SCHEMA, new_context),
    ]


async def _open(
    backend: Backend, provider: FauxProvider, invoked: list[str] | None = None, clock: Any = None
) -> pico.Harness:
    return await backend.open(
        provider=provider, tools=_tools(invoked if invoked is not None else []), clock=clock
    )


def _get(value: pico.JsonValue, key: str) -> pico.JsonValue:
    assert isinstance(value, dict), value
    return value[key]


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


async def test_a_final_answer_resolves_its_input(backend: Backend) -> None:
    provider = FauxProvider(["The parser has two problems."])
    h = await _open(backend, provider)
    c = await h.root()
    input_id, result = await _bounded(c.prompt("Inspect the parser"))
    assert result is not None and result == pico.InputResult("done", result.entry_id)
    assert result.entry_id is not None
    answer = await h.entry(result.entry_id)
    assert answer is not None and _get(answer.content, "text") == "The parser has two problems."
    assert list((await c.snapshot()).context) == [input_id, answer.id]
    assert answer.metadata is not None and answer.metadata["usage"] is not None
    tasks = (await h.tasks(limit=10)).items
    assert [(t.kind, t.status) for t in tasks] == [("generation", "done")]
    assert provider.requests[0].messages[0].text == "Inspect the parser"
    await h.close()


async def test_tool_calls_run_and_the_join_continues_the_exchange(backend: Backend) -> None:
    invoked: list[str] = []
    provider = FauxProvider(
        [
            FauxResponse(
                text="Let me look.",
                tool_calls=[("read", {"path": "a.py"}), ("grep", {"path": "b.py"})],
            ),
            "Both files point at parse().",
        ]
    )
    h = await _open(backend, provider, invoked)
    c = await h.root()
    _, result = await _bounded(c.prompt("Find the bug"))
    assert result is not None and result.status == "done"
    assert sorted(invoked) == ["grep b.py", "read a.py"]
    page = await c.entries()
    assert [e.kind for e in page.items] == ["user", "assistant", "tool", "tool", "assistant"]
    # The second request saw the results in call order, whatever the completion order.
    second = provider.requests[1].messages
    results = [p for p in second[-1].parts if isinstance(p, pico.ToolResultPart)]
    calls = second[-2].tool_calls
    assert [r.call_id for r in results] == [c.id for c in calls]
    kinds = [(t.kind, t.status) for t in (await h.tasks(limit=20)).items]
    assert kinds == [
        ("generation", "done"),
        ("tool", "done"),
        ("tool", "done"),
        ("post_tools", "done"),
        ("generation", "done"),
    ]
    await h.close()


async def test_an_unoffered_or_invalid_call_is_an_error_result(backend: Backend) -> None:
    invoked: list[str] = []
    provider = FauxProvider(
        [
            FauxResponse(tool_calls=[("rm", {"path": "/"}), ("read", {"path": 3})]),
            "Sorry.",
        ]
    )
    h = await _open(backend, provider, invoked)
    c = await h.root()
    _, result = await _bounded(c.prompt("clean up"))
    assert result is not None and result.status == "done" and invoked == []
    errors = [e.content for e in (await c.entries(kind="tool")).items]
    assert all(isinstance(e, dict) and e["is_error"] for e in errors)
    assert "did not offer" in str(errors[0]) and "invalid" in str(errors[1])
    await h.close()


async def test_a_retryable_failure_retries_the_same_generation_on_its_timer(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider([FauxFailure("retryable", "overloaded", retry_after=30), "ok"])
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    input_id = await c.accept("hello")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(50):
        await asyncio.sleep(0)
    assert not drive.done() and len(provider.requests) == 1
    generation = (await h.tasks(kind="generation", limit=5)).items
    assert [(g.status, _get(g.state, "attempt")) for g in generation] == [("retry_wait", 1)]
    clock.advance(30)
    assert await _bounded(drive) == "idle"
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    assert len((await h.tasks(kind="generation", limit=5)).items) == 1  # the SAME task
    await h.close()


async def test_a_fatal_failure_fails_the_input_without_a_fabricated_answer(
    backend: Backend,
) -> None:
    provider = FauxProvider([FauxFailure("fatal", "invalid api key")])
    h = await _open(backend, provider)
    c = await h.root()
    _, result = await _bounded(c.prompt("hello"))
    assert result is not None and result.status == "failed"
    assert "invalid api key" in (result.reason or "")
    assert [e.kind for e in (await c.entries()).items] == ["user"]
    await h.close()


async def test_a_deferred_response_waits_for_the_poll_permit(backend: Backend) -> None:
    provider = FauxProvider([FauxDeferred(polls=1, then="answered later")])
    h = await _open(backend, provider)
    c = await h.root()
    input_id = await c.accept("slow question")
    assert await _bounded(c.drive()) == "suspended"
    assert (await c.result(input_id)).status == "running"  # type: ignore[union-attr]
    generation = (await h.tasks(kind="generation", limit=1)).items[0]
    assert generation.required_permit == "deferred-poll" and generation.status == "deferred"
    assert await _bounded(c.drive(permits=["deferred-poll"])) == "idle"
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    assert provider.polls == [_get(generation.state, "handle")]
    await h.close()


async def test_request_keys_make_acceptance_retry_safe(backend: Backend) -> None:
    provider = FauxProvider(["answer"])
    h = await _open(backend, provider)
    c = await h.root()
    first = await c.accept("hello", request_id="web-42")
    head = h.head()
    assert await c.accept("hello", request_id="web-42") == first
    assert h.head() == head  # the retry wrote nothing
    with pytest.raises(pico.RequestKeyConflictError):
        await c.accept("something else", request_id="web-42")
    assert len((await h.tasks(kind="generation", limit=5)).items) == 1
    # A second, different input while the turn runs is queued, not run.
    second = await c.accept("another question")
    assert (await c.result(second)) == pico.InputResult("queued")
    await h.close()


async def test_terminate_stops_and_handoff_resets_after_the_exchange(backend: Backend) -> None:
    provider = FauxProvider([FauxResponse(tool_calls=[("stop", {})])])
    h = await _open(backend, provider)
    c = await h.root()
    _, result = await _bounded(c.prompt("stop now"))
    assert result is not None and result.status == "stopped"
    assert [t.kind for t in (await h.tasks(limit=10)).items] == ["generation", "tool", "post_tools"]
    provider2 = FauxProvider(
        [FauxResponse(tool_calls=[("new_context", {"path": "p.py"})]), "fresh start"]
    )
    h2_backend = Backend(backend.name, backend.url, backend.session + "-handoff")
    h2 = await _open(h2_backend, provider2)
    c2 = await h2.root()
    _, result2 = await _bounded(c2.prompt("start over"))
    assert result2 is not None and result2.status == "done"
    context = await c2.context_entries()
    assert [e.kind for e in context] == ["handoff", "assistant"]
    assert context[0].content == "continue with p.py"
    assert provider2.requests[1].messages[0].text == "continue with p.py"
    await h.close()
    await h2.close()


async def test_abort_cancels_the_turn_and_resolves_its_input(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(["a long answer"], chunk_chars=2, cadence=1.0, clock=clock)
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    input_id = await c.accept("tell me everything")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(50):
        await asyncio.sleep(0)
    marked = await c.abort()
    assert len(marked) == 1
    clock.advance(100)  # the stream finishes; the settlement sees the mark
    assert await _bounded(drive) == "idle"
    result = await c.result(input_id)
    assert result is not None and result.status == "cancelled"
    assert [e.kind for e in (await c.entries()).items] == ["user"]  # no answer published
    await h.close()


async def test_an_interrupted_stream_is_retried_after_reopen_never_fabricated(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(
        ["partial answer that never finishes"], chunk_chars=4, cadence=1.0, clock=clock
    )
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    input_id = await c.accept("question")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(50):
        await asyncio.sleep(0)
    clock.advance(1)  # one frame streamed into the working scope
    for _ in range(20):
        await asyncio.sleep(0)
    await h.close()  # the process stops mid-stream
    assert await _bounded(drive) == "closed"
    provider2 = FauxProvider(["the complete answer"])
    h2 = await _open(backend, provider2)
    c2 = await h2.root()
    assert await _bounded(c2.drive()) == "idle"
    result = await c2.result(input_id)
    assert result is not None and result.status == "done"
    answer = await h2.entry(result.entry_id)  # type: ignore[arg-type]
    assert answer is not None and _get(answer.content, "text") == "the complete answer"
    await h2.close()


async def test_queued_input_is_answered_by_its_own_group_not_by_a_later_answer(
    backend: Backend,
) -> None:
    """§10.2: queued B precedes A's answer in the transcript; B stays pending until its own
    group completes; A's answer is not B's."""
    clock = pico.FakeClock()
    provider = FauxProvider(["answer to A", "answer to B"], chunk_chars=4, cadence=1.0, clock=clock)
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    a = await c.accept("question A")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(30):
        await asyncio.sleep(0)
    b = await c.follow_up("question B")  # arrives while A streams
    assert await c.result(b) == pico.InputResult("queued")
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert drive.result() == "idle"
    ra, rb = await c.result(a), await c.result(b)
    assert ra is not None and rb is not None and ra.status == rb.status == "done"
    assert ra.entry_id != rb.entry_id
    answer_b = await h.entry(rb.entry_id)  # type: ignore[arg-type]
    assert answer_b is not None and _get(answer_b.content, "text") == "answer to B"
    kinds = [(e.id, e.kind) for e in (await c.entries()).items]
    assert ra.entry_id is not None
    assert kinds.index((b, "user")) < kinds.index((ra.entry_id, "assistant"))  # admitted first
    # B's model request saw B through its placement, after A's answer.
    assert provider.requests[1].messages[-1].text.endswith("question B")
    await h.close()


async def test_steering_joins_the_current_group_at_the_tool_boundary(backend: Backend) -> None:
    release = asyncio.Event()

    async def slow(args: JsonObject, ctx: ToolContext) -> str:
        await release.wait()
        return "slow result"

    provider = FauxProvider(
        [FauxResponse(tool_calls=[("slow", {"path": "x"})]), "one answer for both"]
    )
    tool = pico.Tool("slow", "Slow", SCHEMA, slow)
    h = await backend.open(provider=provider, tools=[tool])
    c = await h.root()
    a = await c.accept("start")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(50):
        await asyncio.sleep(0)
    s = await c.steer("also check y")  # during tool execution
    w = await c.append_message("a note for the model")  # context only
    release.set()
    assert await _bounded(drive) == "idle"
    ra, rs, rw = await c.result(a), await c.result(s), await c.result(w)
    assert ra is not None and rs is not None and rw is not None
    assert ra.status == rs.status == "done" and ra.entry_id == rs.entry_id  # one answer
    assert rw.status == "placed"
    assert len(provider.requests) == 2  # the write requested no run of its own
    await h.close()


async def test_cancel_queued_and_abort_keep_writes_and_next_run(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(["first"], chunk_chars=2, cadence=1.0, clock=clock)
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    await c.accept("go")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(30):
        await asyncio.sleep(0)
    f1 = await c.follow_up("follow one")
    f2 = await c.follow_up("follow two")
    s = await c.steer("steer")
    n = await c.next_run("next time")
    w = await c.append_message("remember this")
    assert await c.cancel_queued(f1) == "cancelled"
    assert await c.cancel_queued(f1) == "already_consumed"
    assert await c.cancel_queued(10**9) == "not_found"
    await c.abort()
    clock.advance(100)
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    statuses = {
        k: (await c.result(v)).status  # type: ignore[union-attr]
        for k, v in {"f1": f1, "f2": f2, "s": s, "n": n, "w": w}.items()
    }
    assert statuses == {
        "f1": "cancelled",
        "f2": "cancelled",
        "s": "cancelled",
        "n": "queued",
        "w": "queued",
    }
    await h.close()


async def test_the_generation_captures_model_and_retry_budget_at_creation(
    backend: Backend,
) -> None:
    provider = FauxProvider([FauxFailure("retryable", "busy", retry_after=0), "ok"])
    h = await backend.open(provider=provider, model="model-one")
    assert h.services is not None
    c = await h.root()
    input_id = await c.accept("hello")
    h.services.model = "model-two"  # a later change does not alter a live turn
    h.services.max_attempts = 1  # nor its retry budget (captured: 3)
    assert await _bounded(c.drive()) == "idle"
    assert [r.model for r in provider.requests] == ["model-one", "model-one"]
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_a_held_call_is_answered_once_from_outside(backend: Backend) -> None:
    async def approve(args: JsonObject, ctx: ToolContext) -> str:
        ctx.defer()  # an operator answers later
        return "waiting for approval"

    provider = FauxProvider(
        [FauxResponse(tool_calls=[("approve", {"path": "deploy"})]), "Deployed."]
    )
    tool = pico.Tool("approve", "Ask a human", SCHEMA, approve)
    h = await backend.open(provider=provider, tools=[tool])
    c = await h.root()
    input_id = await c.accept("deploy it")
    assert await _bounded(c.drive()) == "suspended"  # durably waiting outside
    held = await h.held_tool_calls(c.id)
    assert len(held) == 1 and held[0].role == "waiting"
    await h.close()
    # Another process answers; validation comes before any write.
    h = await backend.open(provider=provider, tools=[tool])
    head = h.head()
    with pytest.raises(pico.CommandRejectedError):
        await h.answer_tool_call(input_id, "not a tool task")
    assert h.head() == head
    entry = await h.answer_tool_call(held[0].id, "approved by alice")
    with pytest.raises(pico.ToolCallAnsweredError, match=f"entry {entry}"):
        await h.answer_tool_call(held[0].id, "approved twice")
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    results = [
        p for p in provider.requests[-1].messages[-1].parts if isinstance(p, pico.ToolResultPart)
    ]
    assert [r.content for r in results] == ["approved by alice"]
    await h.close()


async def test_calls_from_a_truncated_response_get_error_results_without_running(
    backend: Backend,
) -> None:
    invoked: list[str] = []
    provider = FauxProvider(
        [
            FauxResponse(tool_calls=[("read", {"path": "a.py"})], stop_reason="max_tokens"),
            "I will try again with less output.",
        ]
    )
    h = await _open(backend, provider, invoked)
    c = await h.root()
    _, result = await _bounded(c.prompt("read a.py"))
    assert result is not None and result.status == "done" and invoked == []
    (tool_entry,) = (await c.entries(kind="tool")).items
    assert _get(tool_entry.content, "is_error") is True
    await h.close()


class _UnusableCallProvider(FauxProvider):
    """Answers its first request with a call whose arguments a real adapter could not
    read (a stream cut inside them), then follows its script."""

    async def stream(self, request: pico.Request) -> Any:
        if self.request_count == 0:
            self.request_count += 1
            self.requests.append(request)
            call = pico.ToolCallPart("c1", "read", {}, unusable='invalid JSON: {"path": "a.')
            yield pico.Done(pico.Response(pico.Message("assistant", (call,)), "tool_use", None))
            return
        async for event in super().stream(request):
            yield event


async def test_a_call_with_unusable_arguments_gets_an_error_result_without_running(
    backend: Backend,
) -> None:
    invoked: list[str] = []
    provider = _UnusableCallProvider(["I will send valid arguments next time."])
    h = await _open(backend, provider, invoked)
    c = await h.root()
    _, result = await _bounded(c.prompt("read a.py"))
    assert result is not None and result.status == "done" and invoked == []
    (tool_entry,) = (await c.entries(kind="tool")).items
    assert _get(tool_entry.content, "is_error") is True
    assert "could not be used (invalid JSON" in str(_get(tool_entry.content, "content"))
    (call_entry,) = [
        e for e in (await c.entries(kind="assistant")).items if "tool_calls" in str(e.content)
    ]
    stored: Any = _get(call_entry.content, "tool_calls")
    assert str(stored[0]["unusable"]).startswith("invalid JSON")
    # The model saw the error result as the call's answer.
    (answer,) = [
        p for p in provider.requests[-1].messages[-1].parts if isinstance(p, pico.ToolResultPart)
    ]
    assert answer.call_id == "c1" and answer.is_error
    await h.close()


async def test_initial_root_values_are_set_only_for_empty_storage(backend: Backend) -> None:
    model = pico.conversation_value("agent.model", str, rewind=False)
    name = pico.session_value("app.name", str)
    h = await backend.open(initial_values=[(model, "small"), (name, "parser work")])
    c = await h.root()
    assert await c.get_value(model) == "small" and await h.get_value(name) == "parser work"
    await c.set_value(model, "large")
    await h.close()
    h = await backend.open(initial_values=[(model, "small")])  # existing storage: no effect
    assert await (await h.root()).get_value(model) == "large"
    await h.close()


async def test_known_usage_is_committed_for_every_attempt(backend: Backend) -> None:
    provider = FauxProvider(
        [
            FauxFailure("retryable", "overloaded", retry_after=0, usage=pico.Usage(10, 2)),
            FauxResponse(text="ok"),
        ]
    )
    h = await _open(backend, provider)
    c = await h.root()
    _, result = await _bounded(c.prompt("hello"))
    assert result is not None and result.status == "done"
    (generation,) = (await h.tasks(kind="generation", limit=5)).items
    usage = _get(generation.state, "usage")
    assert isinstance(usage, dict) and usage["input"] == 10 + 2 and usage["output"] == 2 + 1
    await h.close()


async def test_tool_details_usage_progress_and_added_tools(backend: Backend) -> None:
    async def enable(args: JsonObject, ctx: ToolContext) -> str:
        await ctx.write("enabling grep\n")
        ctx.set_details({"enabled": ["grep"]})
        ctx.report_usage(pico.Usage(5, 1))
        ctx.add_tools("grep")
        return "done"

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        return "match"

    provider = FauxProvider([FauxResponse(tool_calls=[("enable", {})]), "now I can grep"])
    h = await backend.open(
        provider=provider,
        tools=[
            pico.Tool("enable", "Enable tools", {"type": "object"}, enable),
            pico.Tool("grep", "Search", {"type": "object"}, grep),
        ],
    )
    assert h.services is not None
    h.services.active_tools = ["enable"]
    c = await h.root()
    _, result = await _bounded(c.prompt("search"))
    assert result is not None and result.status == "done"
    assert [t.name for t in provider.requests[0].tools] == ["enable"]
    assert [t.name for t in provider.requests[1].tools] == ["enable", "grep"]
    tool = (await h.tasks(kind="tool", limit=1)).items[0]
    assert _get(tool.state, "details") == {"enabled": ["grep"]}
    assert _get(tool.state, "usage") == {"input": 5, "output": 1}
    (entry,) = (await c.entries(kind="tool")).items
    assert _get(entry.content, "content") == "enabling grep\ndone"
    await h.close()


@pytest.mark.parametrize("first", ["read", "grep"])
async def test_parallel_tools_settling_in_either_order_continue_exactly_once(
    backend: Backend, first: str
) -> None:
    gates = {"read": asyncio.Event(), "grep": asyncio.Event()}
    started: list[str] = []

    def gated(name: str) -> Any:
        async def run(args: JsonObject, ctx: ToolContext) -> str:
            started.append(name)
            await gates[name].wait()
            return f"{name} result"

        return run

    provider = FauxProvider(
        [
            FauxResponse(tool_calls=[("read", {"path": "a"}), ("grep", {"path": "b"})]),
            "one continuation",
        ]
    )
    h = await backend.open(
        provider=provider,
        tools=[
            pico.Tool("read", "r", SCHEMA, gated("read")),
            pico.Tool("grep", "g", SCHEMA, gated("grep")),
        ],
    )
    c = await h.root()
    input_id = await c.accept("both")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(100):
        if len(started) == 2:
            break
        await asyncio.sleep(0)
    assert sorted(started) == ["grep", "read"]  # both run in parallel
    second = "grep" if first == "read" else "read"
    gates[first].set()
    for _ in range(30):
        await asyncio.sleep(0)
    assert [t.kind for t in (await h.tasks(kind="generation", limit=5)).items] == ["generation"]
    gates[second].set()
    assert await _bounded(drive) == "idle"
    kinds = [t.kind for t in (await h.tasks(limit=20)).items]
    assert kinds.count("post_tools") == 1 and kinds.count("generation") == 2
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_abort_before_the_join_settles_it_without_a_successor(backend: Backend) -> None:
    gate = asyncio.Event()

    async def slow(args: JsonObject, ctx: ToolContext) -> str:
        await gate.wait()
        return "late"

    provider = FauxProvider([FauxResponse(tool_calls=[("slow", {"path": "a"})]), "never"])
    h = await backend.open(provider=provider, tools=[pico.Tool("slow", "s", SCHEMA, slow)])
    c = await h.root()
    input_id = await c.accept("go")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(60):
        await asyncio.sleep(0)
    marked = await c.abort()  # selects the running tool and the join
    kinds = {t.id: t.kind for t in (await h.tasks(limit=10)).items}
    assert sorted(kinds[i] for i in marked) == ["post_tools", "tool"]
    gate.set()
    assert await _bounded(drive) == "idle"
    tasks = (await h.tasks(limit=10)).items
    assert [t.kind for t in tasks].count("generation") == 1  # no unmarked successor escaped
    assert (await c.result(input_id)).status == "cancelled"  # type: ignore[union-attr]
    await h.close()


async def test_abort_after_the_join_selects_its_successor(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(
        [FauxResponse(tool_calls=[("read", {"path": "a"})]), "a slow continuation"],
        chunk_chars=2,
        cadence=1.0,
        clock=clock,
    )
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    input_id = await c.accept("go")
    drive = asyncio.ensure_future(c.drive())
    while len([t for t in (await h.tasks(kind="generation", limit=5)).items]) < 2:
        clock.advance(1.0)
        await asyncio.sleep(0)
    marked = await c.abort()  # the join already settled: its successor is selected
    generations = (await h.tasks(kind="generation", limit=5)).items
    assert generations[1].id in marked
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert (await h.task(generations[1].id)).status == "aborted"  # type: ignore[union-attr]
    assert (await c.result(input_id)).status == "cancelled"  # type: ignore[union-attr]
    await h.close()


async def test_long_streams_write_frames_to_the_working_scope_until_settlement(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    long_text = "x" * 1500  # three full frames of 512 characters before the end
    provider = FauxProvider([long_text], chunk_chars=100, cadence=1.0, clock=clock)
    h = await _open(backend, provider, clock=clock)
    c = await h.root()
    input_id = await c.accept("write a lot")
    drive = asyncio.ensure_future(c.drive())
    (generation,) = (await h.tasks(kind="generation", limit=1)).items
    frames = pico.working_list(
        "pico.frames", str, scope=pico.working_scope(f"task/{generation.id}")
    )
    seen: list[int] = []
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
        page = await h.read_list(frames, limit=100)
        seen.append(sum(len(e.value) for e in page.items))
    assert max(seen) >= 1024  # partial output was durable while streaming
    assert (await h.read_list(frames)).items == ()  # retired with the settlement
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    answer = await h.entry(result.entry_id)  # type: ignore[arg-type]
    assert answer is not None and _get(answer.content, "text") == long_text
    await h.close()


async def test_tool_images_reach_the_model_within_caps(backend: Backend) -> None:
    from pico.application import tools as tool_policy

    async def screenshot(args: JsonObject, ctx: ToolContext) -> str:
        await ctx.add_image(b"\x89PNG-small", mime="image/png")
        await ctx.add_image(b"x" * (tool_policy.IMAGE_CAP_BYTES + 1))  # over the cap
        return "captured"

    provider = FauxProvider([FauxResponse(tool_calls=[("screenshot", {})]), "I see it."])
    h = await backend.open(
        provider=provider,
        tools=[pico.Tool("screenshot", "Take a screenshot", {"type": "object"}, screenshot)],
    )
    c = await h.root()
    _, result = await _bounded(c.prompt("look"))
    assert result is not None and result.status == "done"
    parts = [
        p for p in provider.requests[1].messages[-1].parts if isinstance(p, pico.ToolResultPart)
    ]
    (part,) = parts
    assert [(i.mime, i.data) for i in part.images] == [("image/png", "iVBORy1zbWFsbA==")]
    assert "image dropped" in part.content
    await h.close()
