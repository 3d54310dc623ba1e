"""Long task histories and scheduler overhead (issue: tasks and scheduler).

1. A session holds N terminal tasks and 2 live (waiting) ones. Opening validates every LIVE
   task before anything runs and the first drive pass re-arms the live ones; both must read
   only live rows (partial index), so neither may grow when terminal history grows 10x.
2. Scheduler overhead per trivial task: created in one command, executed and settled in one
   command under a session drive.

    python -m benchmarks.task_bench                       # N = 100,000 and 1,000,000
    python -m benchmarks.task_bench --terminal 20000      # quick

Prints Markdown (also benchmarks/results/tasks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pico
from pico.application.tasks import TaskRegistry
from pico.domain.values import TaskSnapshot
from tests.scheddefs import Scripted
from tests.taskdefs import definitions

BATCH = 2000


class CountingRegistry(TaskRegistry):
    """Counts the task rows the open-time validation reads."""

    rows_read = 0

    def validate_live(self, tasks: Iterable[TaskSnapshot]) -> None:
        seen = list(tasks)
        CountingRegistry.rows_read += len(seen)
        super().validate_live(seen)


def _waiting_scripted() -> Scripted:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)  # re-arm: stays waiting
    return work


def _batch(conversation_id: int, count: int) -> Callable[[pico.Command], None]:
    def build(tx: pico.Command) -> None:
        for _ in range(count):
            tx.create_task(conversation_id, "note", state=None, status="exited")

    return build


async def build(url: str, session: str, terminal: int) -> None:
    registry = [*definitions(), _waiting_scripted()]
    h = await pico.Harness.open(url, session=session, definitions=registry)
    c = await h.root()
    done = 0
    while done < terminal:
        count = min(BATCH, terminal - done)
        await h.command(_batch(c.id, count))
        done += count
    for _ in range(2):
        await h.command(lambda tx: tx.create_task(c.id, "work", status="waiting"))
    await h.close()


async def reopen(url: str, session: str, runs: int = 5) -> tuple[float, int, float]:
    """Median reopen ms, task rows the open read, median ms of the first drive pass."""
    samples, passes = [], []
    rows = 0
    for _ in range(runs):
        CountingRegistry.rows_read = 0
        work = _waiting_scripted()
        registry = CountingRegistry([*definitions(), work])
        t0 = time.perf_counter()
        h = await pico.Harness.open(url, session=session, definitions=registry)
        samples.append((time.perf_counter() - t0) * 1000)
        rows = CountingRegistry.rows_read
        t0 = time.perf_counter()
        assert await h.drive() == "suspended"
        passes.append((time.perf_counter() - t0) * 1000)
        assert len(work.calls) == 2 and {c[0] for c in work.calls} == {"recover"}
        await h.close()
    return statistics.median(samples), rows, statistics.median(passes)


async def overhead(url: str, n: int) -> tuple[float, float]:
    """Returns (creates/s, executions/s) for n trivial tasks."""
    work = Scripted()
    h = await pico.Harness.open(url, session=f"overhead-{time.time_ns()}", definitions=[work])
    c = await h.root()
    t0 = time.perf_counter()
    for _ in range(n):
        await h.command(lambda tx: tx.create_task(c.id, "work"))
    created = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert await h.drive() == "idle"
    driven = time.perf_counter() - t0
    assert len(work.calls) == n
    await h.close()
    return n / created, n / driven


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--terminal", type=int, default=100_000)
    ap.add_argument("--trivial", type=int, default=2000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pico-tasks-"))
    urls = {"memory": "memory://", "sqlite": f"sqlite:///{tmp / 'tasks.db'}"}
    if os.environ.get("PICO_TEST_POSTGRES_URL"):
        urls["postgresql"] = os.environ["PICO_TEST_POSTGRES_URL"]
    wanted = [b for b in args.backends.split(",") if b in urls]
    lines = [
        "Reopen (claim + live-task validation) and the first drive pass; 2 live tasks",
        "",
        "| backend | terminal tasks | reopen ms | task rows read by open | first drive pass ms |",
        "|---|---|---|---|---|",
    ]
    for name in wanted:
        if name == "memory":
            continue
        for n in (args.terminal, args.terminal * 10):
            session = f"tasks-{n}-{time.time_ns()}"
            t0 = time.perf_counter()
            asyncio.run(build(urls[name], session, n))
            print(f"{name} {n}: built in {time.perf_counter() - t0:.0f}s", flush=True)
            ms, rows, first = asyncio.run(reopen(urls[name], session))
            lines.append(f"| {name} | {n:,} | {ms:.1f} | {rows} | {first:.1f} |")
    lines += [
        "",
        "Scheduler overhead per trivial task (create in one command; execute and "
        "settle in one command under a session drive):",
        "",
        "| backend | tasks | creates/s | executions/s |",
        "|---|---|---|---|",
    ]
    for name in ("memory", *wanted):
        creates, executions = asyncio.run(overhead(urls[name], args.trivial))
        lines.append(f"| {name} | {args.trivial:,} | {creates:,.0f} | {executions:,.0f} |")
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "tasks.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
