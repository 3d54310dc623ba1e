"""Many genuinely live background tasks (seed 003 §10.3; issue 14 "Performance").

ONE session on a SQLite file holds LIVE schedules (``Recurrence(every=3600)`` with a job
action; the fake clock never reaches their first run, so they stay ``scheduled``) and JOBS
running processes (``sleep 600``, each ``running`` with its exit observer installed), all
detached background work of the root conversation. A conversation drive of the root is one
scheduler pass: it reads the live set, launches nothing (every schedule is before its
``not_before``, every job is armed) and returns ``idle`` at once, since detached work is
not waited for. That pass is measured (wall p50/p99, CPU, rows and queries) with H
completed tasks in the session, then again after the completed history grew 10x. The
completed tasks are real runs: schedules with ``count=1`` whose one action runs ``true``
(each run leaves S ``complete`` and its job ``exited``: two terminal tasks, one process).

Also measured: the latency of starting each of the jobs (``start_job`` until its task is
``running``: the create command, a drive pass, the launch intent, the wrapper's start and
handshake, the identity command) and the harness's RSS before and after the jobs' observers
are installed. Every job is aborted at the end (``abort_background``: SIGTERM to its
process group, recorded ``killed``); a job the harness could not stop is sent SIGTERM
directly, so no ``sleep`` outlives the run.

    python -m benchmarks.background_bench            # 1,000 schedules, 100 jobs, 1k -> 10k
    python -m benchmarks.background_bench --quick     # 50 schedules, 5 jobs, 40 -> 400

Prints Markdown (also benchmarks/results/background.md; ``--quick`` prints only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import resource
import signal
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pico
from benchmarks.subagent_bench import RowCounter

EVERY = 3600.0  # the live schedules' interval: the clock never gets there
HISTORY_EVERY = 1.0  # a history schedule's one run is due one (fake) second after creation
HISTORY_BATCH = 250  # history schedules created, then run together


@dataclass
class Passes:
    """The measured drive passes at one history size."""

    terminal: int
    live: int
    wall_ms: list[float]
    cpu_ms: list[float]
    rows: Counter[str]
    queries: int
    #: The same pass with the owner's live-task mirror dropped first (a fresh owner's first
    #: pass): what it reads to load the mirror again (the live set and the session row,
    #: whose head the mirror keeps), and its wall p50.
    cold_rows: Counter[str] = field(default_factory=Counter)
    cold_queries: int = 0
    cold_p50: float = 0.0
    build_s: float = 0.0
    profile: str = ""

    @property
    def p50(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def p99(self) -> float:
        ordered = sorted(self.wall_ms)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_ms)


@dataclass
class Run:
    """Everything one benchmark run measured."""

    schedules: int
    jobs: int
    launch_ms: list[float] = field(default_factory=list)
    launch_total_s: float = 0.0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    wrappers_rss_kib: int = 0
    wrappers_pss_kib: int = 0
    observers: int = 0
    passes: list[Passes] = field(default_factory=list)
    peak_rss_kib: int = 0
    killed: int = 0
    pids: dict[int, str] = field(default_factory=dict)  # the jobs' wrappers: pid -> token
    db_mib: float = 0.0


def _rss_kib() -> int:
    """This process's resident set now (``VmRSS``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _pid_memory_kib(pid: int) -> tuple[int, int]:
    """Another process's (RSS, PSS) in KiB: PSS shares the pages the wrappers have in
    common (the interpreter) among them, so it sums to what they really cost."""
    rss = pss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    return rss, pss


def _identity(task: pico.TaskSnapshot) -> tuple[int, str] | None:
    """A running job's wrapper pid and launch token, from its committed state."""
    state = task.state if isinstance(task.state, dict) else {}
    identity, intent = state.get("identity"), state.get("intent")
    if isinstance(identity, dict) and isinstance(intent, dict):
        pid, token = identity.get("pid"), intent.get("token")
        if isinstance(pid, int) and isinstance(token, str):
            return pid, token
    return None


