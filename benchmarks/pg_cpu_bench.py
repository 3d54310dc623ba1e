"""CPU per PostgreSQL command, client and server apart (issue 16): one session's
``conversation.append`` loop, faux agent turns with one tool call, and the session's
``meta`` read in a snapshot of its own and inside one open snapshot, each reporting the
client process's CPU (``time.process_time``), the CPU of the server backend serving it
(``/proc/<pid>/stat`` of the connections the session is lent: the server must run on
this machine) and wall time, per operation.

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        python -m benchmarks.pg_cpu_bench                # --appends 2000 --turns 40 --reads 3000

On a noisy machine compare trees by running this alternately from each (the numbers of
one run drift 30-40% with the machine); a command's wall time is about its client CPU
plus its server CPU, serially.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject

SCHEMA: JsonObject = {"type": "object", "properties": {}}


def backend_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (a PostgreSQL backend)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pid(conn: Any) -> int:
    pid: int = conn.info.backend_pid
    return pid


async def _measure(
    label: str, count: int, pids: set[int], step: Callable[[], Awaitable[Any]]
) -> str:
    c0, b0, t0 = time.process_time(), sum(map(backend_cpu, pids)), time.perf_counter()
    for _ in range(count):
        await step()
    c1, b1, t1 = time.process_time(), sum(map(backend_cpu, pids)), time.perf_counter()
    ms = 1000 / count
    cells = (f"{(c1 - c0) * ms:.3f}", f"{(b1 - b0) * ms:.3f}", f"{(t1 - t0) * ms:.3f}")
    return f"| {label} | {count} | " + " | ".join(cells) + " |"


async def main(url: str, appends: int, turns: int, reads: int) -> None:
    async def noop(args: JsonObject, ctx: ToolContext) -> str:
        return "ok"

    script: list[str | FauxResponse] = [FauxResponse(tool_calls=[("noop", {})]), "done"]
    h = await pico.Harness.open(
        url,
        session=f"cpu-{uuid.uuid4().hex[:8]}",
        provider=FauxProvider(script * (turns + 2), keep_requests=False),
        tools=[pico.Tool("noop", "does nothing", SCHEMA, noop)],
    )
    try:
        c = await h.root()
        await c.prompt("warm up")
        for _ in range(50):
            await c.append("user", "warm up")
        storage: Any = h._line.storage  # the writer's and reader's connections
        writer = _pid(storage.recorder.writer.connection())
        reads_store = storage._read_store
        with reads_store.read():
            reads_store.meta()
            reader = _pid(reads_store._local.conn)
        # The session's writes and reads are lent these connections in turn (most
        # recently used first): every row counts the CPU of both backends.
        backends = {writer, reader}

        async def append() -> None:
            await c.append("user", "x" * 120)

        async def turn() -> None:
            await c.prompt("q")

        async def own_snapshot() -> None:
            with reads_store.read():
                reads_store.meta()

        rows = [
            "| operation | count | client CPU ms | server CPU ms | wall ms |",
            "|---|---|---|---|---|",
            await _measure("append", appends, backends, append),
            await _measure("faux turn, one tool call (writer's backend)", turns, backends, turn),
            await _measure("read opening its snapshot (meta)", reads, backends, own_snapshot),
        ]
        with reads_store.read():

            async def in_snapshot() -> None:
                reads_store.meta()

            rows.append(
                await _measure("read inside an open snapshot", reads, backends, in_snapshot)
            )
        print("\n".join(rows))
    finally:
        await h.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("PICO_TEST_POSTGRES_URL"))
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--reads", type=int, default=3000)
    args = ap.parse_args()
    if not args.url:
        ap.error("set PICO_TEST_POSTGRES_URL or pass --url")
    asyncio.run(main(args.url, args.appends, args.turns, args.reads))
