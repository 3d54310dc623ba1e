"""Takeover latency on PostgreSQL (issue 16): the time from SIGKILL of a worker holding a
session to that session's next committed command on another worker.

Each trial creates a session, starts a ``pico worker`` for it alone (the victim: its
generation sleeps, so it holds the session mid-turn), submits an input through an
``Inbox``, waits until the victim is generating, starts a second worker and waits until
it is up, kills the victim with SIGKILL and polls ``pico_events`` every 5 ms for the
session's first new event (the successor's claim). It prints the median and p99 with the
lease settings.

    PICO_BENCH_URL=postgresql://postgres@127.0.0.1:25432/pico_test \
        .venv/bin/python benchmarks/takeover_bench.py --trials 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

import pico

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.worker_child import MARKS, read_lines, worker_argv  # noqa: E402


def worker(url: str, prefix: str, directory: Path, args: Any, gen_sleep: float) -> Any:
    return subprocess.Popen(
        worker_argv(
            url,
            prefix,
            ttl=args.ttl,
            renew_every=args.renew_every,
            poll_every=args.poll_every,
        ),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PICO_CRASH_DIR": str(directory),
            "PICO_CRASH_GEN_SLEEP": str(gen_sleep),
        },
    )


def last_event(url: str, session: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(max(id), 0) FROM pico_events WHERE session_number = "
            "(SELECT id FROM pico_session_numbers WHERE session_id = %s)",
            (session,),
        ).fetchone()
    return int(row[0]) if row else 0


async def trial(url: str, directory: Path, args: Any) -> float:
    sid = f"tbench-{uuid.uuid4().hex[:10]}"
    h = await pico.Harness.open(url, session=sid, provider=pico.FauxProvider([]))
    await h.close()
    victim = worker(url, sid, directory, args, gen_sleep=60.0)
    successor = None
    try:
        assert victim.stderr is not None
        await asyncio.to_thread(victim.stderr.readline)  # "pico worker ... on ..."
        async with pico.Inbox(url) as inbox:
            await inbox.accept(sid, f"work {sid}")
        while not any(x[0] == "gen1" and x[2] == sid for x in read_lines(directory / MARKS)):
            await asyncio.sleep(0.01)
        successor = worker(url, sid, directory, args, gen_sleep=0.0)
        assert successor.stderr is not None
        await asyncio.to_thread(successor.stderr.readline)
        await asyncio.sleep(0.5)  # its first pick and LISTEN are done
        before = last_event(url, sid)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT 1 FROM pico_events WHERE session_number = (SELECT id FROM "
                    "pico_session_numbers WHERE session_id = %s) AND id > %s LIMIT 1",
                    (sid, before),
                ).fetchone()
                if row is not None:
                    return time.monotonic() - killed
                if time.monotonic() - killed > args.ttl + 30:
                    raise RuntimeError(f"{sid}: no takeover within ttl + 30 s")
                time.sleep(0.005)
    finally:
        for p in (victim, successor):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (victim, successor):
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("PICO_BENCH_URL"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--renew-every", type=float, default=0.5)
    parser.add_argument("--poll-every", type=float, default=0.25)
    args = parser.parse_args()
    if not args.url:
        parser.error("--url or PICO_BENCH_URL: a PostgreSQL database")
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.trials):
            took = await trial(args.url, Path(tmp), args)
            times.append(took)
            print(f"trial {n + 1}: {took:.3f}s", flush=True)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(
        f"takeover after SIGKILL, {len(times)} trials (ttl {args.ttl}s, renew every "
        f"{args.renew_every}s, poll every {args.poll_every}s): median "
        f"{statistics.median(times):.3f}s, p99 {p99:.3f}s, min {times[0]:.3f}s, "
        f"max {times[-1]:.3f}s"
    )


if __name__ == "__main__":
    asyncio.run(main())
