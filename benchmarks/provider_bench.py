"""The provider adapters' cost per turn (issue 17): N turns of the seed's workload shape
(alternating a text turn and a tool turn: the model calls ``read``, the tool runs, the
model answers) through ``conversation.prompt`` on SQLite, with the faux provider, then
with each real adapter talking HTTP to the loopback stub server (tests/stub_http.py)
replaying recorded wire responses (tests/openai_wire.py, tests/anthropic_wire.py).

The difference to the faux run is the adapter's overhead per turn: the SDK building and
sending the request, parsing the server-sent events, the adapter's mapping both ways, and
the stub server's own work (it runs in the same process and event loop, so its CPU is
counted too: an upper bound for the adapter).

    python -m benchmarks.provider_bench          # 200 turns: faux, openai, anthropic
    python -m benchmarks.provider_bench --turns 2000 --provider faux,openai

Prints Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pico
from tests.stub_http import Reply, StubServer

READ_SCHEMA: pico.JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@dataclass
class Run:
    provider: str
    turns: int
    requests: int
    wall_ms: list[float]
    cpu_s: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.wall_ms)

    def tenth(self, last: bool) -> float:
        """The mean of the first (or last) tenth of the turns: the growth with context."""
        n = max(1, len(self.wall_ms) // 10)
        return statistics.fmean(self.wall_ms[-n:] if last else self.wall_ms[:n])

    def pct(self, q: float) -> float:
        ordered = sorted(self.wall_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _tool() -> pico.Tool:
    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    return pico.Tool("read", "read a file", READ_SCHEMA, read, replay="safe")


def _faux(turns: int) -> pico.FauxProvider:
    script: list[Any] = []
    for turn in range(turns):
        if turn % 2 == 0:
            script.append(f"answer {turn}: the parser is fine")
        else:
            script.append(pico.FauxResponse(tool_calls=[("read", {"path": f"file{turn}.py"})]))
            script.append(f"answer {turn}: read file{turn}.py")
    return pico.FauxProvider(script, keep_requests=False)


def _wire(name: str) -> tuple[Callable[[str], pico.ModelProvider], Callable[[int], list[Reply]]]:
    module = importlib.import_module(f"tests.{name}_wire")
    return module.make_provider, module.turn_replies


def available(name: str) -> bool:
    if name == "faux":
        return True
    try:
        _wire(name)
    except (ImportError, pico.ConfigurationError) as exc:  # its SDK is not installed
        print(f"(skipped {name}: {exc})")
        return False
    return True


async def run(name: str, turns: int, directory: Path) -> Run:
    async with StubServer() as stub:
        if name == "faux":
            provider: pico.ModelProvider = _faux(turns)
        else:
            make, replies = _wire(name)
            provider = make(stub.url)
            for turn in range(turns):
                stub.script(*replies(turn))
        h = await pico.Harness.open(
            f"sqlite:///{directory / f'{name}.db'}",
            provider=provider,
            model="bench-model",
            tools=[_tool()],
        )
        c = await h.root()
        wall: list[float] = []
        cpu = time.process_time()
        for turn in range(turns):
            start = time.perf_counter()
            _, result = await c.prompt(f"question {turn}")
            wall.append((time.perf_counter() - start) * 1000)
            if result is None or result.status != "done":
                raise RuntimeError(f"{name} turn {turn} did not finish: {result}")
        cpu = time.process_time() - cpu
        await h.close()
        closer = getattr(provider, "aclose", None)
        if closer is not None:
            await closer()  # the SDK's keep-alive connections, before the stub stops
        if name != "faux" and stub.pending:
            raise RuntimeError(f"{name}: {stub.pending} scripted replies were not used")
        return Run(name, turns, len(stub.requests), wall, cpu)


def report(runs: list[Run]) -> str:
    base = next((r for r in runs if r.provider == "faux"), None)
    lines = [
        "| provider | turns | HTTP requests | ms/turn mean | p50 | p99 | first/last tenth "
        "| CPU ms/turn | overhead vs faux ms/turn |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        over = "" if base is None or r is base else f"{r.mean - base.mean:+.2f}"
        lines.append(
            f"| {r.provider} | {r.turns} | {r.requests} | {r.mean:.2f} | {r.pct(0.5):.2f} "
            f"| {r.pct(0.99):.2f} | {r.tenth(False):.1f} / {r.tenth(True):.1f} "
            f"| {r.cpu_s * 1000 / r.turns:.2f} | {over} |"
        )
    return "\n".join(lines)


async def main(turns: int, providers: list[str]) -> None:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in providers:
            if not available(name):
                continue
            runs.append(await run(name, turns, Path(tmp)))
    print(report(runs))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--provider", default="faux,openai,anthropic")
    args = parser.parse_args()
    asyncio.run(main(args.turns, [p.strip() for p in args.provider.split(",") if p.strip()]))
