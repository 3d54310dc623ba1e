"""Steps for jobs and schedules (§5.1, §5.6, §8.7, §9.3): OS processes started from a
conversation, cancelled, adopted after a restart; recurring schedules on a fake clock; an
agent tool that runs a job in the background.

Jobs are real ``sh -c`` processes. A job that must still be running when a step looks at it
waits for a release file the scenario creates ("runs until it is released"): a barrier, not
a sleep. A session drive supervises the work (``harness.wait_for``) in the background of the
scenario's event loop, across steps."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import Agent, World

DAY = 86_400.0
TIMEOUT = 10.0


@dataclass
class Jobs:
    """What the job steps keep between steps: the clock, where logs and release files go,
    the supervising drive, and each running job's first process id."""

    clock: pico.FakeClock
    directory: Path
    supervisor: asyncio.Future[Any] | None = None
    pids: dict[str, int] = field(default_factory=dict)
    away_since: float = 0.0


def _jobs(world: World) -> Jobs:
    found = getattr(world, "jobs", None)
    assert isinstance(found, Jobs), "the scenario has no job session"
    return found


async def _open(world: World, jobs: Jobs, **kwargs: Any) -> pico.Harness:
    # No ``definitions=``: the built-in job and schedule definitions are the harness's own.
    return await world.backend.open(
        clock=jobs.clock, job_directory=str(jobs.directory / "logs"), **kwargs
    )


@given(parsers.parse('a job session with conversation "{name}"'), target_fixture="world")
def a_job_session(world: World, name: str, tmp_path: Path) -> World:
    jobs = Jobs(pico.FakeClock(), tmp_path)
    world.jobs = jobs  # type: ignore[attr-defined]
    world.harness = world.run(_open(world, jobs))
    world.names[name] = world.run(world.h.root()).id
    return world


@given(
    parsers.parse(
        'an agent session with conversation "{name}" and a tool "{tool}" that runs '
        '"{script}" in the background'
    ),
    target_fixture="world",
)
def an_agent_session_with_a_job_tool(
    world: World, name: str, tool: str, script: str, tmp_path: Path
) -> World:
    clock = pico.FakeClock()
    jobs = Jobs(clock, tmp_path)
    world.jobs = jobs  # type: ignore[attr-defined]
    agent = Agent(pico.FauxProvider([], chunk_chars=4, cadence=1.0, clock=clock), clock)
    world.agent = agent
    delegation = pico.JobDelegation(("sh", "-c", script), background=True)

    async def run(args: pico.JsonObject, ctx: pico.ToolContext) -> pico.JobDelegation:
        agent.invoked.append(tool)
        return delegation

    tools = [pico.Tool(tool, f"Run {script}", {"type": "object"}, run)]
    world.harness = world.run(_open(world, jobs, provider=agent.provider, tools=tools))
    world.names[name] = world.run(world.h.root()).id
    return world


# ------------------------------------------------------------------ driving


def _supervise(world: World, task: str) -> None:
    """A session drive in the background until ``task`` is terminal (kept across steps)."""
    jobs = _jobs(world)
    if jobs.supervisor is not None and not jobs.supervisor.done():
        return

    async def start() -> asyncio.Future[Any]:
        future = asyncio.ensure_future(world.h.wait_for(world.id(task)))
        # A drive still running when the scenario ends stops with the harness.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        return future

    jobs.supervisor = world.run(start())


def _until(world: World, check: Callable[[], Awaitable[bool]], what: str) -> None:
    jobs = _jobs(world)

    async def poll() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT
        while not await check():
            sup = jobs.supervisor
            if sup is not None and sup.done() and not sup.cancelled() and sup.exception():
                raise AssertionError(f"the drive failed before {what}") from sup.exception()
            if loop.time() > deadline:
                raise AssertionError(f"timed out waiting until {what}")
            await asyncio.sleep(0.01)

    world.run(poll())


def _stop_supervising(world: World) -> None:
    jobs = _jobs(world)
    sup, jobs.supervisor = jobs.supervisor, None
    if sup is None or sup.done():
        return

    async def stop() -> None:
        sup.cancel()
        with contextlib.suppress(asyncio.CancelledError, pico.PicoError):
            await sup

    world.run(stop())


async def _task(world: World, name: str) -> pico.TaskSnapshot:
    task = await world.h.task(world.id(name))
    assert task is not None
    return task


def _state(task: pico.TaskSnapshot) -> dict[str, Any]:
    assert isinstance(task.state, dict)
    return task.state


async def _runs(world: World, schedule: str) -> list[pico.TaskSnapshot]:
    page = await world.h.tasks(kind="job", limit=1000)
    return [t for t in page.items if t.spawned_by == world.id(schedule)]


