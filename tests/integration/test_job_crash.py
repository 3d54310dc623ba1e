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

    async def until(test):
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
            # Committed, as another connection reads it: the owner's own reads see a
            # durable command one pass of the loop before its shared commit lands.
            seen = await pico.Harness.open(url, session=session, read_only=True)

            async def running():
                t = await seen.task(j)
                return t if t.status == "running" else None

            t = await until(running)
            say(signal="running", job=j, identity=t.state["identity"], intent=t.state["intent"])
        await asyncio.Event().wait()  # SIGKILLed here

    async def schedule(url, session, directory, script, start, every):
        clock = pico.FakeClock(float(start))
        h = await pico.Harness.open(url, session=session, job_directory=directory, clock=clock)
        c = await h.root()
        s = await c.schedule(
            pico.Recurrence(every=float(every)), job=pico.LaunchSpec(("sh", "-c", script))
        )
        clock.advance(float(every))  # the first run is due
        asyncio.ensure_future(h.drive())

        seen = await pico.Harness.open(url, session=session, read_only=True)  # committed

        async def collecting():
            jobs = (await seen.tasks(kind="job")).items
            sched = await seen.task(s)
            if jobs and jobs[0].status == "running" and sched.status == "collecting":
                return jobs[0]
            return None

        j = await until(collecting)
        say(signal="collecting", schedule=s, job=j.id, identity=j.state["identity"])
        await asyncio.Event().wait()  # SIGKILLed here

    flow, *args = sys.argv[1:]
    asyncio.run({"job": job, "schedule": schedule}[flow](*args))
    """
)


# ---------------------------------------------------------------------- processes


def _session_members(sid: int, *, zombies: bool = False) -> list[int]:
    """Pids of the processes in session ``sid`` (a wrapper's session holds it and its
    child's process group), the live ones unless ``zombies``."""
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
        if int(fields[3]) == sid and (zombies or fields[0] not in (b"Z", b"X")):
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
    seen = await lab.killed_at(
        "job", backend.url, backend.session, str(lab.jobs), "running", script
    )
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


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


def _result(task: pico.TaskSnapshot) -> dict[str, Any]:
    result = _state(task).get("result")
    assert isinstance(result, dict)
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
        assert _state(job)["identity"] == seen["identity"]
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


# ---------------------------------------------------------------------- 4: a recycled pid

PR_SET_CHILD_SUBREAPER = 36
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants: a killed harness's
    wrapper becomes our child, so we can reap it and free its pid (this machine's init
    reaps nobody, and an unreaped pid is never reused)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _reap_session(sid: int, timeout: float = 5.0) -> None:
    """Reap every (adopted) process of the ended session ``sid``: the wrapper, its child
    and the child's own children. Linux reuses no pid while a process, even a zombie,
    still has it as its pid, process group or session."""
    deadline = time.monotonic() + timeout
    while members := _session_members(sid, zombies=True):
        for pid in members:
            with contextlib.suppress(ChildProcessError):  # not (yet) reparented to us
                os.waitpid(pid, os.WNOHANG)
        assert time.monotonic() < deadline, f"session {sid} was not reaped: {members}"
        time.sleep(0.01)


def _take_pid(pid: int) -> subprocess.Popen[bytes]:
    """Start an unrelated ``sleep`` holding ``pid`` (free now): Linux gives a new process
    ``ns_last_pid + 1``; another process forking in between takes it, so retry."""
    for _ in range(200):
        try:
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError as exc:
            pytest.skip(f"cannot choose the next pid ({NS_LAST_PID}: {exc}); needs root")
        other = subprocess.Popen(["sleep", "60"])
        if other.pid == pid:
            return other
        other.kill()
        other.wait()
    pytest.fail(f"pid {pid} could not be given to another process")


async def _job_whose_pid_was_recycled(
    lab: Lab, backend: Backend, *, exited: bool
) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """A job recorded ``running`` by a killed harness whose wrapper is gone (it exited and
    left its status file, or was killed and left none) and whose pid another process
    now holds."""
    seen = await _job_crashed_running(lab, backend, lab.script())
    identity = ProcessIdentity.from_json(seen["identity"])
    intent = LaunchIntent.from_json(seen["intent"])
    if exited:
        lab.gate.touch()
        _until(lambda: os.path.exists(intent.status_path), "the job's status file")
    else:
        os.kill(identity.pid, signal.SIGKILL)
        os.killpg(identity.pgid, signal.SIGKILL)
    _reap_session(identity.pid)
    other = _take_pid(identity.pid)
    lab.others.append(other)
    # Check: the recorded pid is alive, but it is another process, not the job's.
    host = PosixProcessHost()
    _until(lambda: "sleep" in Path(f"/proc/{other.pid}/cmdline").read_text(), "the exec")
    assert host.identify(identity) == "gone"
    return seen, other


@pytest.mark.parametrize("then", ["recovered", "aborted"])
async def test_a_job_whose_pid_now_belongs_to_another_process_is_lost_never_adopted(
    tmp_path: Path, lab: Lab, then: str
) -> None:
    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'pico.db'}")
    with _subreaper():
        seen, other = await _job_whose_pid_was_recycled(lab, backend, exited=False)
        h = await _open(backend, lab)
        try:
            if then == "aborted":  # a later abort must not signal the pid's new owner
                assert await (await h.root()).abort_background(seen["job"]) == [seen["job"]]
            job = await h.wait_for(seen["job"], timeout=10)
            assert job.status == "lost"
            assert isinstance(job.state, dict) and "result" not in job.state
            assert f"process {other.pid} is gone" in str(job.state["reason"])
            assert job.state["identity"] == seen["identity"]  # never replaced by the other's
            # Check: the unrelated process was neither adopted nor signalled; nothing ran again.
            await asyncio.sleep(0.1)
            assert other.poll() is None
            assert lab.lines() == ["start"]
            assert len(_terminal_patches(h, seen["job"])) == 1
        finally:
            await h.close()


