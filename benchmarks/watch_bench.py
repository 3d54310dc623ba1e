"""Watch overhead and delivery latency (issue 15): the seed's turn workload (two tools per
turn, one conversation, SQLite) with and without one watcher, interleaved in one process,
and the delay from a durable commit to the listener — in process (the owner's own hub)
and from a read-only handle polling the same database.

    python -m benchmarks.watch_bench                 # 2,000 turns, 3 rounds each way
    python -m benchmarks.watch_bench --turns 200 --rounds 1   # quick

Prints Markdown (also benchmarks/results/watch.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import pico
from benchmarks.turns_bench import SCHEMA, _script
from pico import FauxProvider, ToolContext, WatchEvent
from pico.domain.json import JsonObject


async def _tools() -> list[pico.Tool]:
    async def read(args: JsonObject, ctx: ToolContext) -> str:
        return f"contents of {args['path']}"

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        return f"1 match for {args['path']}"

    return [pico.Tool("read", "Read", SCHEMA, read), pico.Tool("grep", "Grep", SCHEMA, grep)]


async def run(
    folder: Path, turns: int, *, watch: bool, remote: bool
) -> tuple[float, float, list[float], int]:
    """(wall, cpu, latencies in ms, events delivered) of one run on a fresh database."""
    url = f"sqlite:///{folder}/watch-{watch}-{remote}-{time.monotonic_ns()}.db"
    provider = FauxProvider(_script(turns), chunk_chars=16, keep_requests=False)
    h = await pico.Harness.open(url, session="turns", provider=provider, tools=await _tools())
    c = await h.root()
    latencies: list[float] = []
    delivered = 0
    # (last_seq, when the owner made it durable), in commit order: the listener pops the
    # stamps of batches before the one it got, so measuring costs O(1) per event.
    durable_at: deque[tuple[int, float]] = deque()
    watcher: pico.Harness | None = None
    hub = h.watches
    original = hub.durable

    def durable() -> None:  # stamps the batches each durable point makes durable
        now = time.perf_counter()
        for _, last, _, _ in hub._saved:
            durable_at.append((last, now))
        if remote:
            durable_at.append((h.head(), now))
        original()

    def listener(event: WatchEvent) -> None:
        nonlocal delivered
        delivered += 1
        if isinstance(event, pico.WatchCommit):
            # The first durable point that covered this batch.
            while durable_at and durable_at[0][0] < event.last_seq:
                durable_at.popleft()
            if durable_at:
                latencies.append((time.perf_counter() - durable_at[0][1]) * 1000)

    if watch:
        h._line.on_durable = durable
        if remote:
            watcher = await pico.Harness.open(url, session="turns", read_only=True)
            watcher.watches.poll_interval = 0.05
            watcher.watch(c.id, listener)
        else:
            h.watch(c.id, listener)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(turns):
        _, result = await c.prompt(f"question {i}")
        assert result is not None and result.status == "done", result
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if watcher is not None:
        await asyncio.sleep(0.3)  # the last poll
        await watcher.close()
    await h.close()
    return wall, cpu, latencies, delivered


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pico-watch-bench-"))
    runs: dict[str, list[tuple[float, float, list[float], int]]] = {
        "none": [],
        "local": [],
        "remote": [],
    }
    for _ in range(args.rounds):  # interleaved, so load drift hits all three alike
        runs["none"].append(asyncio.run(run(folder, args.turns, watch=False, remote=False)))
        runs["local"].append(asyncio.run(run(folder, args.turns, watch=True, remote=False)))
        runs["remote"].append(asyncio.run(run(folder, args.turns, watch=True, remote=True)))
    base_wall = statistics.median(r[0] for r in runs["none"])
    lines = [
        f"Watch overhead, {args.turns} turns x {args.rounds} rounds (SQLite, two tools/turn)",
        "",
        "| watcher | wall s (median) | vs none | CPU s | events | latency p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in (
        ("none", "none"),
        ("local", "in process (owner's hub)"),
        ("remote", "read-only handle, poll 50 ms"),
    ):
        rs = runs[name]
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        lat: list[Any] = [x for r in rs for x in r[2]]
        events = rs[-1][3]
        lines.append(
            f"| {label} | {wall:.2f} | {wall / base_wall:.2f}x | {cpu:.2f} | {events} | "
            f"{_pct(lat, 0.5):.2f} | {_pct(lat, 0.99):.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    out = Path(__file__).with_name("results")
    out.mkdir(exist_ok=True)
    (out / "watch.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
