"""Telemetry (issue 17): OpenTelemetry spans for commands, task executions, model requests
and tool calls, asserted through an SDK tracer provider with an in-memory exporter; and the
library's ``pico.*`` loggers, which get no handler from pico."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import pico
from pico import FauxFailure, FauxProvider, FauxResponse
from tests.backends import Backend


def _traced() -> tuple[pico.Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return pico.Telemetry(tracer=provider.get_tracer("test")), exporter


def _parent(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == span.parent.span_id), None)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def _tool(name: str, fail: bool = False) -> pico.Tool:
    async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        if fail:
            raise OSError(f"cannot read {args['path']}")
        return f"contents of {args['path']}"

    return pico.Tool(name, "Read a file", {"type": "object"}, run)


async def test_an_agent_turn_is_one_span_per_task_with_its_request_and_tool_call_inside(
    backend: Backend,
) -> None:
    telemetry, exporter = _traced()
    provider = FauxProvider(
        [FauxResponse(tool_calls=[("read", {"path": "parser.py"})]), "parse() recurses."]
    )
    h = await backend.open(
        provider=provider, tools=[_tool("read")], model="faux-1", telemetry=telemetry
    )
    c = await h.root()
    _, result = await c.prompt("Why is the parser slow?")
    assert result is not None and result.status == "done"
    stored = (await h.tasks(conversation_ids=[c.id])).items
    audit = h.audit(limit=10_000)
    session_id = h.session_id
    await h.close()  # waits for the executions: a span ends just after its settlement
    spans = exporter.get_finished_spans()

    # Check the task spans: two generations, a tool, the join, in that order, each a root
    # here (nothing of the caller's was current) with its status transition.
    tasks = sorted(
        (s for s in spans if s.name.startswith("pico.task ")), key=lambda s: s.start_time or 0
    )
    assert [s.name for s in tasks] == [
        "pico.task generation",
        "pico.task tool",
        "pico.task post_tools",
        "pico.task generation",
    ]
    by_id = {t.id: t for t in stored}
    for span in tasks:
        attributes = _attrs(span)
        task = by_id[int(attributes["pico.task.id"])]
        assert attributes["pico.task.kind"] == task.kind
        assert attributes["pico.task.status.from"] == "pending"
        assert attributes["pico.task.status.to"] == task.status == "done"
        assert attributes["pico.conversation.id"] == c.id
        assert span.status.status_code is StatusCode.UNSET

    # Check the provider requests: one per generation, inside its task span, with the
    # GenAI attributes; their tokens add up to the usage the generations stored.
    chats = _named(spans, "chat faux-1")
    assert len(chats) == 2
    assert [_parent(s, spans) for s in chats] == [tasks[0], tasks[3]]
    stored_input = stored_output = 0
    for task in stored:
        if task.kind == "generation":
            state: Any = task.state
            stored_input += state["usage"]["input"]
            stored_output += state["usage"]["output"]
    for chat, reason in zip(chats, ["tool_use", "end_turn"], strict=True):
        attributes = _attrs(chat)
        assert chat.kind is SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "FauxProvider"
        assert attributes["gen_ai.request.model"] == "faux-1"
        assert attributes["gen_ai.response.finish_reasons"] == (reason,)
    assert sum(int(_attrs(s)["gen_ai.usage.input_tokens"]) for s in chats) == stored_input
    assert sum(int(_attrs(s)["gen_ai.usage.output_tokens"]) for s in chats) == stored_output
    assert stored_input > 0 and stored_output > 0

    # Check the tool call: inside the tool task's span, named after the tool, ok.
    (call,) = _named(spans, "execute_tool read")
    assert _parent(call, spans) is tasks[1]
    tool_task = by_id[int(_attrs(tasks[1])["pico.task.id"])]
    assert isinstance(tool_task.state, dict)
    assert call.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "read",
        "gen_ai.tool.call.id": tool_task.state["call_id"],
        "pico.tool.outcome": "ok",
    }

    # Check the commands: each one's batch is a stored batch, its event count is what the
    # batch stored, and a task's commands are inside that task's span.
    commands = _named(spans, "pico.command")
    batches: dict[tuple[int, int], int] = {}
    count = 0
    for record in audit:
        count += 1
        if record.event == "Session.Claimed":
            count = 0
        elif record.event == "Session.Committed":
            first, last = record.payload["first"], record.payload["last"]
            assert isinstance(first, int) and isinstance(last, int)
            batches[(first, last)] = count
            count = 0
    assert len(commands) == len(batches) >= 9  # root, prompt, 2 + 2 + 1 + 2 by the tasks
    for span in commands:
        attributes = _attrs(span)
        assert attributes["pico.session.id"] == session_id
        batch = (int(attributes["pico.batch.first"]), int(attributes["pico.batch.last"]))
        assert batches.pop(batch) == attributes["pico.events"]
        assert int(attributes["pico.events"]) > 0
        parent = _parent(span, spans)
        if "pico.task.id" in attributes:
            assert parent is not None and parent in tasks
            assert _attrs(parent)["pico.task.id"] == attributes["pico.task.id"]
        else:
            assert parent is None  # the caller's own commands (the prompt, the root)
    assert batches == {}  # every stored batch of this handle had its span


async def test_a_retryable_failure_marks_its_request_span_with_the_retry_class(
    backend: Backend,
) -> None:
    telemetry, exporter = _traced()
    provider = FauxProvider(
        [FauxFailure("retryable", "overloaded", usage=pico.Usage(7, 0)), "fine now"]
    )
    h = await backend.open(provider=provider, retry_delay=0.0, telemetry=telemetry)
    c = await h.root()
    _, result = await c.prompt("hello")
    assert result is not None and result.status == "done"
    (generation,) = (await h.tasks(conversation_ids=[c.id], kind="generation")).items
    assert isinstance(generation.state, dict) and isinstance(generation.state["usage"], dict)
    await h.close()
    spans = exporter.get_finished_spans()
    failed, answered = _named(spans, "chat default")

    # Check the failed attempt: error status, its class and the usage it still cost.
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "overloaded"
    assert _attrs(failed)["error.type"] == "pico.retryable"
    assert _attrs(failed)["pico.retry.class"] == "retryable"
    assert _attrs(failed)["gen_ai.usage.input_tokens"] == 7
    assert "gen_ai.response.finish_reasons" not in _attrs(failed)
    assert answered.status.status_code is StatusCode.UNSET
    assert "error.type" not in _attrs(answered)
    assert generation.state["usage"]["input"] == 7 + int(
        _attrs(answered)["gen_ai.usage.input_tokens"]
    )

    # Check the executions: the failed attempt's execution moved pending -> retry_wait, the
    # retry's moved retry_wait -> done; both spans of the one generation task.
    executions = _named(spans, "pico.task generation")
    assert [
        (_attrs(s)["pico.task.status.from"], _attrs(s)["pico.task.status.to"]) for s in executions
    ] == [("pending", "retry_wait"), ("retry_wait", "done")]
    assert [_parent(s, spans) for s in (failed, answered)] == executions


async def test_a_fatal_failure_leaves_the_generation_span_failed(backend: Backend) -> None:
    telemetry, exporter = _traced()
    h = await backend.open(
        provider=FauxProvider([FauxFailure("fatal", "bad key")]), telemetry=telemetry
    )
    c = await h.root()
    _, result = await c.prompt("hello")
    assert result is not None and result.status == "failed"
    await h.close()
    spans = exporter.get_finished_spans()
    (chat,) = _named(spans, "chat default")
    (execution,) = _named(spans, "pico.task generation")
    assert _attrs(chat)["pico.retry.class"] == "fatal"
    assert _attrs(execution)["pico.task.status.to"] == "failed"
    assert execution.status.status_code is StatusCode.ERROR


async def test_a_failing_tool_records_the_outcome_error(backend: Backend) -> None:
    telemetry, exporter = _traced()
    provider = FauxProvider([FauxResponse(tool_calls=[("read", {"path": "gone.py"})]), "sorry"])
    h = await backend.open(provider=provider, tools=[_tool("read", fail=True)], telemetry=telemetry)
    c = await h.root()
    await c.prompt("read gone.py")
    (tool_task,) = (await h.tasks(conversation_ids=[c.id], kind="tool")).items
    state: Any = tool_task.state
    entry = await h.entry(state["result_entry"])
    content: Any = None if entry is None else entry.content
    assert content["is_error"] is True  # the stored result is an error
    await h.close()
    spans = exporter.get_finished_spans()
    (call,) = _named(spans, "execute_tool read")
    assert _attrs(call)["pico.tool.outcome"] == "error"
    assert _attrs(call)["error.type"] == "pico.tool_error"
    assert call.status.status_code is StatusCode.ERROR
    assert "gone.py" not in (call.status.description or "")  # no tool output in the span


async def test_a_callers_span_is_the_parent_of_the_turn(backend: Backend) -> None:
    telemetry, exporter = _traced()
    h = await backend.open(provider=FauxProvider(["hi"]), telemetry=telemetry)
    c = await h.root()
    with telemetry.tracer.start_as_current_span("handle request"):
        await c.prompt("hello")
    await h.close()
    spans = exporter.get_finished_spans()
    (outer,) = _named(spans, "handle request")
    (execution,) = _named(spans, "pico.task generation")
    assert _parent(execution, spans) is outer


_SCRIPT = """
import asyncio, json, logging, sys
root_before = list(logging.getLogger().handlers)
import pico

