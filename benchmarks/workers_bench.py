"""Worker throughput on PostgreSQL (issue 16): aggregate commands/s and agent turns/s
through real ``pico worker`` processes, with the CPU of the machine, of the workers and of
their PostgreSQL backends, and ``pg_stat_activity`` wait events sampled during the run.

1. **Commands.** For each process count, ``procs x concurrency`` sessions are created,
   each with one durable task (``bench_loop``, below) whose effect runs ``append_entry``
   commands in a loop through the owner's line (each one PostgreSQL transaction, one
   ``pico_commits`` row), and released under a setup lease, which advertises them in
   ``pico_work``. Then ``procs`` ``pico worker`` processes start (``--setup
   benchmarks.workers_bench:command_options``), pick them, and after every session is
   leased and a warm-up, commits are counted in SQL over the window (per session, so per
   worker by the lease owner).
2. **Agent turns.** ``procs x concurrency`` sessions with a faux model that calls ``read``
   twice and then answers (the turn of ``pg_commands_bench``); one client coroutine per
   session, each with its own ``Inbox`` (an API process), submits an input with
   ``accept``, awaits the reply (the input id: submit -> reply latency), waits until the
   turn's answer is committed (one SQL poll every 20 ms for all sessions: submit -> answer
   latency) and submits the next.

Samples every 200 ms: ``/proc/stat`` (machine), ``/proc/<pid>/stat`` of the workers and of
every PostgreSQL process (the server's total, and the backends whose client port belongs
to a worker), and the workers' backends in ``pg_stat_activity`` (state, wait event).

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        .venv/bin/python -m benchmarks.workers_bench --procs 1,2,4,8 --turn-procs 1,2,4

The command run holds at most ``--max-sessions`` (64) sessions in all (8 processes hold 8
each: a held session costs its lease's connection, a process two more and the few its
sessions' transactions share; before they shared them, 3-4 per session, 32 fitted).
``--no-yield`` makes ``bench_loop`` run its commands without yielding to the event loop
between them (it starves the process: see docs/benchmarks.md, "Workers on PostgreSQL").

``--profile S`` samples the single worker process of the 1-process command run (after its
window) with ``py-spy`` (``--py-spy PATH``) for S seconds, samples holding the GIL only,
and prints the top functions by own time and the pico functions by inclusive time.
Prints a Markdown report. Every run uses its own session prefix and deletes its leftover
``pico_work`` rows at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import pico
from benchmarks.pg_commands_bench import TEXT, _cpu, _turn_harness_args
from pico.application.model import ToolResultPart
from pico.domain.task import Role
from tests.worker_child import worker_argv

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
#: Whether the command loop yields to the event loop after each command (``--no-yield``
#: passes ``PICO_WBENCH_NO_YIELD=1`` to the workers).
YIELD = os.environ.get("PICO_WBENCH_NO_YIELD") != "1"
#: Each started worker's lease owner, by pid (its first line of output).
OWNERS: dict[int, str] = {}
#: Each started worker's further output, by pid.
LOGS: dict[int, list[str]] = {}


# --------------------------------------------------------------------- the workloads
def _append(conversation: int, text: str, tx: pico.Command) -> int:
    return tx.append_entry(conversation, "user", text)


def _plan(conversation: int, loop: int, tx: pico.Command) -> int:
    return tx.create_task(conversation, "bench_loop", state={"n": loop})


class CommandLoop(pico.TaskDefinition):
    """Runs ``state["n"]`` ``append_entry`` commands, one durable command each, then
    settles; stops early (leaving the task ready) when its execution is signalled."""

    kind = "bench_loop"
    initial_status = "running"
    roles: dict[str, Role] = {"running": "ready", "done": "terminal", "cancelled": "terminal"}
    transitions = {"running": ["done", "cancelled"]}

    def validate_state(self, value: pico.JsonValue) -> pico.JsonValue:
        return value

    async def execute(self, task: pico.TaskSnapshot, ctx: pico.TaskExecution) -> None:
        state = task.state if isinstance(task.state, dict) else {}
        n = int(state.get("n", 0))  # type: ignore[arg-type]
        conversation = task.conversation_id
        for i in range(n):
            if ctx.signal.is_set():
                return  # the worker is closing the session: the next owner goes on
            await ctx.command(functools.partial(_append, conversation, f"{i} {TEXT}"))
            if YIELD:
                # A command commits on the event loop's thread and an uncontended command
                # never suspends: without this, one session's loop would starve every
                # other session of the process and its own lease renewal (lease lost
                # after ttl; docs/benchmarks.md, "Workers on PostgreSQL").
                await asyncio.sleep(0)
        await ctx.command(lambda tx: tx.patch_task(task.id, status="done"))

    async def recover(self, task: pico.TaskSnapshot, ctx: pico.TaskExecution) -> None:
        await self.execute(task, ctx)

    async def abort(self, task: pico.TaskSnapshot, ctx: pico.TaskExecution) -> None:
        await ctx.command(lambda tx: tx.patch_task(task.id, status="cancelled"))


def command_options() -> dict[str, Any]:
    """``--setup`` of the command run's workers."""
    return {"definitions": [CommandLoop()]}


