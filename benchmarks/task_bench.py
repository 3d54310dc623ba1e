"""Reopen with a long task history (issue: tasks and scheduler).

A session holds N terminal tasks and 2 live ones. Opening validates every LIVE task against
its definition before anything runs; it must read only the live rows (partial index), so the
reopen time and the rows read must not grow when terminal history grows 10x.

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
from tests.taskdefs import definitions

BATCH = 2000


class CountingRegistry(TaskRegistry):
    """Counts the task rows the open-time validation reads."""

    rows_read = 0

    def validate_live(self, tasks: Iterable[TaskSnapshot]) -> None:
        seen = list(tasks)
        CountingRegistry.rows_read += len(seen)
        super().validate_live(seen)


def _batch(conversation_id: int, count: int) -> Callable[[pico.Command], None]:
    def build(tx: pico.Command) -> None:
        for _ in range(count):
            tx.create_task(conversation_id, "note", state=None, status="exited")

    return build


async def build(url: str, session: str, terminal: int) -> None:
    h = await pico.Harness.open(url, session=session, definitions=definitions())
    c = await h.root()
    done = 0
    while done < terminal:
        count = min(BATCH, terminal - done)
        await h.command(_batch(c.id, count))
        done += count
    for _ in range(2):
        await h.command(lambda tx: tx.create_task(c.id, "job", state={"command": "run"}))
    await h.close()


async def reopen(url: str, session: str, runs: int = 5) -> tuple[float, int]:
    samples = []
    for _ in range(runs):
        CountingRegistry.rows_read = 0
        registry = CountingRegistry(definitions())
        t0 = time.perf_counter()
        h = await pico.Harness.open(url, session=session, definitions=registry)
        live = await h.tasks(live=True, limit=100)
        samples.append((time.perf_counter() - t0) * 1000)
        assert len(live.items) == 2
        await h.close()
    return statistics.median(samples), CountingRegistry.rows_read


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--terminal", type=int, default=100_000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pico-tasks-"))
    urls = {"sqlite": f"sqlite:///{tmp / 'tasks.db'}"}
    if os.environ.get("PICO_TEST_POSTGRES_URL"):
        urls["postgresql"] = os.environ["PICO_TEST_POSTGRES_URL"]
    lines = [
        "Reopen (claim + live-task validation) and list live tasks; 2 live tasks",
        "",
        "| backend | terminal tasks | reopen ms (median of 5) | task rows read |",
        "|---|---|---|---|",
    ]
    for name in args.backends.split(","):
        if name not in urls:
            continue
        for n in (args.terminal, args.terminal * 10):
            session = f"tasks-{n}-{time.time_ns()}"
            t0 = time.perf_counter()
            asyncio.run(build(urls[name], session, n))
            built = time.perf_counter() - t0
            ms, rows = asyncio.run(reopen(urls[name], session))
            lines.append(f"| {name} | {n:,} | {ms:.1f} | {rows} |")
            print(f"{name} {n}: built in {built:.0f}s", flush=True)
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "tasks.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
