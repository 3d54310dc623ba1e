"""PostgreSQL round trips per command (issue 16): single-session commands/s for
``conversation.append`` and for a command with several mutations, faux agent turns/s on
one session (group commit of deferred settlements), the statements, round
trips and COMMITs of one command and of one faux agent turn (counted from libpq's protocol
trace on every connection pico opens: a round trip is one ``ReadyForQuery`` the client
waited for), and aggregate commands/s for 1, 2, 4 processes on their own sessions with the
machine's CPU utilisation over the run.

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        python -m benchmarks.pg_commands_bench            # --commands 2000 --seconds 10

Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject

TEXT = "x" * 120
SCHEMA: JsonObject = {"type": "object", "properties": {"path": {"type": "string"}}}
NOTES: pico.ConversationValue[int] = pico.ConversationValue(namespace="bench", type_=int, key="n")


class ProtocolTrace:
    """libpq's protocol trace of every connection opened while installed, one file each."""

    def __init__(self) -> None:
        self.files: list[Any] = []
        self.on = False

    def install(self) -> None:
        sa_event.listen(sa.pool.Pool, "connect", self._connect)

    def _connect(self, dbapi_conn: Any, _rec: Any) -> None:
        import psycopg

        f = tempfile.TemporaryFile()  # noqa: SIM115 (open while the connection is)
        self.files.append((f, dbapi_conn))
        dbapi_conn.pgconn.trace(f.fileno())
        dbapi_conn.pgconn.set_trace_flags(
            psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE
        )

    def mark(self) -> None:
        for f, _ in self.files:
            f.seek(0, 2)
        self._offsets = {id(f): f.tell() for f, _ in self.files}

    def counts(self) -> Counter[str]:
        """Statements (CommandComplete: a simple-query string of ten counts ten), round
        trips (ReadyForQuery) and COMMITs since ``mark``."""
        out: Counter[str] = Counter()
        for f, _ in self.files:
            f.seek(self._offsets.get(id(f), 0))
            for line in f.read().decode(errors="replace").splitlines():
                parts = line.split("\t")
                if len(parts) < 3:
                    continue
                who, kind = parts[0], parts[2]
                detail = parts[3] if len(parts) > 3 else ""
                if who == "B" and kind == "CommandComplete":
                    out["statements"] += 1  # one per statement, however they travelled
                if who == "B" and kind == "CommandComplete" and '"COMMIT"' in detail:
                    out["commits"] += 1
                if who == "B" and kind == "ReadyForQuery":
                    out["round trips"] += 1
        return out


async def append_loop(url: str, n: int) -> float:
    h = await pico.Harness.open(url, session=f"bench-a-{time.time_ns()}")
    c = await h.root()
    await c.append("user", "warm up")
    start = time.perf_counter()
    for i in range(n):
        await c.append("user", f"{i} {TEXT}")
    rate = n / (time.perf_counter() - start)
    await h.close()
    return rate


async def multi_loop(url: str, n: int) -> float:
    """A command of three entries selected into context and a conversation value."""
    h = await pico.Harness.open(url, session=f"bench-m-{time.time_ns()}")
    c = await h.root()
    await c.command(lambda tx: _multi(tx, -1))
    start = time.perf_counter()
    for i in range(n):
        await c.command(functools.partial(_multi, i=i))
    rate = n / (time.perf_counter() - start)
    await h.close()
    return rate


def _turn_harness_args(turns: int) -> dict[str, Any]:
    """A faux provider answering ``turns`` (+1 warm-up) turns of two tool calls each."""

    async def read(args: JsonObject, ctx: ToolContext) -> str:
        return f"contents of {args['path']}"

    script: list[Any] = []
    for i in range(turns + 1):
        script.append(FauxResponse(text="look", tool_calls=[("read", {"path": f"f{i}"})] * 2))
        script.append(f"answer {i}")
    provider = FauxProvider(script, keep_requests=False)
    return {"provider": provider, "tools": [pico.Tool("read", "Read", SCHEMA, read)]}


async def turn_loop(url: str, n: int) -> float:
    """Faux agent turns/s on one session (two tool calls, the join, a final answer)."""
    h = await pico.Harness.open(url, session=f"bench-t-{time.time_ns()}", **_turn_harness_args(n))
    c = await h.root()
    await c.prompt("warm up")
    start = time.perf_counter()
    for i in range(n):
        _, result = await c.prompt(f"question {i}")
        assert result is not None and result.status == "done", result
    rate = n / (time.perf_counter() - start)
    await h.close()
    return rate