async def _settle(h: pico.Harness, c: pico.ConversationHandle, done: Any) -> None:
    """Drive the root (one pass each: detached work is serviced, never awaited) at every
    change until ``done()``; the executions run on the loop between passes."""
    while not await done():
        assert await c.drive() == "idle"
        if await done():
            return
        # A commit, a finished execution or an observer event wakes the next pass; the
        # timeout only covers a change that landed before this wait subscribed.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(h.scheduler.next_change(), 0.05)


async def grow_history(
    h: pico.Harness, c: pico.ConversationHandle, clock: pico.FakeClock, tasks: int, live: int
) -> None:
    """Add ``tasks`` terminal tasks: tasks / 2 schedules with ``count=1`` running ``true``,
    HISTORY_BATCH schedules at a time (each leaves S complete and its job exited)."""
    runs = tasks // 2
    action = pico.LaunchSpec(("true",))
    while runs > 0:
        batch = min(HISTORY_BATCH, runs)
        made = [
            await c.schedule(pico.Recurrence(every=HISTORY_EVERY, count=1), job=action)
            for _ in range(batch)
        ]
        clock.advance(HISTORY_EVERY)  # due now; the live schedules stay hours away

        async def done() -> bool:
            return len(h.scheduler.live_tasks(None)) == live

        await _settle(h, c, done)
        for sid in (made[0], made[-1]):
            s = await h.task(sid)
            assert s is not None and s.status == "complete", s
            assert isinstance(s.state, dict) and s.state["outcomes"] == {"exited": 1}, s.state
        runs -= batch


async def start_jobs(h: pico.Harness, c: pico.ConversationHandle, run: Run) -> list[int]:
    """Start the jobs one after another: ms from ``start_job`` until ``running``."""
    jobs: list[int] = []
    t_all = time.perf_counter()
    for _ in range(run.jobs):
        t0 = time.perf_counter()
        jid = await c.start_job(("sleep", "600"))

        async def running(jid: int = jid) -> bool:
            task = await h.task(jid)
            assert task is not None and task.status in ("planned", "spawning", "running"), task
            return task.status == "running"

        await _settle(h, c, running)
        run.launch_ms.append((time.perf_counter() - t0) * 1000)
        jobs.append(jid)
    run.launch_total_s = time.perf_counter() - t_all

    async def observed() -> bool:
        # Every job armed once: its observer installed and its initial check done.
        sched = h.scheduler
        return all(
            j in sched.observers and not sched.observers[j].initial and j not in sched.executing
            for j in jobs
        )

    await _settle(h, c, observed)
    run.observers = len(h.scheduler.observers)
    return jobs


async def terminal_count(h: pico.Harness) -> int:
    """The session's terminal tasks, counted page by page through the public listing."""
    total, after = 0, None
    while True:
        page = await h.tasks(live=False, after=after, limit=1000)
        total += len(page.items)
        if page.next is None:
            return total
        after = page.next


async def measure(
    h: pico.Harness,
    c: pico.ConversationHandle,
    counter: RowCounter,
    passes: int,
    terminal: int,
    *,
    profile: bool,
) -> Passes:
    """``passes`` conversation drives of the root, each one scheduler pass."""
    live = len(h.scheduler.live_tasks(None))
    counted = await terminal_count(h)
    assert counted == terminal, f"the session holds {counted} terminal tasks, not {terminal}"
    for _ in range(3):  # warm-up
        assert await c.drive() == "idle"
    wall, cpu = [], []
    rows: Counter[str] = Counter()
    queries = 0
    seen: set[tuple[int, int]] = set()
    executing = len(h.scheduler.executing)
    with counter.installed():
        for _ in range(passes):
            counter.take()
            c0, t0 = time.process_time(), time.perf_counter()
            assert await c.drive() == "idle"
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            rows, queries = counter.take()
            seen.add((sum(rows.values()), queries))
    # A pass that launched or re-armed something would not be the pass measured here.
    assert len(h.scheduler.executing) == executing == 0, h.scheduler.executing
    assert len(seen) == 1, f"passes read different amounts: {seen}"
    out = Passes(terminal, live, wall, cpu, rows, queries)
    cold: list[float] = []
    with counter.installed():
        for _ in range(passes):
            h.scheduler.line.storage.task_queries.forget()  # type: ignore[attr-defined]
            counter.take()
            t0 = time.perf_counter()
            assert await c.drive() == "idle"
            cold.append((time.perf_counter() - t0) * 1000)
            out.cold_rows, out.cold_queries = counter.take()
    out.cold_p50 = statistics.median(cold)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(passes):
            await c.drive()
        prof.disable()
        text = _profile_text(prof)
        out.profile = text
    return out