class AnswerProvider:
    """One faux model for many sessions: a request without tool results calls ``read``
    twice; one after them answers."""

    async def stream(self, request: Any) -> Any:
        answered = any(
            isinstance(part, ToolResultPart) for m in request.messages for part in m.parts
        )
        item: pico.FauxResponse | str = (
            "answer"
            if answered
            else pico.FauxResponse(text="look", tool_calls=[("read", {"path": "f"})] * 2)
        )
        async for event in pico.FauxProvider([item]).stream(request):
            yield event

    async def poll(self, handle: str) -> Any:
        raise pico.ProviderError(f"no deferred responses here ({handle})", kind="fatal")


def turn_options() -> dict[str, Any]:
    """``--setup`` of the turn run's workers: ``pg_commands_bench``'s tool, this model."""
    return {"provider": AnswerProvider(), "tools": _turn_harness_args(0)["tools"]}


# --------------------------------------------------------------------- measuring
def _ticks(pid: int) -> int | None:
    """utime + stime of a process (all its threads), in clock ticks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _ports_of(pids: list[int]) -> set[int]:
    """Local TCP ports of the sockets these processes hold (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[9] in inodes:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


LOCKS = """
SELECT pid, locktype, coalesce(classid::regclass::text, ''), coalesce(objid, 0), mode
  FROM pg_locks WHERE NOT granted
"""
ACTIVITY = """
SELECT pid, client_port, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''),
       application_name
  FROM pg_stat_activity WHERE backend_type = 'client backend' AND client_port IS NOT NULL
"""


@dataclass
class Sampler:
    """Samples CPU and the workers' backends every ``every`` seconds on a thread."""

    url: str
    workers: list[int]
    every: float = 0.2
    waits: Counter[str] = field(default_factory=Counter)
    #: Lock requests the workers' backends were waiting for (pg_locks, not granted).
    locks: Counter[str] = field(default_factory=Counter)
    apps: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    max_backends: int = 0
    backend_ticks: dict[int, list[int]] = field(default_factory=dict)
    #: Every PostgreSQL process's CPU ticks, [at the start (0: born since), last seen].
    pg_ticks: dict[int, list[int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.machine0 = _cpu()
        self.workers0 = {pid: _ticks(pid) or 0 for pid in self.workers}
        self.pg_ticks = {pid: [t, t] for pid in _postgres_pids() if (t := _ticks(pid))}
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="wbench-sampler") as c:
            while not self._stop.wait(self.every):
                self._sample_postgres()
                ports = _ports_of(self.workers)
                rows = c.execute(ACTIVITY).fetchall()
                mine = [r for r in rows if r[1] in ports]
                pids = {r[0] for r in mine}
                if any(r[3] == "Lock" for r in mine):
                    for pid, kind, cls, objid, mode in c.execute(LOCKS).fetchall():
                        if pid in pids:
                            self.locks[f"{kind} {cls} {objid} {mode}"] += 1
                self.samples += 1
                self.max_backends = max(self.max_backends, len(mine))
                for pid, _port, state, wtype, wevent, app in mine:
                    if state == "active":
                        self.waits[f"{wtype}:{wevent}" if wtype else "CPU"] += 1
                    else:
                        self.waits[state] += 1
                    self.apps[app or "(engine)"] += 1
                    if pid in self.pg_ticks:
                        self.backend_ticks[pid] = self.pg_ticks[pid]

    def _sample_postgres(self) -> None:
        for pid in _postgres_pids():
            t = _ticks(pid)
            if t is not None:
                self.pg_ticks.setdefault(pid, [0, t])[1] = t

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self.t0
        busy1, total1 = _cpu()
        busy0, total0 = self.machine0
        self._sample_postgres()
        workers = sum((_ticks(p) or self.workers0[p]) - self.workers0[p] for p in self.workers)
        pg = sum(last - first for first, last in self.pg_ticks.values())
        backends = sum(last - first for first, last in self.backend_ticks.values())
        cores = os.cpu_count() or 1
        return {
            "machine": (busy1 - busy0) / max(total1 - total0, 1),
            "workers": workers / TICK / wall / cores,
            "postgres": pg / TICK / wall / cores,
            "backends": backends / TICK / wall / cores,
        }


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --------------------------------------------------------------------- the runs
def start_workers(
    url: str, prefix: str, procs: int, setup: str, concurrency: int
) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PGAPPNAME": f"wbench-{prefix}"}
    workers = [
        subprocess.Popen(
            worker_argv(
                url,
                prefix,
                setup=setup,
                concurrency=concurrency,
                idle_after=5,
                poll_every=1,
                extra=("--verbose",),  # each session taken and released, each lease lost
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for _ in range(procs)
    ]
    for w in workers:  # each prints its owner once it is up
        assert w.stdout is not None
        line = w.stdout.readline()
        if not line.startswith("pico worker"):
            sys.exit(f"a worker did not start: {line}{w.stdout.read()}")
        OWNERS[w.pid] = line.split()[2]
        LOGS[w.pid] = []
        # Drained on a thread: a full pipe would block the worker's logging.
        threading.Thread(target=_drain, args=(w.stdout, LOGS[w.pid]), daemon=True).start()
    return workers


def _drain(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def stop_workers(workers: list[subprocess.Popen[str]]) -> None:
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(timeout=60)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def cleanup(url: str, sessions: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("DELETE FROM pico_work WHERE session_id = ANY(%s)", (sessions,))


def wait_leased(url: str, sessions: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as c:
        while time.monotonic() < deadline:
            held = c.execute(
                "SELECT count(*) FROM pico_leases WHERE session_id = ANY(%s)"
                " AND owner <> 'wbench-setup'",
                (sessions,),
            ).fetchone()
            if held is not None and held[0] == len(sessions):
                return
            time.sleep(0.1)
    sys.exit(f"the workers did not take all {len(sessions)} sessions in {timeout:.0f} s")


async def create_sessions(url: str, prefix: str, n: int, *, loop: int | None) -> list[str]:
    """``n`` sessions, each released under a setup lease so its work is advertised
    (with ``loop``: a ``bench_loop`` task of that many commands)."""
    sessions = [f"{prefix}{i:03d}" for i in range(n)]
    options: dict[str, Any] = command_options() if loop is not None else turn_options()
    for sid in sessions:
        h = await pico.Harness.open(
            url, session=sid, lease=pico.Lease(owner="wbench-setup"), **options
        )
        if loop is not None:
            root = await h.root()
            await h.command(functools.partial(_plan, root.id, loop))
        await h.close()
    return sessions


def commits(url: str, sessions: list[str]) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT session_id, count(*) FROM pico_commits WHERE session_id = ANY(%s)"
            " GROUP BY session_id",
            (sessions,),
        ).fetchall()
    return {sid: n for sid, n in rows}


def owners(url: str, sessions: list[str]) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT session_id, owner FROM pico_leases WHERE session_id = ANY(%s)", (sessions,)
        ).fetchall()
    return {sid: owner for sid, owner in rows}


def profile(pid: int, seconds: float, py_spy: str) -> list[str]:
    """py-spy's top functions (own time) of ``pid`` over ``seconds``, all threads."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        subprocess.run(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                out.name,
                "--nonblocking",
                "--gil",  # only samples holding the GIL: CPU, not waits
            ],
            check=True,
            capture_output=True,
        )
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0
        for line in Path(out.name).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            # "name (path:line)" -> "name (path)": one row per function
            frames = [f.rsplit(":", 1)[0] + ")" if ":" in f else f for f in stack.split(";")]
            n = int(count)
            total += n
            own[frames[-1]] += n
            for frame in set(frames):
                if "pico/" in frame:
                    inclusive[frame] += n
    total = max(total, 1)
    return [
        f"{len(own)} functions sampled, {total} samples holding the GIL; own time:",
        *(f"  {n / total:.1%} {frame}" for frame, n in own.most_common(10)),
        "pico functions, inclusive:",
        *(f"  {n / total:.1%} {frame}" for frame, n in inclusive.most_common(20)),
    ]


def command_run(url: str, procs: int, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"wbench-c{procs}-{uuid.uuid4().hex[:8]}-"
    concurrency = max(1, min(args.concurrency, args.max_sessions // procs))
    sessions = asyncio.run(create_sessions(url, prefix, procs * concurrency, loop=args.loop))
    workers = start_workers(
        url, prefix, procs, "benchmarks.workers_bench:command_options", concurrency
    )
    try:
        wait_leased(url, sessions)
        time.sleep(args.warmup)
        held = owners(url, sessions)
        before = commits(url, sessions)
        sampler = Sampler(url, [w.pid for w in workers])
        load0 = _loadavg()
        t0 = time.perf_counter()
        sampler.start()
        time.sleep(args.seconds)
        after = commits(url, sessions)
        wall = time.perf_counter() - t0
        cpu = sampler.stop()
        load1 = _loadavg()
        top: list[str] = []
        if args.profile and procs == 1:  # after the window: py-spy slows what it samples
            top = profile(workers[0].pid, args.profile, args.py_spy)
    finally:
        stop_workers(workers)
        cleanup(url, sessions)
    done = {sid: after.get(sid, 0) - before.get(sid, 0) for sid in sessions}
    per_owner: Counter[str] = Counter()
    for sid, n in done.items():
        per_owner[held.get(sid, "?")] += n
    rates = [per_owner[OWNERS[w.pid]] / wall for w in workers]
    return {
        "procs": procs,
        "sessions": len(sessions),
        "rate": sum(done.values()) / wall,
        "per_proc": rates,
        "idle_sessions": sum(1 for n in done.values() if n == 0),
        "lost": sum(1 for w in workers for line in LOGS[w.pid] if "lease lost" in line),
        "cpu": cpu,
        "waits": sampler.waits,
        "locks": sampler.locks,
        "samples": sampler.samples,
        "backends": sampler.max_backends,
        "load": f"{load0}-{load1}",
        "top": top,
    }


ANSWERS = """
SELECT session_id, count(*) FROM pico_entries
 WHERE session_id = ANY(%s) AND kind = 'assistant' AND content NOT LIKE '%%tool_calls%%'
 GROUP BY session_id
"""


async def turn_clients(url: str, sessions: list[str], seconds: float, warmup: float) -> Any:
    """One client per session: accept -> reply -> answer committed -> next, until the
    deadline; latencies of the turns submitted inside the window."""
    answered: dict[str, int] = dict.fromkeys(sessions, 0)
    changed = asyncio.Event()
    stop = asyncio.Event()

    async def poll() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with conn:
            while not stop.is_set():
                rows = await (await conn.execute(ANSWERS, (sessions,))).fetchall()
                for sid, n in rows:
                    answered[sid] = n
                changed.set()
                await asyncio.sleep(0.02)

    loop = asyncio.get_running_loop()
    start = loop.time()
    window = (start + warmup, start + warmup + seconds)
    replies: list[float] = []
    turns: list[float] = []
    counted = [0]

    async def client(sid: str) -> None:
        async with pico.Inbox(url) as inbox:
            i = 0
            while loop.time() < window[1]:
                t0 = loop.time()
                sent = await inbox.accept(sid, f"question {i}")
                await inbox.reply(sent, timeout=60)
                t1 = loop.time()
                while answered[sid] <= i:
                    if loop.time() > t1 + 60:
                        raise TimeoutError(f"{sid}: no answer to input {i} within 60 s")
                    changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 1.0)
                t2 = loop.time()
                if window[0] <= t0 and t2 <= window[1]:
                    replies.append(t1 - t0)
                    turns.append(t2 - t0)
                    counted[0] += 1
                i += 1

    poller = asyncio.ensure_future(poll())
    cpu0, wall0 = time.process_time(), loop.time()
    try:
        await asyncio.gather(*(client(sid) for sid in sessions))
    finally:
        stop.set()
        await poller
    # The clients' own CPU: a saturated client would bound turns/s by itself.
    client_cpu = (time.process_time() - cpu0) / (loop.time() - wall0)
    return counted[0], replies, turns, client_cpu


def turn_run(url: str, procs: int, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"wbench-t{procs}-{uuid.uuid4().hex[:8]}-"
    sessions = asyncio.run(create_sessions(url, prefix, procs * args.concurrency, loop=None))
    cleanup(url, sessions)  # nothing is due until an input arrives
    workers = start_workers(
        url, prefix, procs, "benchmarks.workers_bench:turn_options", args.concurrency
    )
    try:
        sampler = Sampler(url, [w.pid for w in workers])
        load0 = _loadavg()
        sampler.start()
        n, replies, turns, client_cpu = asyncio.run(
            turn_clients(url, sessions, args.turn_seconds, args.warmup)
        )
        cpu = sampler.stop()
        load1 = _loadavg()
    finally:
        stop_workers(workers)
        cleanup(url, sessions)
    return {
        "procs": procs,
        "sessions": len(sessions),
        "rate": n / args.turn_seconds,
        "client": client_cpu,
        "reply": (_percentile(replies, 0.5), _percentile(replies, 0.99)),
        "turn": (_percentile(turns, 0.5), _percentile(turns, 0.99)),
        "cpu": cpu,
        "waits": sampler.waits,
        "locks": sampler.locks,
        "backends": sampler.max_backends,
        "load": f"{load0}-{load1}",
    }


def _waits(waits: Counter[str], locks: Counter[str]) -> str:
    """The sampled states, and the wait events of the active samples."""
    total = sum(waits.values()) or 1
    idle = {k: v for k, v in waits.items() if k in ("idle", "idle in transaction")}
    active = Counter({k: v for k, v in waits.items() if k not in idle})
    n = sum(active.values()) or 1
    text = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(idle.items()))
    text += f", active {sum(active.values()) / total:.1%}: " + ", ".join(
        f"{k} {v / n:.0%}" for k, v in active.most_common(4)
    )
    if locks:
        text += " (waiting for: " + ", ".join(f"{k} x{v}" for k, v in locks.most_common(3)) + ")"
    return text


def _per(share: float, rate: float) -> str:
    """Milliseconds of CPU per command from a share of the machine and commands/s."""
    return f"{share * (os.cpu_count() or 1) * 1000 / max(rate, 1e-9):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,2,4,8", help="command run: worker processes")
    ap.add_argument("--turn-procs", default="1,2,4", help="turn run: worker processes")
    ap.add_argument("--concurrency", type=int, default=8, help="sessions per worker")
    ap.add_argument("--seconds", type=float, default=15.0, help="command window")
    ap.add_argument("--turn-seconds", type=float, default=15.0, help="turn window")
    ap.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="command run: at most this many sessions in all (a held session costs its "
        "lease's connection, a worker ~6 more: 8 x 8 uses ~110 of max_connections 200)",
    )
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--loop", type=int, default=1_000_000, help="commands per task")
    ap.add_argument("--profile", type=float, default=0.0, help="py-spy seconds (1 process)")
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("--no-yield", action="store_true", help="the command loop never yields")
    args = ap.parse_args()
    if args.no_yield:
        os.environ["PICO_WBENCH_NO_YIELD"] = "1"  # the workers inherit it
    url = os.environ.get("PICO_TEST_POSTGRES_URL")
    if not url:
        sys.exit("set PICO_TEST_POSTGRES_URL to a PostgreSQL database pico may write")
    print(f"nproc {os.cpu_count()}, load average at start {_loadavg()}\n", flush=True)
    procs = [int(p) for p in args.procs.split(",") if p]
    profiles: list[str] = []
    if procs:
        print(
            "| processes | sessions (per process) | commands/s | per process | machine CPU |"
            " workers CPU | PostgreSQL CPU (all / workers' backends) | CPU ms per command"
            " (worker / backend) | workers' backends | backend states sampled | load |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for p in procs:
        r = command_run(url, p, args)
        c, waits = r["cpu"], _waits(r["waits"], r["locks"])
        per = " / ".join(f"{x:,.0f}" for x in r["per_proc"])
        print(
            f"| {p} | {r['sessions']} ({r['sessions'] // p}) | {r['rate']:,.0f} | {per} |"
            f" {c['machine']:.0%} | {c['workers']:.0%} | {c['postgres']:.0%} /"
            f" {c['backends']:.0%} | {_per(c['workers'], r['rate'])} /"
            f" {_per(c['backends'], r['rate'])} | {r['backends']} | {waits} |"
            f" {r['load']} |",
            flush=True,
        )
        if r["idle_sessions"]:
            profiles.append(f"{p} processes: {r['idle_sessions']} sessions committed nothing")
        if r["lost"]:
            profiles.append(f"{p} processes: the workers logged {r['lost']} lost leases")
        if r["top"]:
            profiles += ["py-spy, the 1-process worker:", *(f"    {x}" for x in r["top"])]
    if profiles:
        print("\n" + "\n".join(profiles), flush=True)
    turn_procs = [int(p) for p in args.turn_procs.split(",") if p]
    if turn_procs:
        print(
            "\n| processes | sessions | turns/s | reply p50 / p99 ms | answer p50 / p99 ms |"
            " client CPU (of one core) | machine CPU | workers CPU | PostgreSQL CPU (all /"
            " workers' backends) | workers' backends | backend states sampled | load |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for p in turn_procs:
        r = turn_run(url, p, args)
        c, waits = r["cpu"], _waits(r["waits"], r["locks"])
        print(
            f"| {r['procs']} | {r['sessions']} | {r['rate']:,.1f} |"
            f" {r['reply'][0] * 1000:,.0f} / {r['reply'][1] * 1000:,.0f} |"
            f" {r['turn'][0] * 1000:,.0f} / {r['turn'][1] * 1000:,.0f} |"
            f" {r['client']:.0%} | {c['machine']:.0%} | {c['workers']:.0%} | {c['postgres']:.0%} /"
            f" {c['backends']:.0%} | {r['backends']} | {waits} | {r['load']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