def _multi(tx: Any, i: int) -> None:
    ids = [tx.append_entry("user", f"{i}.{k} {TEXT}") for k in range(3)]
    tx.append_context(ids)
    tx.set_value(NOTES, i)


async def counted(url: str, trace: ProtocolTrace, turns: int) -> dict[str, Counter[str]]:
    """Protocol counts per ``append``, per multi-mutation command and per agent turn."""
    h = await pico.Harness.open(
        url, session=f"bench-c-{time.time_ns()}", **_turn_harness_args(turns)
    )
    c = await h.root()
    out: dict[str, Counter[str]] = {}
    await c.append("user", "warm up")
    trace.mark()
    for i in range(100):
        await c.append("user", f"{i} {TEXT}")
    out["append"] = Counter({k: v // 100 for k, v in trace.counts().items()})
    await c.command(lambda tx: _multi(tx, -1))
    trace.mark()
    for i in range(100):
        await c.command(functools.partial(_multi, i=i))
    out["multi"] = Counter({k: v // 100 for k, v in trace.counts().items()})
    await c.prompt("warm up")
    trace.mark()
    for i in range(turns):
        _, result = await c.prompt(f"question {i}")
        assert result is not None and result.status == "done", result
    out["turn"] = Counter({k: v // turns for k, v in trace.counts().items()})
    await h.close()
    return out


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies over all cores, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


CHILD = """
import asyncio, sys, time
import pico

async def main(url, seconds):
    h = await pico.Harness.open(url, session=f"bench-p-{time.time_ns()}")
    c = await h.root()
    await c.append("user", "warm up")
    print("ready", flush=True)
    sys.stdin.readline()
    n, end = 0, time.perf_counter() + seconds
    cpu0 = time.process_time()
    while time.perf_counter() < end:
        await c.append("user", f"{n} " + "x" * 120)
        n += 1
    print(n, time.process_time() - cpu0, flush=True)
    await h.close()

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def aggregate(url: str, procs: int, seconds: float) -> tuple[float, float, float]:
    """Commands/s over ``procs`` processes started together, the machine's CPU utilisation
    (all cores) and the clients' share of one core each."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env=env,
        )
        for _ in range(procs)
    ]
    for child in children:  # a barrier: every child opened its session
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    busy0, total0 = _cpu()
    start = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = []
    for child in children:
        assert child.stdout is not None
        n, cpu = child.stdout.readline().split()
        results.append((int(n), float(cpu)))
    wall = time.perf_counter() - start
    busy1, total1 = _cpu()
    for child in children:
        child.wait()
    commands = sum(n for n, _ in results)
    client_cpu = statistics.mean(cpu for _, cpu in results) / seconds
    return commands / wall, (busy1 - busy0) / max(total1 - total0, 1), client_cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--runs", type=int, default=3, help="single-session runs (median)")
    args = ap.parse_args()
    url = os.environ.get("PICO_TEST_POSTGRES_URL")
    if not url:
        sys.exit("set PICO_TEST_POSTGRES_URL to a PostgreSQL database pico may write")
    append = statistics.median(
        asyncio.run(append_loop(url, args.commands)) for _ in range(args.runs)
    )
    multi = statistics.median(
        asyncio.run(multi_loop(url, args.commands // 2)) for _ in range(args.runs)
    )
    turns = statistics.median(
        asyncio.run(turn_loop(url, args.turns * 10)) for _ in range(args.runs)
    )
    trace = ProtocolTrace()
    trace.install()
    counts = asyncio.run(counted(url, trace, args.turns))
    print("| single session | commands/s |\n|---|---|")
    print(f"| `append` | {append:,.0f} |")
    print(f"| 3 entries + context + value | {multi:,.0f} |")
    print(f"| agent turn (turns/s) | {turns:,.1f} |")
    print("\n| per | statements | round trips | COMMITs |\n|---|---|---|---|")
    for name, c in counts.items():
        print(f"| {name} | {c['statements']} | {c['round trips']} | {c['commits']} |")
    print("\n| processes | aggregate commands/s | machine CPU | client CPU per process |")
    print("|---|---|---|---|")
    for procs in (int(p) for p in args.procs.split(",") if p):
        rate, machine, client = aggregate(url, procs, args.seconds)
        print(f"| {procs} | {rate:,.0f} | {machine:.0%} | {client:.0%} |")


if __name__ == "__main__":
    main()