def _profile_text(prof: cProfile.Profile) -> str:
    import io

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    return buf.getvalue()


async def stop_jobs(h: pico.Harness, c: pico.ConversationHandle, jobs: list[int]) -> int:
    """Abort every job (SIGTERM to its group, recorded ``killed``); returns how many."""
    for jid in jobs:
        task = await h.task(jid)
        if task is not None and task.live:
            await c.abort_background(jid)
    deadline = time.monotonic() + 30

    async def settled() -> bool:
        if time.monotonic() > deadline:
            raise TimeoutError(f"jobs {jobs} did not settle within 30 s of their abort")
        found = [await h.task(j) for j in jobs]
        return all(t is not None and not t.live for t in found)

    await _settle(h, c, settled)
    found = [await h.task(j) for j in jobs]
    return sum(1 for t in found if t is not None and t.status == "killed")


def _kill_leftovers(pids: dict[int, str]) -> None:
    """SIGTERM (the wrapper forwards it to the job's group) every wrapper still running
    with its own launch token on its command line: nothing outlives the run."""
    for pid, token in pids.items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


async def bench(
    directory: Path,
    *,
    schedules: int,
    jobs: int,
    history: int,
    growth: int,
    passes: int,
    profile: bool = False,
    log: Any = print,
) -> Run:
    """The whole workload in one session; returns what it measured."""
    run = Run(schedules=schedules, jobs=jobs)
    db = directory / "background.db"
    clock = pico.FakeClock()
    counter = RowCounter()
    h = await pico.Harness.open(
        f"sqlite:///{db}", session="background", clock=clock, job_directory=str(directory / "jobs")
    )
    pids = run.pids
    started: list[int] = []
    try:
        c = await h.root()
        t0 = time.perf_counter()
        await grow_history(h, c, clock, history, live=0)
        log(f"history {history}: {time.perf_counter() - t0:.1f}s")
        action = pico.LaunchSpec(("sleep", "600"))
        t0 = time.perf_counter()
        for _ in range(schedules):
            await c.schedule(pico.Recurrence(every=EVERY), job=action)
        log(f"{schedules} schedules: {time.perf_counter() - t0:.1f}s")
        run.rss_before_kib = _rss_kib()
        started = await start_jobs(h, c, run)
        for jid in started:
            task = await h.task(jid)
            assert task is not None
            ident = _identity(task)
            if ident is not None:
                pids[ident[0]] = ident[1]
        run.rss_after_kib = _rss_kib()
        memory = [_pid_memory_kib(pid) for pid in pids]
        run.wrappers_rss_kib = sum(rss for rss, _ in memory)
        run.wrappers_pss_kib = sum(pss for _, pss in memory)
        log(f"{jobs} jobs running: {run.launch_total_s:.1f}s")
        live = schedules + jobs
        assert len(h.scheduler.live_tasks(None)) == live
        first = await measure(h, c, counter, passes, history, profile=profile)
        log(f"passes at {history}: p50 {first.p50:.2f} ms")
        t0 = time.perf_counter()
        await grow_history(h, c, clock, growth - history, live=live)
        grown = await measure(h, c, counter, passes, growth, profile=profile)
        grown.build_s = time.perf_counter() - t0
        log(f"passes at {growth}: p50 {grown.p50:.2f} ms")
        run.passes = [first, grown]
        run.killed = await stop_jobs(h, c, started)
        # ru_maxrss is the kernel's high-water mark, updated lazily: a sample may exceed it.
        run.peak_rss_kib = max(_peak_rss_kib(), run.rss_after_kib, _rss_kib())
    finally:
        for jid in started:  # a job started but not yet in pids
            with contextlib.suppress(Exception):
                task = await h.task(jid)
                ident = None if task is None else _identity(task)
                if ident is not None:
                    pids[ident[0]] = ident[1]
        with contextlib.suppress(Exception):
            await h.close()
        _kill_leftovers(pids)
    run.db_mib = sum(f.stat().st_size for f in directory.glob("background.db*")) / 2**20
    return run