# ------------------------------------------------------------------ jobs: When


@when(parsers.parse('"{conv}" starts the job "{job}" running "{script}"'))
def starts_a_job(world: World, conv: str, job: str, script: str) -> None:
    world.names[job] = world.run(world.conv(conv).start_job(("sh", "-c", script)))


@when(parsers.parse('"{conv}" starts the job "{job}" that runs until it is released'))
def starts_a_held_job(world: World, conv: str, job: str) -> None:
    release = _jobs(world).directory / f"release-{job}"
    script = f"while [ ! -e '{release}' ]; do sleep 0.01; done; echo released"
    world.names[job] = world.run(world.conv(conv).start_job(("sh", "-c", script)))


@when(parsers.parse('job "{job}" is released'))
def job_released(world: World, job: str) -> None:
    (_jobs(world).directory / f"release-{job}").touch()


@when(parsers.parse('job "{job}" is running'))
def job_is_running(world: World, job: str) -> None:
    _supervise(world, job)

    async def running() -> bool:
        return (await _task(world, job)).status == "running"

    _until(world, running, f"job {job} runs")
    identity = _state(world.run(_task(world, job)))["identity"]
    _jobs(world).pids.setdefault(job, identity["pid"])


@when(parsers.parse('the session works until job "{job}" has settled'))
def works_until_job_settles(world: World, job: str) -> None:
    _supervise(world, job)

    async def settled() -> bool:
        return not (await _task(world, job)).live

    _until(world, settled, f"job {job} settles")


@when(parsers.parse('job "{job}" is cancelled from "{conv}"'))
@when(parsers.parse('schedule "{job}" is cancelled from "{conv}"'))
def cancelled_from(world: World, job: str, conv: str) -> None:
    marked = world.run(world.conv(conv).abort_background(world.id(job)))
    world.names["the marked"] = len(marked)


@when("the job session restarts")
def job_session_restarts(world: World) -> None:
    """The owner closes (its processes keep running) and a new owner opens the session."""
    jobs = _jobs(world)
    _stop_supervising(world)
    world.run(world.h.close())
    world.harness = world.run(_open(world, jobs))


# ------------------------------------------------------------------ jobs: Then


@then(parsers.parse('job "{job}" exited with code {code:d}, printing "{text}"'))
def job_exited(world: World, job: str, code: int, text: str) -> None:
    task = world.run(_task(world, job))
    assert task.status == "exited", task
    result = _state(task)["result"]
    assert result["exit_code"] == code and result["signal"] is None
    assert result["stdout_tail"] == f"{text}\n"
    assert Path(result["stdout_path"]).read_text() == f"{text}\n"  # the durable log


@then(parsers.parse('job "{job}" was killed by {name}'))
def job_killed(world: World, job: str, name: str) -> None:
    task = world.run(_task(world, job))
    assert task.status == "killed", task
    assert _state(task)["result"]["signal"] == getattr(signal, name)


@then(parsers.parse('job "{job}" is still running in the process it started in'))
def job_still_running(world: World, job: str) -> None:
    task = world.run(_task(world, job))
    assert task.status == "running", task
    assert _state(task)["identity"]["pid"] == _jobs(world).pids[job]


@then(parsers.parse('job "{job}" was run by one process'))
def one_process(world: World, job: str) -> None:
    state = _state(world.run(_task(world, job)))
    assert state["identity"]["pid"] == _jobs(world).pids[job]


# ------------------------------------------------------------------ agent tools


def _tool_results(world: World, conv: str) -> list[Any]:
    entries = world.run(world.conv(conv).context_entries())
    return [e.content for e in entries if e.kind == "tool"]


def _delegated_job(world: World, conv: str) -> pico.TaskSnapshot:
    page = world.run(world.h.tasks(conversation_ids=[world.id(conv)], kind="job"))
    (job,) = page.items
    assert isinstance(job, pico.TaskSnapshot)
    return job


@then(parsers.parse('the "{tool}" call in "{conv}" returned at once, naming its job'))
def tool_named_its_job(world: World, tool: str, conv: str) -> None:
    job = _delegated_job(world, conv)
    assert job.foreground is False
    expected = f"started job task {job.id} in the background"
    assert _tool_results(world, conv) == [{"content": expected, "is_error": False}]
    world.names[f"the job of {conv}"] = job.id


@then(parsers.parse('the job started by "{conv}" is later recorded as exited with code {code:d}'))
def delegated_job_recorded(world: World, conv: str, code: int) -> None:
    name = f"the job of {conv}"
    world.names[name] = _delegated_job(world, conv).id
    works_until_job_settles(world, name)
    task = world.run(_task(world, name))
    assert task.status == "exited" and _state(task)["result"]["exit_code"] == code, task


