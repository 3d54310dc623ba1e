"""The worker crash campaign (issue 16; seed 003 §1.2, §6.6, §8.1; seed 000 "Claiming a
run"): real ``pico worker`` processes on real PostgreSQL, one killed with SIGKILL in the
middle of turns.

Twelve sessions each run one agent turn (``tests/worker_child.py``: a generation, a
``replay="safe"`` tool, a ``replay="never"`` tool whose every invocation is fsync'd to an
external append-only file, the answer). Three workers drive them; when the first of them
reaches the step under test (a generation, the safe tool, the never tool, the answer) it
is killed. Then: every session completes within the ttl plus a bound; every reply an
inbox got is in durable state; no never-tool ran twice for one call and an interrupted
one (its start committed, its body perhaps run) was not re-run: its result is the
interruption error; every write between two claims came from the claimant, and the
successor claimed only after the dead owner's lease expired on the database's clock.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pico
from tests.backends import require_postgres
from tests.processes import ROOT
from tests.worker_child import MARKS, NEVER, read_lines, worker_argv

TTL, RENEW = 2.0, 0.5
#: What completing a taken-over session may take beyond the ttl on a loaded 2-core box:
#: the successor's poll, its open and claim, a re-run tool or generation, the answer.
BOUND = 10.0
SESSIONS = 12
INTERRUPTED = "the tool was interrupted; it may or may not have completed"


@pytest.fixture
def pg() -> Iterator[str]:
    yield require_postgres("the worker crash campaign")


def spawn_worker(url: str, prefix: str, directory: Path, *, concurrency: int = 4) -> Any:
    """A real ``pico worker`` process driving the sessions starting with ``prefix``."""
    log = open(directory / f"worker-{uuid.uuid4().hex[:6]}.log", "w")  # noqa: SIM115
    return subprocess.Popen(
        worker_argv(
            url, prefix, ttl=TTL, renew_every=RENEW, poll_every=0.25, concurrency=concurrency
        ),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PICO_CRASH_DIR": str(directory)},
    )


def stop(processes: list[Any]) -> None:
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def wait_mark(directory: Path, step: str, pids: set[int], within: float) -> int:
    """The pid of the first worker that reached ``step`` (a marker line)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for line in read_lines(directory / MARKS):
            if line[0] == step and int(line[1]) in pids:
                return int(line[1])
        await asyncio.sleep(0.01)
    raise AssertionError(f"no worker reached {step!r} within {within}s")


