"""The seed's reference workload (§10.3; issue: agent turns): N faux turns with two tools
per turn in ONE conversation, durable on SQLite. Reports wall and CPU time, peak RSS,
database bytes, and the cost of the last 100 turns against the first 100.

    python -m benchmarks.turns_bench                  # 2,000 turns
    python -m benchmarks.turns_bench --turns 300      # quick
    python -m benchmarks.turns_bench --series         # also per-100-turn means + WAL size
    python -m benchmarks.turns_bench --memory         # the same on the memory backend (no
                                                      # database, as the seed's spike ran)
    python -m benchmarks.turns_bench --backend jsonl --durability fsync
                                                      # JSONL files (or sqlite), either durability

Prints Markdown (also benchmarks/results/turns.md).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject

BACKENDS = ("sqlite", "jsonl", "memory")

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


def _script(turns: int) -> list[Any]:
    script: list[Any] = []
    for i in range(turns):
        script.append(
            FauxResponse(
                text=f"Turn {i}: let me look.",
                tool_calls=[("read", {"path": f"f{i}.py"}), ("grep", {"path": f"g{i}"})],
            )
        )
        script.append(f"Turn {i}: both files agree; the answer is {i}.")
    return script


async def run(
    url: str,
    turns: int,
    chunk_chars: int,
    wal: Path | None = None,
    durability: str | None = None,
) -> tuple[list[float], float, float]:
    async def read(args: JsonObject, ctx: ToolContext) -> str:
        return f"contents of {args['path']}"

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        return f"1 match for {args['path']}"

    # The provider's request log is test bookkeeping, not harness memory: not kept here.
    provider = FauxProvider(_script(turns), chunk_chars=chunk_chars, keep_requests=False)
    tools = [pico.Tool("read", "Read", SCHEMA, read), pico.Tool("grep", "Grep", SCHEMA, grep)]
    h = await pico.Harness.open(
        url, session="turns", durability=durability, provider=provider, tools=tools
    )
    c = await h.root()
    per_turn: list[float] = []
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(turns):
        t0 = time.perf_counter()
        _, result = await c.prompt(f"question {i}")
        per_turn.append(time.perf_counter() - t0)
        assert result is not None and result.status == "done", result
        if wal is not None and (i + 1) % 100 == 0:
            chunk = statistics.mean(per_turn[-100:]) * 1000
            size = wal.stat().st_size / 2**20 if wal.exists() else 0.0
            print(f"turns {i - 98:>5}-{i + 1:<5} {chunk:6.2f} ms/turn  {wal.name} {size:5.1f} MiB")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert provider.request_count == 2 * turns
    await h.close()
    return per_turn, wall, cpu


def backend_url(backend: str, directory: Path) -> str:
    """The URL of ``backend`` (one of ``BACKENDS``, or "memory": private to the process)
    keeping its files in ``directory``: what each workload CLI opens."""
    return {
        "memory": "memory://",
        "sqlite": f"sqlite:///{directory / 'turns.db'}",
        "jsonl": f"jsonl:///{directory}",
    }[backend]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--chunk-chars", type=int, default=16)
    ap.add_argument("--series", action="store_true", help="print per-100-turn means")
    ap.add_argument("--memory", action="store_true", help="the memory backend, no database")
    ap.add_argument("--backend", choices=BACKENDS, default="sqlite")
    ap.add_argument("--durability", choices=("process", "fsync"), default="process")
    args = ap.parse_args()
    backend = "memory" if args.memory else args.backend
    tmp = Path(tempfile.mkdtemp(prefix="pico-turns-"))
    # --series follows the file that grows: SQLite's WAL, or the JSONL main journal.
    grows = tmp / ("turns.jsonl" if backend == "jsonl" else "turns.db-wal")
    url = backend_url(backend, tmp)
    per_turn, wall, cpu = asyncio.run(
        run(
            url,
            args.turns,
            args.chunk_chars,
            grows if args.series else None,
            None if backend == "memory" else args.durability,
        )
    )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) / 2**20
    first = statistics.mean(per_turn[:100]) * 1000
    last = statistics.mean(per_turn[-100:]) * 1000
    report = "\n".join(
        [
            f"{args.turns:,} faux turns, two tools per turn, one conversation, "
            + {"memory": "memory backend", "sqlite": "SQLite", "jsonl": "JSONL"}[backend]
            + ("" if backend == "memory" else f" ({args.durability} durability)")
            + f", text streamed in {args.chunk_chars}-character frames",
            "",
            "| wall s | CPU s | peak RSS MiB | database + WAL MiB | first 100 turns ms/turn | "
            "last 100 turns ms/turn | last/first |",
            "|---|---|---|---|---|---|---|",
            f"| {wall:.2f} | {cpu:.2f} | {peak_mib:.0f} | {size:.1f} | {first:.2f} | "
            f"{last:.2f} | {last / first:.2f} |",
        ]
    )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    name = (
        "turns.md"
        if (backend, args.durability) == ("sqlite", "process")
        else (
            f"turns-{backend}.md"
            if backend == "memory"
            else f"turns-{backend}-{args.durability}.md"
        )
    )
    (out / name).write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