async def test_a_recycled_pid_of_a_job_that_exited_is_recovered_from_its_status_file(
    tmp_path: Path, lab: Lab
) -> None:
    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'pico.db'}")
    with _subreaper():
        seen, other = await _job_whose_pid_was_recycled(lab, backend, exited=True)
        h = await _open(backend, lab)
        try:
            job = await h.wait_for(seen["job"], timeout=10)
            assert job.status == "exited" and _result(job)["exit_code"] == 4
            assert other.poll() is None
            assert lab.lines() == ["start", "done"]
        finally:
            await h.close()


# ---------------------------------------------------------------------- 5: spawning


async def test_a_job_launched_before_its_identity_was_recorded_is_found_by_its_token(
    sql_backend: Backend, lab: Lab
) -> None:
    seen = await lab.killed_at(
        "job", sql_backend.url, sql_backend.session, str(lab.jobs), "after_launch", lab.script()
    )
    launched = ProcessIdentity.from_json(seen["identity"])
    assert _wrappers(lab.jobs) == [launched.pid]  # it started; the harness died
    h = await _open(sql_backend, lab)
    try:
        (job,) = (await h.tasks(kind="job")).items
        assert job.status == "spawning"  # the intent is durable, the identity is not
        assert isinstance(job.state, dict) and "identity" not in job.state
        assert job.state["intent"] == seen["intent"]
        waiting = asyncio.ensure_future(h.wait_for(job.id, timeout=10))
        _ = await asyncio.wait_for(_running(h, job.id), 5)
        adopted = await h.task(job.id)
        assert adopted is not None and isinstance(adopted.state, dict)
        identity = ProcessIdentity.from_json(adopted.state["identity"])
        assert (identity.pid, identity.start_ticks, identity.token) == (
            launched.pid,
            launched.start_ticks,
            launched.token,
        )
        assert identity.pgid == launched.pgid
        assert not waiting.done()
        lab.gate.touch()
        done = await waiting
        assert done.status == "exited" and _result(done)["exit_code"] == 4
        assert lab.lines() == ["start", "done"]  # one process only
        assert len(_terminal_patches(h, job.id)) == 1
    finally:
        await h.close()