async def main() -> None:
    traced = sys.argv[1] == "sdk"
    if traced:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    h = await pico.Harness.open("memory://t", provider=pico.FauxProvider(["hi"]))
    if traced:  # set after the open: the default telemetry still honours it
        trace.set_tracer_provider(provider)
    c = await h.root()
    _, result = await c.prompt("hello")
    # What the harness's own telemetry does with a span now: records it only with an SDK.
    recording = h._line.telemetry.tracer.start_span("probe").is_recording()
    await h.close()
    names = sorted({s.name for s in exporter.get_finished_spans()}) if traced else []
    print(json.dumps({
        "status": result.status if result else None,
        "recording": recording,
        "names": names,
        "pico_handlers": len(logging.getLogger("pico").handlers),
        "child_handlers": sum(
            len(logging.getLogger(n).handlers)
            for n in logging.root.manager.loggerDict if n.startswith("pico")
        ),
        "root_unchanged": logging.getLogger().handlers == root_before,
        "root_level": logging.getLogger().level,
    }))

asyncio.run(main())
"""


def _run(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


def test_without_a_tracer_provider_nothing_is_recorded_and_no_handler_is_added() -> None:
    # A fresh interpreter: no SDK tracer provider set, no handler anyone else installed.
    seen = _run("none")
    assert seen == {
        "status": "done",
        "recording": False,  # the API's no-op: nothing the harness starts is recorded
        "names": [],
        "pico_handlers": 0,
        "child_handlers": 0,
        "root_unchanged": True,
        "root_level": 30,  # WARNING: the default, untouched
    }
    assert pico.Telemetry().tracer.start_span("probe").is_recording() is False


def test_the_default_telemetry_honours_the_global_tracer_provider() -> None:
    seen = _run("sdk")
    assert seen["status"] == "done"
    assert seen["names"] == ["chat default", "pico.command", "pico.task generation"]
    assert seen["recording"] is True
    assert seen["pico_handlers"] == 0 and seen["root_unchanged"] is True


async def test_a_closed_harness_ends_its_spans(backend: Backend) -> None:
    telemetry, exporter = _traced()
    clock = pico.FakeClock()
    provider = FauxProvider(["a slow answer"], chunk_chars=1, cadence=1.0, clock=clock)
    h = await backend.open(provider=provider, clock=clock, telemetry=telemetry)
    c = await h.root()
    await c.accept("hello")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(50):
        await asyncio.sleep(0)
    await h.close()  # stops the stream mid-way
    await asyncio.gather(driving, return_exceptions=True)
    spans = exporter.get_finished_spans()
    (chat,) = _named(spans, "chat default")
    assert _attrs(chat)["pico.request.stopped"] is True
    (execution,) = _named(spans, "pico.task generation")
    assert _attrs(execution)["pico.task.status.to"] == "streaming"  # resumable


async def test_a_scheduled_retry_is_logged_on_pico_provider_without_the_content(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pico")
    provider = FauxProvider([FauxFailure("retryable", "overloaded"), "fine now"])
    h = await backend.open(provider=provider, retry_delay=0.0)
    c = await h.root()
    _, result = await c.prompt("a secret question")
    assert result is not None and result.status == "done"
    await h.close()
    records = [r for r in caplog.records if r.name == "pico.provider"]
    lines = [(r.name, r.levelno, r.getMessage()) for r in records]
    assert [(name, level) for name, level, _ in lines] == [
        ("pico.provider", logging.DEBUG),
        ("pico.provider", logging.INFO),
    ]
    assert "retryable" in lines[0][2] and "retry 1 in 0.0s (overloaded)" in lines[1][2]
    assert not any("secret" in r.getMessage() for r in caplog.records)


async def test_command_spans_can_be_left_out(backend: Backend) -> None:
    telemetry, exporter = _traced()
    telemetry = pico.Telemetry(tracer=telemetry.tracer, commands=False)
    h = await backend.open(provider=FauxProvider(["hi"]), telemetry=telemetry)
    c = await h.root()
    _, result = await c.prompt("hello")
    assert result is not None and result.status == "done"
    await h.close()
    names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["chat default", "pico.task generation"]
