"""Jobs through the public API (§5.1, §5.6, §6.2-§6.6, §8.7, §9.3; issue 14): real OS
processes (short ``sh -c`` programs), real log and status files, every backend. A job that
must be running while the test looks at it waits for a GO file the test creates: a barrier,
not a sleep."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

import pico
from pico import FauxProvider, FauxResponse
from tests.backends import Backend

#: Long enough never to end by itself within a test; every use is stopped or released.
FOREVER = 30
#: Seconds a wait may take before the test fails: generous, since the machine may be busy;
#: the tests pass in milliseconds when the code is right.
TIMEOUT = 10.0


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


def _result(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    result = _state(task)["result"]
    assert isinstance(result, dict)
    return result


async def _open(backend: Backend, tmp_path: Path, **kwargs: Any) -> pico.Harness:
    return await backend.open(job_directory=str(tmp_path / "jobs"), **kwargs)


def _statuses(h: pico.Harness, job: int) -> list[str]:
    """The job's status after each of its stored events, in order."""
    return [
        str(r.payload["status"])
        for r in h.audit(limit=100_000)
        if r.aggregate == f"task/{job}" and "status" in r.payload
    ]


def _gated(go: Path, then: str = "exit 0", before: str = "") -> tuple[str, ...]:
    """A program that runs ``before``, waits until the file ``go`` exists, then ``then``."""
    return ("sh", "-c", f"{before}\nwhile [ ! -e '{go}' ]; do sleep 0.01; done\n{then}")


def _alive(pid: int) -> bool:
    """Is ``pid`` a running (not zombie) process?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return False
    return text[text.rindex(b")") + 2 :].split()[0] not in (b"Z", b"X")


async def _until(predicate: Any, timeout: float = TIMEOUT) -> None:
    """Poll a cheap condition (a file appearing, a process ending) without a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.005)


async def _running(h: pico.Harness, job: int) -> pico.TaskSnapshot:
    """Drive the session until the background job runs: the drive then only waits for its
    exit, an outside event, and reports ``suspended``."""
    assert await asyncio.wait_for(h.drive(), TIMEOUT) == "suspended"
    task = await h.task(job)
    assert task is not None and task.status == "running"
    return task


