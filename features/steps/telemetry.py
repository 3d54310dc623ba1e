"""Steps for tracing (issue 17): a session opened with ``pico.Telemetry`` over an SDK tracer
provider whose spans go to an in-memory exporter; the Then steps read that trace back and
compare it with what the session stored."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pytest_bdd import given, parsers, then

import pico
from features.steps.library import World, _names
from features.steps.tools import _open

#: Where a scenario's exporter is kept (the world's scratch values).
TRACE = "telemetry: the in-memory exporter"


@given(parsers.parse('a traced agent session with conversation "{name}"'), target_fixture="world")
def a_traced_agent_session(world: World, name: str) -> World:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    world.addresses[TRACE] = exporter
    return _open(world, name, telemetry=pico.Telemetry(tracer=provider.get_tracer("features")))


def _spans(world: World) -> list[ReadableSpan]:
    """The finished spans, once every run of a task has ended (a run's span ends just after
    the settlement a drive returns on)."""

    async def ended() -> None:
        for _ in range(1000):
            if not world.h.scheduler.executing:
                return
            await asyncio.sleep(0)
        raise AssertionError("task runs are still going on")

    world.run(ended())
    exporter: InMemorySpanExporter = world.addresses[TRACE]
    return sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)


def _attrs(span: ReadableSpan | None) -> dict[str, Any]:
    return {} if span is None else dict(span.attributes or {})


def _parent(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    up = span.parent
    return None if up is None else next((s for s in spans if s.context.span_id == up.span_id), None)


def _runs(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith("pico.task ")]


def _requests(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if _attrs(s).get("gen_ai.operation.name") == "chat"]


@then(parsers.parse('the trace has the task runs "{kinds}"'))
def trace_has_runs(world: World, kinds: str) -> None:
    assert [_attrs(s)["pico.task.kind"] for s in _runs(_spans(world))] == _names(kinds)


@then(parsers.parse('every model request in the trace is inside a "{kind}" task run'))
def requests_inside(world: World, kind: str) -> None:
    spans = _spans(world)
    requests = _requests(spans)
    assert requests
    for request in requests:
        assert _attrs(_parent(request, spans)).get("pico.task.kind") == kind


@then(
    parsers.parse(
        'the model requests stopped for "{reasons}" and used the tokens the session recorded'
    )
)
def requests_stopped_and_used(world: World, reasons: str) -> None:
    requests = _requests(_spans(world))
    assert [_attrs(s)["gen_ai.response.finish_reasons"] for s in requests] == [
        (r,) for r in _names(reasons)
    ]
    recorded = 0
    for task in world.run(world.h.tasks(kind="generation")).items:
        state: Any = task.state
        recorded += state["usage"]["input"] + state["usage"]["output"]
    traced = sum(
        _attrs(s)["gen_ai.usage.input_tokens"] + _attrs(s)["gen_ai.usage.output_tokens"]
        for s in requests
    )
    assert traced == recorded > 0


@then(
    parsers.parse(
        'the tool call "{tool}" is inside the "{kind}" task run with the outcome "{outcome}"'
    )
)
def tool_call_inside(world: World, tool: str, kind: str, outcome: str) -> None:
    spans = _spans(world)
    (call,) = [s for s in spans if _attrs(s).get("gen_ai.tool.name") == tool]
    assert _attrs(_parent(call, spans)).get("pico.task.kind") == kind
    assert _attrs(call)["pico.tool.outcome"] == outcome
    failed = call.status.status_code is StatusCode.ERROR
    assert failed == (outcome == "error")


@then("every change the tasks recorded is inside the run of its task")
def changes_inside(world: World) -> None:
    spans = _spans(world)
    changes = [s for s in spans if s.name == "pico.command" and "pico.task.id" in _attrs(s)]
    assert len(changes) >= len(_runs(spans))
    for change in changes:
        run = _parent(change, spans)
        assert _attrs(run).get("pico.task.id") == _attrs(change)["pico.task.id"]


@then(parsers.parse('the first model request in the trace failed as "{kind}"'))
def first_request_failed(world: World, kind: str) -> None:
    first = _requests(_spans(world))[0]
    assert first.status.status_code is StatusCode.ERROR
    assert _attrs(first)["pico.retry.class"] == kind
    assert _attrs(first)["error.type"] == f"pico.{kind}"


@then(parsers.parse('the last model request in the trace stopped for "{reason}"'))
def last_request_stopped(world: World, reason: str) -> None:
    last = _requests(_spans(world))[-1]
    assert last.status.status_code is StatusCode.UNSET
    assert _attrs(last)["gen_ai.response.finish_reasons"] == (reason,)
