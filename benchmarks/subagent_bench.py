"""Many completed child conversations, few live tasks (seed 003 §10.3; issue 11).

A session's root conversation spawns N subagents, each of which completes (one faux answer,
driven to idle through the public API, in batches), plus 3 live subagents whose child
generation is parked on a deferred provider response (status ``deferred``, which needs the
``deferred-poll`` permit, so a drive without it leaves them alone): 6 live task rows, the 3
owners S (``waiting``) and their 3 generations. Then close, reopen and run the first drive
pass, which recovers the 3 waiting owners and suspends. Reopen time, first-pass time and the
rows both read must not grow when completed children grow 10x.

    python -m benchmarks.subagent_bench                        # N = 1,000 and 10,000
    python -m benchmarks.subagent_bench --children 200 --backends sqlite   # quick

Prints Markdown (also benchmarks/results/subagents.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pico
from benchmarks.task_bench import CountingRegistry
from pico.infrastructure.sql.store import SqlReadStore, SqlRecorder

BATCH = 100  # spawns per drive while building
LIVE = 3  # live subagents left parked on a deferred answer
RUNS = 11  # reopens per size (median)

_TABLE = re.compile(r"\bFROM\s+(pico_\w+)", re.IGNORECASE)


class RowCounter:
    """Rows the SQL storage returns to pico, by table: the read model's queries
    (``SqlReadStore._rows``) and the aggregate loads (``SqlRecorder.select_events`` on the
    events and snapshots tables). Instrumentation only: the methods are wrapped, not
    changed."""

    def __init__(self) -> None:
        self.rows: Counter[str] = Counter()
        self.queries = 0

    @contextmanager
    def installed(self) -> Iterator[None]:
        rows_method = SqlReadStore._rows
        events_method = SqlRecorder.select_events
        counter = self

        def rows(store: SqlReadStore, statement: str, params: Sequence[Any]) -> list[Any]:
            out = rows_method(store, statement, params)
            match = _TABLE.search(statement)
            counter.rows[match.group(1) if match else "other"] += len(out)
            counter.queries += 1
            return out

        def select_events(recorder: SqlRecorder, *args: Any, **kwargs: Any) -> Any:
            out = events_method(recorder, *args, **kwargs)
            counter.rows[recorder.table.name] += len(out)
            counter.queries += 1
            return out

        SqlReadStore._rows = rows  # type: ignore[method-assign, assignment]
        SqlRecorder.select_events = select_events  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            SqlReadStore._rows = rows_method  # type: ignore[method-assign]
            SqlRecorder.select_events = events_method  # type: ignore[method-assign]

    def take(self) -> tuple[Counter[str], int]:
        rows, queries = self.rows, self.queries
        self.rows, self.queries = Counter(), 0
        return rows, queries


async def build(url: str, session: str, children: int) -> float:
    """The session: N completed subagents and LIVE parked ones. Returns seconds taken."""
    script: list[Any] = ["done." for _ in range(children)]
    script += [pico.FauxDeferred(polls=1, then="late") for _ in range(LIVE)]
    provider = pico.FauxProvider(script, keep_requests=False)
    t0 = time.perf_counter()
    h = await pico.Harness.open(url, session=session, provider=provider)
    c = await h.root()
    done = 0
    while done < children:
        count = min(BATCH, children - done)
        for k in range(count):
            await c.spawn(f"child {done + k}: inspect one file")
        assert await h.drive() == "idle"
        done += count
    live = [await c.spawn(f"live child {k}") for k in range(LIVE)]
    assert await h.drive() == "suspended"  # the children's generations wait for a permit
    assert provider.request_count == children + LIVE
    for s in live:
        owner = await h.task(s)
        assert owner is not None and owner.status == "waiting"
    seconds = time.perf_counter() - t0
    await h.close()
    return seconds


def _live_count(inspected: dict[str, list[pico.TaskSnapshot]]) -> int:
    return sum(len(tasks) for tasks in inspected.values())


async def reopen(url: str, session: str, counter: RowCounter) -> dict[str, Any]:
    """One reopen and its first drive pass: ms of each, and the rows each read."""
    CountingRegistry.rows_read = 0
    provider = pico.FauxProvider([], keep_requests=False)  # nothing may be asked
    counter.take()
    t0 = time.perf_counter()
    h = await pico.Harness.open(
        url, session=session, provider=provider, definitions=CountingRegistry()
    )
    open_ms = (time.perf_counter() - t0) * 1000
    open_rows, open_queries = counter.take()
    validated = CountingRegistry.rows_read
    t0 = time.perf_counter()
    assert await h.drive() == "suspended"
    pass_ms = (time.perf_counter() - t0) * 1000
    pass_rows, pass_queries = counter.take()
    assert provider.request_count == 0
    assert _live_count(await h.inspect()) == 2 * LIVE
    await h.close()
    return {
        "open_ms": open_ms,
        "pass_ms": pass_ms,
        "validated": validated,
        "open_rows": open_rows,
        "open_queries": open_queries,
        "pass_rows": pass_rows,
        "pass_queries": pass_queries,
    }


def measure(
    targets: Sequence[tuple[str, str]], counter: RowCounter, runs: int
) -> list[dict[str, Any]]:
    """Reopen every (url, session) ``runs`` times, interleaved round by round so that the
    machine's drift hits every size alike; medians of the times, rows of the last round."""
    samples: list[list[dict[str, Any]]] = [[] for _ in targets]
    with counter.installed():
        for _ in range(runs):
            for k, (url, session) in enumerate(targets):
                samples[k].append(asyncio.run(reopen(url, session, counter)))
    out = []
    for runs_of in samples:
        last = dict(runs_of[-1])
        last["open_ms"] = statistics.median(r["open_ms"] for r in runs_of)
        last["pass_ms"] = statistics.median(r["pass_ms"] for r in runs_of)
        out.append(last)
    return out


