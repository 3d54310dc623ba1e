"""Telemetry overhead (issue 17): turns_bench's workload (two tool calls per turn, one
conversation) in ONE process, three variants interleaved run by run so that a loaded
machine slows them alike:

- ``off``: every span replaced by a shared null context (what pico cost before it had spans),
- ``api``: the default ``pico.Telemetry()``, no SDK configured (the API's no-op tracer),
- ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` and an exporter that
  drops everything (the cost of recording, without any I/O),
- ``sdk, commands=False``: the same without the ``pico.command`` spans.

Then the span calls of one turn alone (10 commands, 5 task executions, 2 requests, 2 tool
calls: 19 spans), best of several repeats, which a loaded machine disturbs far less.

    python -m benchmarks.telemetry_bench                       # memory, 200 turns x 5
    python -m benchmarks.telemetry_bench --backend sqlite --turns 200 --runs 3

Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import pico
from benchmarks.turns_bench import SCHEMA, _script
from pico.application.model import Message, Request, Response, TextPart, Usage
from pico.application.tools import ToolOutcome
from pico.domain.json import JsonObject


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Off(pico.Telemetry):
    """No spans at all: the cost of the call sites' checks only."""

    _null: AbstractContextManager[Any] = contextlib.nullcontext(trace.INVALID_SPAN)

    def command(self, *args: Any) -> AbstractContextManager[Any]:
        return self._null

    def task(self, *args: Any) -> AbstractContextManager[Any]:
        return self._null

    def request(self, *args: Any) -> AbstractContextManager[Any]:
        return self._null

    def tool(self, *args: Any) -> AbstractContextManager[Any]:
        return self._null


def _variants() -> dict[str, Callable[[], pico.Telemetry]]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    return {
        "off": _Off,
        "api": pico.Telemetry,
        "sdk": lambda: pico.Telemetry(tracer=provider.get_tracer("bench")),
        "sdk, commands=False": lambda: pico.Telemetry(
            tracer=provider.get_tracer("bench"), commands=False
        ),
    }


async def _turns(url: str, turns: int, telemetry: pico.Telemetry) -> float:
    """CPU ms per turn."""

    async def read(args: JsonObject, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    async def grep(args: JsonObject, ctx: pico.ToolContext) -> str:
        return f"1 match for {args['path']}"

    provider = pico.FauxProvider(_script(turns), chunk_chars=16, keep_requests=False)
    tools = [pico.Tool("read", "Read", SCHEMA, read), pico.Tool("grep", "Grep", SCHEMA, grep)]
    h = await pico.Harness.open(
        url, session="turns", provider=provider, tools=tools, telemetry=telemetry
    )
    c = await h.root()
    cpu = time.process_time()
    for i in range(turns):
        _, result = await c.prompt(f"question {i}")
        assert result is not None and result.status == "done", result
    cpu = time.process_time() - cpu
    await h.close()
    return cpu / turns * 1000


class _Batch:
    first, last, working, task = 5, 9, None, 3
    touched: dict[int, None] = {1: None}


class _Task:
    id, kind, status, conversation_id = 3, "generation", "pending", 1


def _span_calls(telemetry: pico.Telemetry) -> Callable[[], None]:
    """The span calls of one turn, with the attributes the call sites give them."""
    task: Any = _Task  # what a task span reads of a TaskSnapshot
    request = Request(model="m", messages=())
    response = Response(Message("assistant", (TextPart("x"),)), "end_turn", Usage(10, 2))
    outcome = ToolOutcome(text="x")
    model = pico.FauxProvider([])

    def turn() -> None:
        for _ in range(10):
            with telemetry.command("s") as span:
                if span.is_recording():
                    telemetry.committed(span, _Batch, 4)
        for _ in range(5):
            with telemetry.task(task, "execute") as span:
                if span.is_recording():
                    telemetry.ended(span, "done", None)
        for _ in range(2):
            with telemetry.request(model, request) as span:
                telemetry.responded(span, response)
            with telemetry.tool("read", "call_1") as span:
                telemetry.tool_outcome(span, outcome, interrupted=False)

    return turn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("memory", "sqlite"), default="memory")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    variants = _variants()
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for run in range(args.runs):
        for name, make in variants.items():
            tmp = Path(tempfile.mkdtemp(prefix="pico-telemetry-"))
            url = (
                f"memory://telemetry-{run}-{name}"
                if args.backend == "memory"
                else f"sqlite:///{tmp / 'turns.db'}"
            )
            cpu[name].append(asyncio.run(_turns(url, args.turns, make())))
    base_min, base_median = min(cpu["off"]), statistics.median(cpu["off"])
    lines = [
        f"{args.turns} turns x {args.runs} runs per variant, {args.backend}, interleaved",
        "",
        "| variant | CPU ms/turn, best run | median run | vs off (best) | vs off (median) |",
        "|---|---|---|---|---|",
    ]
    for name, values in cpu.items():
        best, median = min(values), statistics.median(values)
        lines.append(
            f"| {name} | {best:.2f} | {median:.2f} | {100 * (best / base_min - 1):+.1f}% | "
            f"{100 * (median / base_median - 1):+.1f}% |"
        )
    lines += ["", "| span calls of one turn (19 spans) | us, best of 7 |", "|---|---|"]
    for name in ("api", "sdk"):
        turn = _span_calls(variants[name]())
        number = 2000 if name == "api" else 200
        best = min(timeit.repeat(turn, number=number, repeat=7)) / number * 1e6
        lines.append(f"| {name} | {best:.0f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
