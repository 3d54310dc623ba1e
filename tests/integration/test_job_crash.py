"""Jobs across a real SIGKILL of their harness (§5.1, §8.7; issue 14 "crash and adoption"):
a child harness process starts a job, is killed at a chosen point, and the test process
reopens the same storage and supervises. The job's process lives in its own session, so it
outlives the harness; recovery adopts it (never a second launch), recovers its status file,
or records ``lost`` with the reason; a recycled pid is never adopted and never signalled.
Real processes, real SQLite files and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.application.host import LaunchIntent, ProcessIdentity
from pico.infrastructure.host import PosixProcessHost
from pico.infrastructure.host.process import WRAPPER, proc_stat
from tests.backends import Backend
from tests.processes import spawn_child

#: The FakeClock's start in the schedule flow (both processes agree on it).
T0 = 1_000_000.0
EVERY = 10.0

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import pico
    from pico.infrastructure.host import PosixProcessHost

    def say(**signals):
        print(json.dumps(signals), flush=True)

    class StopsAfterLaunch(PosixProcessHost):
        # The process started; the harness dies before `running` is committed.
        def launch(self, spec, intent):
            identity = super().launch(spec, intent)
            say(signal="launched", identity=identity.to_json(), intent=intent.to_json())
            time.sleep(3600)  # SIGKILLed here (a worker thread of the drive)

    class StopsBeforeLaunch(PosixProcessHost):
        # The intent is committed; the harness dies before anything starts.
        def launch(self, spec, intent):
            say(signal="launching", intent=intent.to_json())
            time.sleep(3600)  # SIGKILLed here
            return super().launch(spec, intent)

    HOSTS = {"running": None, "after_launch": StopsAfterLaunch, "before_launch": StopsBeforeLaunch}

    async def until(h, test):
        while True:
            found = await test()
            if found is not None:
                return found
            await asyncio.sleep(0.01)

    async def job(url, session, directory, stop, script):
        host = HOSTS[stop]
        h = await pico.Harness.open(
            url, session=session, job_directory=directory,
            host=None if host is None else host(),
        )
        c = await h.root()
        j = await c.start_job(["sh", "-c", script])
        asyncio.ensure_future(h.drive())
        if stop == "running":
            async def running():
                t = await h.task(j)
                return t if t.status == "running" else None

            t = await until(h, running)
            say(signal="running", job=j, identity=t.state["identity"], intent=t.state["intent"])
        await asyncio.Event().wait()  # SIGKILLed here

    async def schedule(url, session, directory, script):
        clock = pico.FakeClock(%(T0)r)
        h = await pico.Harness.open(url, session=session, job_directory=directory, clock=clock)
        c = await h.root()
        s = await c.schedule(
            pico.Recurrence(every=%(EVERY)r), job=pico.LaunchSpec(("sh", "-c", script))
        )
        clock.advance(%(EVERY)r)  # the first run is due
        asyncio.ensure_future(h.drive())

        async def collecting():
            jobs = (await h.tasks(kind="job")).items
            sched = await h.task(s)
            if jobs and jobs[0].status == "running" and sched.status == "collecting":
                return jobs[0]
            return None

        j = await until(h, collecting)
        say(signal="collecting", schedule=s, job=j.id, identity=j.state["identity"])
        await asyncio.Event().wait()  # SIGKILLed here

    flow, *args = sys.argv[1:]
    asyncio.run({"job": job, "schedule": schedule}[flow](*args))
    """
    % {"T0": T0, "EVERY": EVERY}
)


# ---------------------------------------------------------------------- processes


def _session_members(sid: int) -> list[int]:
    """Pids of live processes in session ``sid`` (a wrapper's session holds it and its
    child's process group)."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rindex(b")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def _wrappers(directory: Path) -> list[int]:
    """Live wrappers whose status file is under ``directory``: the job processes started
    for this test."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = [os.fsdecode(a) for a in f.read().split(b"\0")]
        except OSError:
            continue
        stat = proc_stat(int(name))
        if (
            WRAPPER in args
            and any(a.startswith(str(directory)) for a in args)
            and stat is not None
            and stat[0] not in ("Z", "X")
        ):
            found.append(int(name))
    return found