async def _running(h: pico.Harness, job: int) -> None:
    while (t := await h.task(job)) is None or t.status != "running":
        await asyncio.sleep(0.01)


async def test_a_job_whose_harness_died_before_the_launch_is_launched_once_by_the_next_owner(
    sql_backend: Backend, lab: Lab
) -> None:
    seen = await lab.killed_at(
        "job",
        sql_backend.url,
        sql_backend.session,
        str(lab.jobs),
        "before_launch",
        lab.script(gated=False),
    )
    intent = LaunchIntent.from_json(seen["intent"])
    assert not os.path.exists(intent.stdout_path) and _wrappers(lab.jobs) == []
    assert lab.lines() == []  # nothing started
    h = await _open(sql_backend, lab)
    try:
        (job,) = (await h.tasks(kind="job")).items
        assert job.status == "spawning"
        done = await h.wait_for(job.id, timeout=10)
        assert done.status == "exited" and _result(done)["exit_code"] == 4
        # Check: launched now, under the intent the dead harness committed, once.
        assert isinstance(done.state, dict) and done.state["intent"] == seen["intent"]
        assert _result(done)["stdout_path"] == intent.stdout_path
        assert lab.lines() == ["start", "done"]
    finally:
        await h.close()


# ---------------------------------------------------------------------- 6: a schedule


async def _until_async(test: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await test():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_schedule_killed_while_collecting_creates_no_second_action_for_that_run(
    sql_backend: Backend, lab: Lab
) -> None:
    seen = await lab.killed_at(
        "schedule",
        sql_backend.url,
        sql_backend.session,
        str(lab.jobs),
        lab.script(),
        str(T0),
        str(EVERY),
    )
    s, j = seen["schedule"], seen["job"]
    clock = pico.FakeClock(T0 + EVERY + EVERY / 2)  # later, before the next due time
    h = await _open(sql_backend, lab, clock=clock)

    async def actions() -> list[pico.TaskSnapshot]:
        return [t for t in (await h.tasks(kind="job")).items if t.spawned_by == s]

    async def schedule() -> pico.TaskSnapshot:
        found = await h.task(s)
        assert found is not None
        return found

    drive: asyncio.Future[Any] | None = None
    try:
        assert (await schedule()).status == "collecting"
        waiting = asyncio.ensure_future(h.wait_for(j, timeout=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # J is adopted: recovery waits for its exit
        assert [a.id for a in await actions()] == [j]
        assert (await schedule()).status == "collecting"
        lab.gate.touch()
        assert (await waiting).status == "exited"
        # A background job's exit ends that supervision; the next drive lets S collect
        # (then it sleeps until the next due time on the fake clock).
        drive = asyncio.ensure_future(h.drive())

        async def collected() -> bool:
            return (await schedule()).status == "scheduled"

        await _until_async(collected, "the schedule to collect its action")
        sched = await schedule()
        assert [a.id for a in await actions()] == [j]  # no second J for that due time
        assert isinstance(sched.state, dict) and sched.state["runs_done"] == 1
        last_run = sched.state["last_run"]
        assert isinstance(last_run, dict)
        assert (last_run["due"], last_run["task"], last_run["status"], last_run["exit_code"]) == (
            T0 + EVERY,
            j,
            "exited",
            4,
        )
        assert sched.not_before == T0 + 2 * EVERY
        assert lab.lines() == ["start", "done"]

        # Check: the next due time does create the next J (the count above can see one).
        clock.advance(EVERY / 2)

        async def second() -> bool:
            return len(await actions()) == 2

        await _until_async(second, "the next run's action")
        current = _state(await schedule())["current"]
        assert current["due"] == T0 + 2 * EVERY and current["task"] != j
    finally:
        await h.close()
        if drive is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(drive, 5)