def _rows(rows: Counter[str]) -> str:
    total = sum(rows.values())
    parts = ", ".join(f"{name.removeprefix('pico_')} {n}" for name, n in sorted(rows.items()))
    return f"{total} ({parts})" if parts else "0"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(run: Run) -> str:
    a, b = run.passes
    lines = [
        f"One SQLite session: {run.schedules:,} live schedules (every {EVERY:.0f} s, a job "
        f"action) + {run.jobs} running jobs (`sleep 600`, observers installed); "
        f"{len(a.wall_ms)} conversation drives of the root (one scheduler pass each)",
        "",
        "| terminal tasks | live tasks | pass p50 ms | pass p99 ms | CPU ms/pass (p50) "
        "| queries/pass | rows read/pass | mirror dropped: p50 ms, queries, rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in (a, b):
        lines.append(
            f"| {p.terminal:,} | {p.live:,} | {p.p50:.2f} | {p.p99:.2f} | {p.cpu:.2f} "
            f"| {p.queries} | {_rows(p.rows)} | {p.cold_p50:.2f}, {p.cold_queries}, "
            f"{_rows(p.cold_rows)} |"
        )
    lines += [
        "",
        f"Ratio {b.terminal:,} / {a.terminal:,} terminal tasks: pass p50 {b.p50 / a.p50:.2f}x, "
        f"p99 {b.p99 / a.p99:.2f}x, CPU {b.cpu / a.cpu:.2f}x, rows read "
        f"{sum(a.rows.values())} -> {sum(b.rows.values())}, queries {a.queries} -> {b.queries}"
        f" (history grown in {b.build_s:.0f} s)",
        "",
        f"Starting {run.jobs} jobs one after another (`start_job` until `running`): p50 "
        f"{_pct(run.launch_ms, 0.5):.1f} ms, p99 {_pct(run.launch_ms, 0.99):.1f} ms, max "
        f"{max(run.launch_ms):.1f} ms; {run.launch_total_s:.1f} s in all",
        "",
        f"RSS of the harness process: {run.rss_before_kib / 1024:.1f} MiB with the "
        f"schedules, {run.rss_after_kib / 1024:.1f} MiB with {run.observers} job observers "
        f"installed (+{(run.rss_after_kib - run.rss_before_kib) / max(run.jobs, 1):.0f} KiB "
        f"per job); peak {run.peak_rss_kib / 1024:.1f} MiB. The {run.jobs} wrapper "
        f"processes: RSS {run.wrappers_rss_kib / 1024:.1f} MiB, PSS "
        f"{run.wrappers_pss_kib / 1024:.1f} MiB in all. Aborted at the end: "
        f"{run.killed} of {run.jobs} recorded killed. Database + WAL: {run.db_mib:.1f} MiB.",
    ]
    for p in (a, b):
        if p.profile:
            lines += [
                "",
                f"cProfile at {p.terminal:,} terminal tasks:",
                "",
                "```",
                p.profile,
                "```",
            ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--schedules", type=int)
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--history", type=int, help="terminal tasks at the first measurement")
    ap.add_argument("--passes", type=int)
    ap.add_argument("--profile", action="store_true", help="cProfile the passes too")
    args = ap.parse_args()
    quick = args.quick
    schedules = args.schedules or (50 if quick else 1000)
    jobs = args.jobs or (5 if quick else 100)
    history = args.history or (40 if quick else 1000)
    passes = args.passes or (20 if quick else 300)
    with tempfile.TemporaryDirectory(prefix="pico-background-") as tmp:
        run = asyncio.run(
            bench(
                Path(tmp),
                schedules=schedules,
                jobs=jobs,
                history=history,
                growth=history * 10,
                passes=passes,
                profile=args.profile,
            )
        )
    text = report(run)
    if not quick:
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "background.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