def _kill_session(sid: int) -> None:
    for pid in _session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Lab:
    """One test's files and the processes it starts; ``close`` kills every one of them."""

    def __init__(self, tmp_path: Path) -> None:
        self.jobs = tmp_path / "jobs"
        self.log = tmp_path / "F"
        self.gate = tmp_path / "gate"
        self.children: list[subprocess.Popen[str]] = []
        self.others: list[subprocess.Popen[bytes]] = []

    def script(self, *, gated: bool = True) -> str:
        wait = f"while [ ! -e {self.gate} ]; do sleep 0.02; done; " if gated else ""
        return f"echo start >> {self.log}; {wait}echo done >> {self.log}; exit 4"

    def lines(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    async def killed_at(self, *args: str) -> dict[str, Any]:
        """Run the child harness with ``args``; SIGKILL it at its first signal line."""
        proc = spawn_child(CHILD, *args)
        self.children.append(proc)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
            assert line, f"the child harness ended without a signal (exit {proc.poll()})"
            signals: dict[str, Any] = json.loads(line)
            return signals
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
            proc.stdout.close()

    def close(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in _wrappers(self.jobs):
            _kill_session(pid)
        for other in self.others:
            if other.poll() is None:
                other.kill()
            other.wait()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


async def _job_crashed_running(lab: Lab, backend: Backend, script: str) -> dict[str, Any]:
    seen = await lab.killed_at("job", backend.url, backend.session, str(lab.jobs), "running", script)
    identity = ProcessIdentity.from_json(seen["identity"])
    # Check: the harness is dead; its job runs on, one wrapper of it.
    assert PosixProcessHost().identify(identity) == "running"
    assert _wrappers(lab.jobs) == [identity.pid]
    return seen


def _until(test: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _terminal_patches(h: pico.Harness, job: int) -> list[dict[str, Any]]:
    """The stored patches of task ``job`` that set a terminal status."""
    terminal = ("exited", "killed", "lost", "failed")
    return [
        r.payload
        for r in h.audit(limit=100_000)
        if r.aggregate == f"task/{job}" and r.payload.get("status") in terminal
    ]


def _result(task: pico.TaskSnapshot) -> dict[str, Any]:
    assert isinstance(task.state, dict) and isinstance(task.state.get("result"), dict)
    result: dict[str, Any] = task.state["result"]
    return result


async def _open(backend: Backend, lab: Lab, **kwargs: Any) -> pico.Harness:
    return await backend.open(job_directory=str(lab.jobs), **kwargs)


# ---------------------------------------------------------------------- 1, 2, 3: running


async def test_a_job_whose_harness_was_killed_is_adopted_by_the_next_owner(
    sql_backend: Backend, lab: Lab
) -> None:
    seen = await _job_crashed_running(lab, sql_backend, lab.script())
    j = seen["job"]
    h = await _open(sql_backend, lab)
    try:
        before = await h.task(j)
        assert before is not None and before.status == "running"
        waiting = asyncio.ensure_future(h.wait_for(j, timeout=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # adopted: it waits for the process, which still runs
        lab.gate.touch()
        job = await waiting
        assert job.status == "exited" and _result(job)["exit_code"] == 4
        assert _result(job)["signal"] is None
        # Check: one process ran (never a second launch), its identity is the one the
        # dead harness recorded, and the exit was recorded once.
        assert lab.lines() == ["start", "done"]
        assert job.state["identity"] == seen["identity"]  # type: ignore[index,call-overload]
        assert len(_terminal_patches(h, j)) == 1
        assert _wrappers(lab.jobs) == []
    finally:
        await h.close()


async def test_a_job_that_exited_while_its_harness_was_dead_is_recovered_from_its_status_file(
    sql_backend: Backend, lab: Lab
) -> None:
    seen = await _job_crashed_running(lab, sql_backend, lab.script())
    intent = LaunchIntent.from_json(seen["intent"])
    lab.gate.touch()
    _until(lambda: os.path.exists(intent.status_path), "the job's status file")
    h = await _open(sql_backend, lab)
    try:
        job = await h.wait_for(seen["job"], timeout=10)
        assert job.status == "exited" and _result(job)["exit_code"] == 4
        assert _result(job)["stdout_path"] == intent.stdout_path
        assert lab.lines() == ["start", "done"]
        assert len(_terminal_patches(h, seen["job"])) == 1
    finally:
        await h.close()


async def test_a_job_whose_wrapper_was_killed_with_its_harness_is_lost_and_not_relaunched(
    tmp_path: Path, lab: Lab
) -> None:
    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'pico.db'}")
    seen = await _job_crashed_running(lab, backend, lab.script())
    identity = ProcessIdentity.from_json(seen["identity"])
    os.kill(identity.pid, signal.SIGKILL)  # the wrapper: nobody writes the status file
    os.killpg(identity.pgid, signal.SIGKILL)
    _until(lambda: not _wrappers(lab.jobs), "the wrapper to die")
    h = await _open(backend, lab)
    try:
        job = await h.wait_for(seen["job"], timeout=10)
        assert job.status == "lost"
        assert isinstance(job.state, dict) and "without an exit status" in str(job.state["reason"])
        assert "result" not in job.state
        # Check: nothing was launched again.
        assert lab.lines() == ["start"]
        assert _wrappers(lab.jobs) == []
        assert not os.path.exists(LaunchIntent.from_json(seen["intent"]).status_path)
    finally:
        await h.close()