def leases_of(url: str, pid: int) -> dict[str, Any]:
    """The lease rows a worker process holds: session -> expires_at (database clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT session_id, expires_at FROM pico_leases WHERE owner LIKE %s",
            (f"%:{pid}:%",),
        ).fetchall()
    return {r[0]: r[1] for r in rows}


async def read_session(url: str, session: str, input_id: int) -> tuple[Any, list[Any]]:
    """The input's result and the session's stored events, from a read-only open."""
    h = await pico.Harness.open(url, session=session, read_only=True)
    try:
        c = await h.root()
        return await c.result(input_id), h.audit(limit=100_000)
    finally:
        await h.close()


def check_one_writer_per_claim(session: str, events: list[Any]) -> list[tuple[int, Any]]:
    """Every write naming its writer's pid (tool results, answers) came from the pid of
    the latest claim before it, and the Session stream has no gap; returns the claims
    as (pid, timestamp)."""
    claims: list[tuple[int, Any]] = []
    versions = [e.version for e in events if e.aggregate == "session"]
    assert versions == list(range(1, len(versions) + 1)), f"{session}: session stream gap"
    for e in events:
        if e.event == "Session.Claimed":
            claims.append((int(e.payload["pid"]), e.timestamp))
        for pid in re.findall(r"by pid (\d+)", str(e.payload.get("content") or "")):
            assert claims and int(pid) == claims[-1][0], (
                f"{session}: position {e.position} written by pid {pid} while pid "
                f"{claims[-1][0] if claims else None} held the claim"
            )
    return claims


def _never_by(directory: Path) -> list[tuple[tuple[str, str, str], int]]:
    """Each recorded never-tool invocation: its (session, call, token) and the pid."""
    return [((x[0], x[1], x[2]), int(x[3])) for x in read_lines(directory / NEVER)]


def tool_results(events: list[Any], name: str) -> list[str]:
    return [
        str(e.payload["content"])
        for e in events
        if e.event == "Conversation.EntryAppended"
        and e.payload.get("kind") == "tool"
        and f'"tool_name":"{name}"' in str(e.payload.get("metadata"))
    ]


@pytest.mark.parametrize("step", ["gen1", "safe", "never", "gen2"])
async def test_a_worker_killed_mid_turn_loses_no_session_and_runs_no_never_tool_twice(
    pg: str, tmp_path: Path, step: str
) -> None:
    prefix = f"wcrash-{step}-{uuid.uuid4().hex[:8]}-"
    sessions = [f"{prefix}{i:02d}" for i in range(SESSIONS)]
    for sid in sessions:
        h = await pico.Harness.open(pg, session=sid, provider=pico.FauxProvider([]))
        await h.close()
    workers = [spawn_worker(pg, prefix, tmp_path) for _ in range(3)]
    pids = {w.pid for w in workers}
    try:
        async with pico.Inbox(pg) as inbox:
            sent = [await inbox.accept(s, f"work {s}", request_id=f"turn-{s}") for s in sessions]
            victim = await wait_mark(tmp_path, step, pids, within=60.0)
            held = leases_of(pg, victim)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            assert held, "the victim held no session when it was killed"
            # Every accept is answered: by the victim before it died, or by a successor.
            inputs = {s.session_id: await inbox.reply(s, timeout=TTL + BOUND + 30.0) for s in sent}
        # Check: every session completes within ttl + the bound of the kill.
        pending, took = set(sessions), 0.0
        while pending:
            assert time.monotonic() - killed < TTL + BOUND + 30.0, f"never completed: {pending}"
            for sid in sorted(pending):
                input_id = inputs[sid]
                assert isinstance(input_id, int)
                result, _ = await read_session(pg, sid, input_id)
                if result is not None and result.status == "done":
                    pending.discard(sid)
                    took = max(took, time.monotonic() - killed)
            await asyncio.sleep(0.1)
    finally:
        stop(workers)
    print(f"\n{step}: victim held {len(held)} sessions; all done {took:.2f}s after the kill")
    assert took <= TTL + BOUND, took

    never_calls = collections.Counter(
        (line[0], line[1], line[2]) for line in read_lines(tmp_path / NEVER)
    )
    # Check: no replay="never" tool ran twice for one call, in any session.
    assert all(n == 1 for n in never_calls.values()), never_calls
    victim_ran = {k for k, line in _never_by(tmp_path) if line == victim}
    interrupted = 0
    for sid in sessions:
        result, events = await read_session(pg, sid, int(str(inputs[sid])))
        assert result is not None and result.status == "done" and result.entry_id is not None
        answers = [
            e
            for e in events
            if e.event == "Conversation.EntryAppended"
            and e.payload.get("kind") == "assistant"
            and f"done {sid} by pid" in str(e.payload.get("content"))
        ]
        assert len(answers) >= 1, f"{sid}: no answer in the transcript"
        claims = check_one_writer_per_claim(sid, events)
        # The call the never-tool ran for (one per session: its token is unique per
        # generation, and a regenerated call's tool never ran twice either).
        ran = [k for k in never_calls if k[0] == sid]
        results = tool_results(events, "never")
        assert len(results) == 1, (sid, results)
        if sid in held:
            # The successor claimed only after the dead owner's lease expired (the
            # database's clock vs. the claim's timestamp, both this machine's).
            after = [c for c in claims if c[0] != victim and c[1] > claims[0][1]]
            victim_claims = [i for i, c in enumerate(claims) if c[0] == victim]
            if victim_claims:
                successor = claims[victim_claims[-1] + 1 :]
                assert successor, f"{sid}: nobody took over from the victim"
                assert successor[0][1] > held[sid], (
                    f"{sid}: claimed at {successor[0][1]} before the victim's lease "
                    f"expired at {held[sid]}"
                )
            assert after
        # At most one invocation per session: an interrupted one is not re-run.
        assert len(ran) <= 1, (sid, ran)
        if not ran:
            # Killed after its start was committed but before its body ran (another
            # session's never-tool was the kill's trigger): the start is durable, so the
            # successor may not run it and records the interruption error instead.
            assert sid in held, f"{sid}: the never-tool never ran, yet the victim held it not"
            assert INTERRUPTED in results[0] and '"is_error":true' in results[0], results[0]
            interrupted += 1
        elif ran[0] in victim_ran and f"never by pid {victim}" not in results[0]:
            # Killed inside its never-tool (after the effect): the successor recorded
            # the interruption error instead of running it again.
            assert INTERRUPTED in results[0] and '"is_error":true' in results[0], results[0]
            interrupted += 1
    if step == "never":
        assert interrupted >= 1, "the kill interrupted no never-tool"