# ---------------------------------------------------------------------- exit and output
async def test_a_job_that_exits_records_its_code_output_and_every_status(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sh", "-c", "echo out; echo err >&2; exit 3"))
    planned = await h.task(job)
    assert planned is not None and planned.status == "planned" and planned.kind == "job"
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited"
    result = _result(done)
    assert result["exit_code"] == 3 and result["signal"] is None
    assert result["stdout_tail"] == "out\n" and result["stderr_tail"] == "err\n"
    assert result["stdout_bytes"] == 4 and result["stderr_bytes"] == 4
    assert result["stdout_truncated"] is False and result["stderr_truncated"] is False
    assert Path(result["stdout_path"]).read_bytes() == b"out\n"
    assert Path(result["stderr_path"]).read_bytes() == b"err\n"
    # Check the intent (token, logs, status file in job_directory) came before the identity.
    state = _state(done)
    intent, identity = state["intent"], state["identity"]
    assert Path(intent["status_path"]).parent == tmp_path / "jobs"
    assert Path(intent["status_path"]).is_file()
    assert intent["stdout_path"] == result["stdout_path"]
    assert identity["token"] == intent["token"] and identity["pid"] > 0
    assert _statuses(h, job) == ["planned", "spawning", "running", "exited"]
    spawning = [
        r.payload
        for r in h.audit(limit=100_000)
        if r.aggregate == f"task/{job}" and r.payload.get("status") == "spawning"
    ]
    assert '"intent"' in str(spawning[0]["state"])
    assert '"identity"' not in str(spawning[0]["state"])
    await h.close()


async def test_a_job_killed_by_a_signal_from_inside_is_exited_with_that_signal(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sh", "-c", "kill -9 $$"))
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited"
    assert _result(done)["signal"] == 9 and _result(done)["exit_code"] is None
    await h.close()


async def test_output_beyond_the_log_cap_is_counted_but_not_kept(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(
        ("sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; echo small >&2"), log_cap=100
    )
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["exit_code"] == 0
    result = _result(done)
    assert result["stdout_truncated"] is True and result["stdout_bytes"] == 5000
    marker = b"\n[pico: log truncated at 100 bytes; further output was discarded]\n"
    assert Path(result["stdout_path"]).read_bytes() == b"a" * 100 + marker
    assert result["stdout_tail"] == "a" * 100  # the tail is of what the log kept
    assert result["stderr_truncated"] is False and result["stderr_tail"] == "small\n"
    await h.close()


async def test_a_job_runs_its_argv_in_its_cwd_with_exactly_its_env(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(
        ("sh", "-c", 'echo "$FOO:${HOME:-unset}"; pwd'), cwd=str(tmp_path), env={"FOO": "bar"}
    )
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited"
    assert _result(done)["stdout_tail"] == f"bar:unset\n{tmp_path}\n"
    await h.close()


async def test_a_program_that_cannot_be_found_exits_127_with_the_reason_on_stderr(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("pico-no-such-program",))
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["exit_code"] == 127
    assert "cannot run 'pico-no-such-program'" in _result(done)["stderr_tail"]
    await h.close()


async def test_background_jobs_run_at_the_same_time(backend: Backend, tmp_path: Path) -> None:
    go = tmp_path / "go"
    h = await _open(backend, tmp_path)
    c = await h.root()
    jobs = [await c.start_job(_gated(go, then=f"exit {n}")) for n in (1, 2, 3)]
    assert await asyncio.wait_for(h.drive(), TIMEOUT) == "suspended"
    found = await h.get_tasks(jobs)
    assert [found[j].status for j in jobs] == ["running"] * 3  # none waits for another
    assert len({_state(found[j])["identity"]["pid"] for j in jobs}) == 3
    go.touch()
    done = [await h.wait_for(j, timeout=TIMEOUT) for j in jobs]
    assert [_result(t)["exit_code"] for t in done] == [1, 2, 3]
    await h.close()


# ---------------------------------------------------------------------- abort
async def test_aborting_a_job_before_it_starts_kills_it_with_no_process(
    backend: Backend, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sh", "-c", f"echo ran > '{ran}'"))
    assert await c.abort_background(job) == [job]
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "killed"
    assert _state(done)["reason"] == "cancelled before it started"
    assert "intent" not in _state(done) and "result" not in _state(done)
    assert _statuses(h, job) == ["planned", "killed"]
    assert not ran.exists() and not (tmp_path / "jobs").exists()
    await h.close()


async def test_aborting_a_settled_job_is_refused_and_writes_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("true",))
    assert (await h.wait_for(job, timeout=TIMEOUT)).status == "exited"
    head = h.head()
    with pytest.raises(pico.CommandRejectedError, match=f"task {job} is not live"):
        await c.abort_background(job)
    assert h.head() == head
    assert (await h.wait_for(job, timeout=TIMEOUT)).status == "exited"  # a settled job: at once
    await h.close()


async def test_aborting_a_running_job_stops_it_with_sigterm_well_within_the_grace(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sleep", str(FOREVER)), grace=60)
    pid = _state(await _running(h, job))["identity"]["pid"]
    assert _alive(pid)
    started = time.monotonic()
    assert await c.abort_background(job) == [job]
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT  # SIGTERM ended it, not SIGKILL after 60 s
    assert done.status == "killed"
    assert _result(done)["signal"] == 15 and _result(done)["exit_code"] is None
    assert not _alive(pid)
    assert _statuses(h, job)[-2:] == ["running", "killed"]
    await h.close()


async def test_a_job_that_ignores_sigterm_is_killed_after_its_grace(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    trapped = tmp_path / "trapped"
    job = await c.start_job(
        ("sh", "-c", f"trap '' TERM; touch '{trapped}'; sleep {FOREVER}"), grace=0.3
    )
    await _running(h, job)
    # Aborted only once the shell ignores SIGTERM: a SIGTERM before its trap is installed
    # would end it with 15 (a race the suite lost once on a fast machine).
    await _until(trapped.exists)
    started = time.monotonic()
    await c.abort_background(job)
    done = await h.wait_for(job, timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert done.status == "killed" and _result(done)["signal"] == 9
    assert 0.3 <= elapsed < TIMEOUT
    await h.close()


async def test_shutdown_stops_a_running_background_job(backend: Backend, tmp_path: Path) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sleep", str(FOREVER)))
    pid = _state(await _running(h, job))["identity"]["pid"]
    await asyncio.wait_for(h.shutdown(), TIMEOUT)
    assert not _alive(pid)
    again = await _open(backend, tmp_path)
    done = await again.task(job)
    assert done is not None and done.status == "killed" and _result(done)["signal"] == 15
    await again.close()


async def test_shutdown_by_the_next_owner_stops_a_job_the_last_one_started(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sleep", str(FOREVER)))
    pid = _state(await _running(h, job))["identity"]["pid"]
    await h.close()
    again = await _open(backend, tmp_path)
    await asyncio.wait_for(again.shutdown(), TIMEOUT)
    assert not _alive(pid)
    third = await _open(backend, tmp_path)
    done = await third.task(job)
    assert done is not None and done.status == "killed" and _result(done)["signal"] == 15
    await third.close()


# ---------------------------------------------------------------------- close and reopen
async def test_closing_the_harness_ends_a_wait_for_with_closed_error_and_the_job_runs_on(
    backend: Backend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(_gated(go, then="exit 5"))
    pid = _state(await _running(h, job))["identity"]["pid"]
    waiting = asyncio.ensure_future(h.wait_for(job))
    await asyncio.sleep(0)  # the wait has started
    await h.close()
    with pytest.raises(pico.ClosedError):
        await asyncio.wait_for(waiting, TIMEOUT)
    assert _alive(pid)
    go.touch()
    again = await _open(backend, tmp_path)
    done = await again.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["exit_code"] == 5
    await again.close()


async def test_close_leaves_a_job_running_and_the_next_owner_adopts_it_without_a_second_launch(
    backend: Backend, tmp_path: Path
) -> None:
    go, starts = tmp_path / "go", tmp_path / "starts"
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(_gated(go, then="exit 4", before=f"echo started >> '{starts}'"))
    identity = _state(await _running(h, job))["identity"]
    await h.close()
    assert _alive(identity["pid"])  # close only detached observation
    again = await _open(backend, tmp_path)
    still = await again.wait_for(job, timeout=0.2)  # adopted: observed, not relaunched
    assert still.status == "running" and _state(still)["identity"] == identity
    go.touch()
    done = await again.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["exit_code"] == 4
    assert starts.read_text() == "started\n"  # exactly one process ran
    assert _statuses(again, job) == ["planned", "spawning", "running", "exited"]
    await again.close()


async def test_reopening_after_the_job_exited_unwatched_recovers_its_exit_code(
    backend: Backend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(_gated(go, then="echo finished; exit 7"))
    state = _state(await _running(h, job))
    await h.close()
    go.touch()
    status = Path(state["intent"]["status_path"])
    await _until(status.exists)  # the wrapper wrote its status while nobody watched
    await _until(lambda: not _alive(state["identity"]["pid"]))
    again = await _open(backend, tmp_path)
    done = await again.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited"
    assert _result(done)["exit_code"] == 7 and _result(done)["stdout_tail"] == "finished\n"
    assert _statuses(again, job) == ["planned", "spawning", "running", "exited"]
    await again.close()


# ---------------------------------------------------------------------- observation
async def test_a_running_background_job_suspends_a_session_drive_but_not_a_conversation_drive(
    backend: Backend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(_gated(go))
    await _running(h, job)  # the session drive: "suspended"
    assert await asyncio.wait_for(c.drive(), TIMEOUT) == "idle"  # detached: not waited for
    task = await h.task(job)
    assert task is not None and task.status == "running"
    go.touch()
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["exit_code"] == 0
    await h.close()


# ---------------------------------------------------------------------- tool delegation
def _job_tool(delegation: pico.JobDelegation) -> pico.Tool:
    async def build(args: pico.JsonObject, ctx: pico.ToolContext) -> pico.JobDelegation:
        return delegation

    return pico.Tool("build", "Run the build", {"type": "object"}, build)


def _build_call() -> FauxResponse:
    return FauxResponse(tool_calls=[("build", {})])


async def _jobs(h: pico.Harness, conversation: int) -> list[pico.TaskSnapshot]:
    return list((await h.tasks(conversation_ids=[conversation], kind="job")).items)


async def _foreground_job_running(h: pico.Harness, c: pico.ConversationHandle) -> pico.TaskSnapshot:
    """The conversation's one job once it runs (a concurrent drive launches it)."""

    async def running() -> pico.TaskSnapshot:
        while True:
            jobs = await _jobs(h, c.id)
            if jobs and jobs[0].status == "running":
                return jobs[0]
            await asyncio.sleep(0.005)

    return await asyncio.wait_for(running(), TIMEOUT)


async def _tool_results(c: pico.ConversationHandle) -> list[Any]:
    return [e.content for e in await c.context_entries() if e.kind == "tool"]


async def test_a_foreground_job_delegation_makes_the_exchange_wait_for_the_process(
    backend: Backend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    provider = FauxProvider([_build_call(), "the build passed"])
    delegation = pico.JobDelegation(_gated(go, then="echo built"), background=False)
    h = await _open(backend, tmp_path, provider=provider, tools=[_job_tool(delegation)])
    c = await h.root()
    prompt = asyncio.ensure_future(c.prompt("build it"))

    job = await _foreground_job_running(h, c)
    assert job.foreground is True
    await asyncio.sleep(0.05)  # the process is still gated: the drive must not return
    assert not prompt.done()
    go.touch()
    _, result = await asyncio.wait_for(prompt, TIMEOUT)
    assert result is not None and result.status == "done"
    (content,) = await _tool_results(c)
    assert content["is_error"] is False
    assert f"job {job.id} exited with code 0" in content["content"]
    assert "built" in content["content"]
    # Check the model's next request carried the job's outcome.
    assert len(provider.requests) == 2
    assert "exited with code 0" in repr(provider.requests[1].messages)
    done = await h.task(job.id)
    assert done is not None and done.status == "exited"
    await h.close()


async def test_a_background_job_delegation_names_the_job_at_once_and_the_job_runs_on(
    backend: Backend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    provider = FauxProvider([_build_call(), "started the build"])
    delegation = pico.JobDelegation(_gated(go, then="echo built"), background=True)
    h = await _open(backend, tmp_path, provider=provider, tools=[_job_tool(delegation)])
    c = await h.root()
    _, result = await asyncio.wait_for(c.prompt("build it"), TIMEOUT)
    assert result is not None and result.status == "done"  # not waiting for the process
    (job,) = await _jobs(h, c.id)
    assert job.foreground is False and job.live
    assert await _tool_results(c) == [
        {"content": f"started job task {job.id} in the background", "is_error": False}
    ]
    (tool,) = (await h.tasks(conversation_ids=[c.id], kind="tool")).items
    assert _state(tool)["details"]["job"] == job.id
    assert await asyncio.wait_for(c.drive(), TIMEOUT) == "idle"
    assert (await h.task(job.id)).live  # type: ignore[union-attr]
    go.touch()
    done = await h.wait_for(job.id, timeout=TIMEOUT)
    assert done.status == "exited" and _result(done)["stdout_tail"] == "built\n"
    await h.close()


async def test_aborting_a_foreground_job_kills_it_and_the_call_gets_an_error_result(
    backend: Backend, tmp_path: Path
) -> None:
    provider = FauxProvider([_build_call(), "the build was stopped"])
    delegation = pico.JobDelegation(("sleep", str(FOREVER)), background=False)
    h = await _open(backend, tmp_path, provider=provider, tools=[_job_tool(delegation)])
    c = await h.root()
    await c.accept("build it")
    drive = asyncio.ensure_future(c.drive())

    job = await _foreground_job_running(h, c)
    pid = _state(job)["identity"]["pid"]
    marked = await c.abort()
    assert job.id in marked
    assert await asyncio.wait_for(drive, TIMEOUT) == "idle"
    done = await h.task(job.id)
    assert done is not None and done.status == "killed" and _result(done)["signal"] == 15
    assert not _alive(pid)
    assert await _tool_results(c) == [{"content": "aborted", "is_error": True}]
    assert len(provider.requests) == 1  # the aborted exchange asked the model nothing more
    await h.close()


async def test_a_foreground_job_outlives_close_and_the_reopened_drive_finishes_the_call(
    backend: Backend, tmp_path: Path
) -> None:
    go, starts = tmp_path / "go", tmp_path / "starts"
    delegation = pico.JobDelegation(
        _gated(go, then="echo built", before=f"echo started >> '{starts}'"), background=False
    )
    provider = FauxProvider([_build_call()])
    h = await _open(backend, tmp_path, provider=provider, tools=[_job_tool(delegation)])
    c = await h.root()
    question = await c.accept("build it")
    drive = asyncio.ensure_future(c.drive())
    job = await _foreground_job_running(h, c)
    await h.close()
    assert await asyncio.wait_for(drive, TIMEOUT) == "closed"
    assert _alive(_state(job)["identity"]["pid"])
    go.touch()
    provider = FauxProvider(["the build passed"])
    again = await _open(backend, tmp_path, provider=provider, tools=[_job_tool(delegation)])
    c = await again.root()
    assert await asyncio.wait_for(c.drive(), TIMEOUT) == "idle"  # adopts J, then finishes the call
    (content,) = await _tool_results(c)
    assert content == {
        "content": f"job {job.id} exited with code 0\n--- stdout (tail) ---\nbuilt\n",
        "is_error": False,
    }
    result = await c.result(question)
    assert result is not None and result.status == "done"
    assert starts.read_text() == "started\n"  # one process, across both owners
    assert "exited with code 0" in repr(provider.requests[0].messages)
    await again.close()


async def test_a_malformed_job_delegation_is_the_calls_error_result_and_starts_no_job(
    backend: Backend, tmp_path: Path
) -> None:
    async def build(args: pico.JsonObject, ctx: pico.ToolContext) -> pico.JobDelegation:
        return pico.JobDelegation(())

    provider = FauxProvider([_build_call(), "the build could not start"])
    tool = pico.Tool("build", "Run the build", {"type": "object"}, build)
    h = await _open(backend, tmp_path, provider=provider, tools=[tool])
    c = await h.root()
    _, result = await asyncio.wait_for(c.prompt("build it"), TIMEOUT)
    assert result is not None and result.status == "done"
    (content,) = await _tool_results(c)
    assert content["is_error"] is True and "argv is empty" in content["content"]
    assert await _jobs(h, c.id) == []
    await h.close()


# ---------------------------------------------------------------------- bad input
BAD_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("empty argv", {"argv": ()}),
    ("argv a string", {"argv": "echo hi"}),
    ("argv not a list", {"argv": 5}),
    ("NUL in an argument", {"argv": ("echo", "a\x00b")}),
    ("env key with =", {"env": {"A=B": "x"}}),
    ("empty env key", {"env": {"": "x"}}),
    ("env value not a str", {"env": {"A": 1}}),
    ("log_cap 0", {"log_cap": 0}),
    ("log_cap a bool", {"log_cap": True}),
    ("grace negative", {"grace": -1.0}),
    ("grace NaN", {"grace": math.nan}),
    ("grace a bool", {"grace": True}),
    ("cwd missing", {"cwd": "/nonexistent/pico-job-dir"}),
]


async def test_bad_job_input_is_a_typed_error_that_writes_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    h = await _open(backend, tmp_path)
    c = await h.root()
    head = h.head()
    for what, change in BAD_JOBS:
        kwargs: dict[str, Any] = {"argv": ("true",), **change}
        argv = kwargs.pop("argv")
        with pytest.raises(pico.InvalidArgumentError) as caught:
            await c.start_job(argv, **kwargs)
        assert isinstance(caught.value, pico.PicoError), what
        assert h.head() == head, f"{what} wrote something"
    assert list((await h.tasks(kind="job")).items) == []
    for timeout in (-1, math.inf, True, "1"):
        with pytest.raises(pico.InvalidArgumentError):
            await h.wait_for(1, timeout=timeout)  # type: ignore[arg-type]
    assert h.head() == head
    # Check the handle is still usable after every refusal.
    job = await c.start_job(("true",))
    assert (await h.wait_for(job, timeout=TIMEOUT)).status == "exited"
    await h.close()


@pytest.mark.parametrize(
    "options",
    [{"job_directory": ""}, {"job_directory": "a\x00b"}, {"job_directory": 5}, {"host": object()}],
    ids=["empty job_directory", "NUL job_directory", "job_directory an int", "host an object"],
)
async def test_bad_job_options_refuse_to_open_the_harness(
    options: dict[str, Any], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'pico.db'}"
    with pytest.raises(pico.InvalidArgumentError):
        await pico.Harness.open(url, session="main", **options)
    assert not (tmp_path / "pico.db").exists()  # nothing was created


async def test_a_launch_the_host_refuses_after_the_intent_is_failed_and_starts_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    h = await _open(backend, tmp_path)
    c = await h.root()
    job = await c.start_job(("sh", "-c", f"echo ran > '{tmp_path / 'ran'}'"), cwd=str(work))
    work.rmdir()  # gone between the start and the launch
    done = await h.wait_for(job, timeout=TIMEOUT)
    assert done.status == "failed"
    state = _state(done)
    assert str(work) in state["reason"]
    assert "identity" not in state and "result" not in state
    assert not Path(state["intent"]["stdout_path"]).exists()  # no launch was attempted
    assert not (tmp_path / "ran").exists()
    assert _statuses(h, job) == ["planned", "spawning", "failed"]
    await h.close()


@pytest.mark.parametrize(
    "fields",
    [{"env": 5}, {"log_cap": "big"}, {"argv": ["a\x00b"]}, {"grace": -1}, {"cwd": ""}],
    ids=["env an int", "log_cap a str", "NUL in argv", "negative grace", "empty cwd"],
)
async def test_a_job_task_created_directly_with_a_bad_spec_is_refused_at_creation(
    backend: Backend, tmp_path: Path, fields: dict[str, Any]
) -> None:
    """tx.create_task("job", ...) checks the launch fields as start_job does, so a bad spec
    never reaches a drive (where it would fault the handle)."""
    h = await _open(backend, tmp_path)
    c = await h.root()
    before = h.head()
    state = {"argv": ["true"], "directory": str(tmp_path / "jobs"), **fields}
    with pytest.raises(pico.TaskDefinitionError, match="state rejected"):
        await h.command(lambda tx: tx.create_task(c.id, "job", state=state))
    assert h.head() == before
    job = await c.start_job(["true"])  # the handle still works
    assert (await h.wait_for(job, timeout=TIMEOUT)).status == "exited"
    await h.close()