# ------------------------------------------------------------------ schedules


_EVERY = '"{conv}" schedules "{name}" to run "{script}" every {every:d} seconds'


def _schedule(world: World, conv: str, name: str, script: str, rec: pico.Recurrence) -> None:
    job = pico.LaunchSpec(("sh", "-c", script))
    world.names[name] = world.run(world.conv(conv).schedule(rec, job=job))


@given(parsers.parse(_EVERY))
@when(parsers.parse(_EVERY))
def schedules_every(world: World, conv: str, name: str, script: str, every: int) -> None:
    _schedule(world, conv, name, script, pico.Recurrence(every=every))


@given(parsers.parse(_EVERY + ", catching up at most {n:d} missed runs"))
@when(parsers.parse(_EVERY + ", catching up at most {n:d} missed runs"))
def schedules_catching_up(
    world: World, conv: str, name: str, script: str, every: int, n: int
) -> None:
    rec = pico.Recurrence(every=every, missed="catch_up", catch_up_limit=n)
    _schedule(world, conv, name, script, rec)


@when(parsers.parse("the harness is away for {days:d} days"))
def harness_away(world: World, days: int) -> None:
    jobs = _jobs(world)
    jobs.clock.advance(days * DAY)
    jobs.away_since = jobs.clock.now()


@when(parsers.parse("{seconds:d} seconds pass"))
def seconds_pass(world: World, seconds: int) -> None:
    _jobs(world).clock.advance(seconds)


@when(parsers.parse('schedule "{name}" works until it waits for its next run'))
def works_until_next_run(world: World, name: str) -> None:
    _supervise(world, name)
    clock = _jobs(world).clock

    async def waiting() -> bool:
        task = await _task(world, name)
        runs = await _runs(world, name)
        return (
            task.status == "scheduled"
            and task.not_before is not None
            and task.not_before > clock.now()
            and all(not r.live for r in runs)
        )

    _until(world, waiting, f"schedule {name} waits for its next run")


@when(parsers.parse('the first run of schedule "{name}" is running'))
def first_run_running(world: World, name: str) -> None:
    _supervise(world, name)

    async def running() -> bool:
        runs = await _runs(world, name)
        return len(runs) == 1 and runs[0].status == "running"

    _until(world, running, f"the first run of {name} runs")
    world.names[f"the run of {name}"] = world.run(_runs(world, name))[0].id


@then(parsers.parse('schedule "{name}" launched {n:d} runs, each after the one before had ended'))
def launched_runs(world: World, name: str, n: int) -> None:
    runs = world.run(_runs(world, name))
    assert len(runs) == n and all(r.status == "exited" for r in runs), runs
    for before, after in itertools.pairwise(runs):
        assert after.id > before.updated_seq  # created after the earlier run's exit
    assert _state(world.run(_task(world, name)))["runs_done"] == n


@then(parsers.parse('the last run of schedule "{name}" was the one due when the harness returned'))
def last_run_due_at_return(world: World, name: str) -> None:
    last = _state(world.run(_task(world, name)))["last_run"]
    assert last["due"] == _jobs(world).away_since
    assert (last["status"], last["exit_code"]) == ("exited", 0)


@then(parsers.parse('schedule "{name}" skipped {n:d} missed runs'))
def skipped_runs(world: World, name: str, n: int) -> None:
    assert _state(world.run(_task(world, name)))["skipped"] == n


@then(parsers.parse('schedule "{name}" waits for its next due time, {seconds:d} seconds from now'))
def next_due(world: World, name: str, seconds: int) -> None:
    task = world.run(_task(world, name))
    assert task.status == "scheduled"
    assert task.not_before == _jobs(world).clock.now() + seconds


@then(parsers.parse('schedule "{name}" and its run were both marked for cancellation'))
def both_marked(world: World, name: str) -> None:
    assert world.names["the marked"] == 2


@then(parsers.parse('schedule "{name}" was aborted and its run was killed by {signame}'))
def schedule_aborted(world: World, name: str, signame: str) -> None:
    _supervise(world, name)

    async def settled() -> bool:
        run = await _task(world, f"the run of {name}")
        return not (await _task(world, name)).live and not run.live

    _until(world, settled, f"schedule {name} and its run settle")
    assert world.run(_task(world, name)).status == "aborted"
    job_killed(world, f"the run of {name}", signame)


@then(parsers.parse('schedule "{name}" launches no further run, however much time passes'))
def no_further_run(world: World, name: str) -> None:
    before = len(world.run(_runs(world, name)))
    _jobs(world).clock.advance(DAY)
    assert world.run(asyncio.wait_for(world.h.drive(), TIMEOUT)) == "idle"
    assert len(world.run(_runs(world, name))) == before