def _rows(rows: Counter[str]) -> str:
    total = sum(rows.values())
    parts = ", ".join(f"{name.removeprefix('pico_')} {n}" for name, n in sorted(rows.items()))
    return f"{total} ({parts})" if parts else "0"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--runs", type=int, default=RUNS, help="reopens per size (median)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pico-subagents-"))
    urls = {"sqlite": "sqlite:///"}  # one file per size, below
    if os.environ.get("PICO_TEST_POSTGRES_URL"):
        urls["postgresql"] = os.environ["PICO_TEST_POSTGRES_URL"]
    wanted = [b for b in args.backends.split(",") if b in urls]
    counter = RowCounter()
    lines = [
        f"N completed subagents + {LIVE} live ones (owner waiting, child generation deferred:"
        f" {2 * LIVE} live task rows); reopen and the first drive pass, median of {args.runs}"
        " interleaved rounds",
        "",
        "| backend | completed children | build s | reopen ms | task rows validated by open "
        "| rows read by open | first drive pass ms | rows read by first pass |",
        "|---|---|---|---|---|---|---|---|",
    ]
    measured: dict[tuple[str, int], dict[str, Any]] = {}
    for name in wanted:
        targets, built = [], []
        for n in args.children:
            url = urls[name]
            if name == "sqlite":  # one file per size: each reopen sees only its own data
                url = f"sqlite:///{tmp / f'subagents-{n}.db'}"
            session = f"subagents-{n}-{time.time_ns()}"
            built.append(asyncio.run(build(url, session, n)))
            size = ""
            if name == "sqlite":
                files = tmp.glob(f"subagents-{n}.db*")
                size = f", {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB on disk"
            print(f"{name} {n}: built in {built[-1]:.1f}s{size}", flush=True)
            targets.append((url, session))
        results = measure(targets, counter, args.runs)
        for n, seconds, r in zip(args.children, built, results, strict=True):
            measured[(name, n)] = r
            lines.append(
                f"| {name} | {n:,} | {seconds:.1f} | {r['open_ms']:.1f} | {r['validated']} "
                f"| {_rows(r['open_rows'])} | {r['pass_ms']:.1f} | {_rows(r['pass_rows'])} |"
            )
            print(lines[-1], flush=True)
    if len(args.children) > 1:
        lo, hi = min(args.children), max(args.children)
        lines += ["", f"Ratio {hi:,} / {lo:,}:", ""]
        for name in wanted:
            a, b = measured[(name, lo)], measured[(name, hi)]
            lines.append(
                f"- {name}: reopen {b['open_ms'] / a['open_ms']:.2f}x, first drive pass "
                f"{b['pass_ms'] / a['pass_ms']:.2f}x, rows read by open "
                f"{sum(a['open_rows'].values())} -> {sum(b['open_rows'].values())}, by the "
                f"first pass {sum(a['pass_rows'].values())} -> {sum(b['pass_rows'].values())}"
            )
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "subagents.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
