"""Schedules (§8.7; issue 14) with real processes on every backend and the shipped fake clock:
interval and cron due times, the missed-run policies after a 10-day outage, completion,
abort while an action runs, a subagent action, bad input, and a reopen while collecting.

A session drive supervises the schedule (``harness.wait_for(S)``): it sleeps on the fake
clock until the next due time and waits for a background job's exit. A job that must stay
running while a state is read waits for a gate file the test creates: a barrier, not a
sleep."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import pico
from pico import FakeClock, FauxProvider, LaunchSpec, Recurrence
from tests.backends import Backend
from tests.contract.test_subagents import GatedProvider

DAY = 86_400.0


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


def _echo(text: str = "tick") -> LaunchSpec:
    return LaunchSpec(("sh", "-c", f"echo {text}"))


def _gated(gate: Path) -> LaunchSpec:
    """A job that runs until ``gate`` exists, then prints ``tick`` and exits 0."""
    return LaunchSpec(("sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.01; done; echo tick"))


async def _open(backend: Backend, tmp_path: Path, clock: FakeClock, **kw: Any) -> pico.Harness:
    return await backend.open(clock=clock, job_directory=str(tmp_path / "jobs"), **kw)


async def _jobs(h: pico.Harness) -> list[pico.TaskSnapshot]:
    return list((await h.tasks(kind="job", limit=1000)).items)


async def _until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    supervisor: asyncio.Future[Any] | None = None,
    timeout: float = 5.0,
) -> None:
    """Poll ``check`` (real processes take real time) until it holds; fail naming ``what``,
    or with the supervising drive's own error if it ended first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if supervisor is not None and supervisor.done():
            supervisor.result()  # re-raises the drive's error
            if not await check():
                raise AssertionError(f"the drive ended before {what}")
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _supervised(h: pico.Harness, s: int) -> AsyncIterator[asyncio.Future[pico.TaskSnapshot]]:
    """A session drive supervising S until it is terminal; stopped (cancelled) if it is not.
    A failing check closes the harness, so its processes and connections do not leak."""
    sup = asyncio.ensure_future(h.wait_for(s))
    try:
        yield sup
    except BaseException:
        await h.close()
        raise
    finally:
        sup.cancel()
        with contextlib.suppress(asyncio.CancelledError, pico.ClosedError):
            await sup


async def _status(h: pico.Harness, task_id: int) -> str:
    task = await h.task(task_id)
    assert task is not None
    return task.status


def _scheduled_at(h: pico.Harness, s: int, when: float) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        task = await h.task(s)
        assert task is not None
        return task.status == "scheduled" and task.not_before == when

    return check


# ------------------------------------------------------------------ 1. interval


async def test_an_interval_schedule_runs_one_job_per_due_time_and_records_its_outcome(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    created = clock.now()
    gate = tmp_path / "gate"
    s = await c.schedule(Recurrence(every=60), job=_gated(gate))
    task = await h.task(s)
    assert task is not None and task.kind == "schedule"
    assert (task.status, task.not_before, task.after) == ("scheduled", created + 60, ())
    async with _supervised(h, s) as sup:
        # Check: nothing runs before the due time.
        await asyncio.sleep(0.05)
        assert await _jobs(h) == []
        clock.advance(60)

        async def running() -> bool:
            jobs = await _jobs(h)
            return bool(jobs) and jobs[0].status == "running"

        await _until(running, "the first job runs", sup)
        (job,) = await _jobs(h)
        assert job.spawned_by == s and job.foreground is False
        task = await h.task(s)
        assert task is not None
        assert (task.status, task.after, task.not_before) == ("collecting", (job.id,), None)
        assert _state(task)["current"] == {"due": created + 60, "task": job.id}
        gate.touch()
        await _until(_scheduled_at(h, s, created + 120), "S is scheduled again", sup)
        task = await h.task(s)
        state = _state(task)
        assert task is not None and task.after == ()
        assert state["runs_done"] == 1 and state["current"] is None
        assert state["last_run"] == {
            "due": created + 60,
            "task": job.id,
            "kind": "job",
            "status": "exited",
            "exit_code": 0,
            "signal": None,
        }
        assert state["outcomes"] == {"exited": 1}
        assert [j.id for j in await _jobs(h)] == [job.id]  # exactly one J for the due time
        assert await _status(h, job.id) == "exited"
        assert _state(await h.task(job.id))["result"]["stdout_tail"] == "tick\n"
    await h.close()


# ------------------------------------------------------------------ 2. cron


async def test_a_cron_schedule_is_due_at_each_next_five_minute_boundary(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock(start=1_000_000.0)  # 13:46:40 UTC: the next */5 minute is 13:50:00
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    s = await c.schedule(Recurrence(cron="*/5 * * * *"), job=_echo())
    task = await h.task(s)
    assert task is not None and (task.status, task.not_before) == ("scheduled", 1_000_200.0)
    async with _supervised(h, s) as sup:
        clock.advance(200)
        await _until(_scheduled_at(h, s, 1_000_500.0), "the run after is due at 13:55", sup)
        state = _state(await h.task(s))
        assert state["runs_done"] == 1 and state["last_run"]["due"] == 1_000_200.0
        assert len(await _jobs(h)) == 1
    await h.close()


# ------------------------------------------------------------------ 3. outage


async def test_a_ten_day_outage_catches_up_only_the_newest_n_runs_one_at_a_time(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    t0 = clock.now()
    gate = tmp_path / "gate"
    rec = Recurrence(every=60, missed="catch_up", catch_up_limit=3)
    s = await c.schedule(rec, job=_gated(gate))
    clock.advance(10 * DAY)  # 14,400 due times passed while nobody drove
    now = clock.now()
    async with _supervised(h, s) as sup:

        async def first_running() -> bool:
            jobs = await _jobs(h)
            return bool(jobs) and jobs[0].status == "running"

        await _until(first_running, "the first catch-up run is running", sup)
        state = _state(await h.task(s))
        # Check: the newest three due times, the oldest of them first; the rest wait.
        assert state["current"]["due"] == now - 120
        assert state["backlog"] == [now - 60, now]
        assert state["skipped"] == 14_400 - 3
        assert len(await _jobs(h)) == 1  # one at a time
        gate.touch()
        await _until(_scheduled_at(h, s, now + 60), "S waits for its next due time", sup)
    jobs = await _jobs(h)
    assert len(jobs) == 3 and all(j.spawned_by == s and j.status == "exited" for j in jobs)
    # Check: each J was created only after the one before it had settled.
    for before, after in itertools.pairwise(jobs):
        assert after.id > before.updated_seq
    state = _state(await h.task(s))
    assert state["runs_done"] == 3 and state["skipped"] == 14_397
    assert state["last_run"]["due"] == now and state["backlog"] == []
    assert t0 + 10 * DAY == now
    await h.close()


async def test_a_ten_day_outage_runs_a_once_schedule_a_single_time(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    s = await c.schedule(Recurrence(every=60, missed="once"), job=_echo())
    clock.advance(10 * DAY)
    now = clock.now()
    async with _supervised(h, s) as sup:
        await _until(_scheduled_at(h, s, now + 60), "S waits for its next due time", sup)
    (job,) = await _jobs(h)
    state = _state(await h.task(s))
    assert state["runs_done"] == 1 and state["skipped"] == 14_399
    assert state["last_run"] == {
        "due": now,
        "task": job.id,
        "kind": "job",
        "status": "exited",
        "exit_code": 0,
        "signal": None,
    }
    await h.close()


async def test_a_ten_day_outage_skips_every_late_run_and_counts_them_once(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    t0 = clock.now()
    s = await c.schedule(Recurrence(every=60, missed="skip", grace=30), job=_echo())
    clock.advance(10 * DAY + 45)  # the newest due time is 45 s late: beyond the grace
    async with _supervised(h, s) as sup:
        next_due = t0 + 10 * DAY + 60
        await _until(_scheduled_at(h, s, next_due), "S is planned past the outage", sup)
        assert await _jobs(h) == []
        state = _state(await h.task(s))
        assert state["runs_done"] == 0 and state["skipped"] == 14_400
        # Check: the next plan starts after the skipped window, not at the creation time.
        clock.advance(15)
        await _until(_scheduled_at(h, s, next_due + 60), "the on-time run ran", sup)
        state = _state(await h.task(s))
        assert state["runs_done"] == 1 and state["skipped"] == 14_400
        assert state["last_run"]["due"] == next_due
        assert len(await _jobs(h)) == 1
    await h.close()


# ------------------------------------------------------------------ 4. completion


@pytest.mark.parametrize("end", ["count", "until"])
async def test_a_schedule_completes_after_its_last_run(
    backend: Backend, tmp_path: Path, end: str
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    t0 = clock.now()
    rec = Recurrence(every=60, count=2) if end == "count" else Recurrence(every=60, until=t0 + 150)
    s = await c.schedule(rec, job=_echo())
    async with _supervised(h, s) as sup:
        clock.advance(60)
        await _until(_scheduled_at(h, s, t0 + 120), "the first run settled", sup)
        clock.advance(60)
        final = await asyncio.wait_for(sup, 5)
    assert final.status == "complete" and final.not_before is None
    state = _state(final)
    assert state["runs_done"] == 2 and state["outcomes"] == {"exited": 2}
    assert state["last_run"]["due"] == t0 + 120
    jobs = await _jobs(h)
    assert [j.status for j in jobs] == ["exited", "exited"]
    clock.advance(600)
    assert await h.drive() == "idle"
    assert len(await _jobs(h)) == 2
    await h.close()


# ------------------------------------------------------------------ 5. abort


async def test_abort_while_collecting_kills_the_job_and_stops_the_recurrence(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    s = await c.schedule(Recurrence(every=60), job=LaunchSpec(("sleep", "30")))
    async with _supervised(h, s) as sup:
        clock.advance(60)

        async def running() -> bool:
            jobs = await _jobs(h)
            return bool(jobs) and jobs[0].status == "running"

        await _until(running, "the job runs", sup)
        (job,) = await _jobs(h)
        assert await c.abort_background(s) == sorted([s, job.id])
        final = await asyncio.wait_for(sup, 5)
    assert final.status == "aborted" and _state(final)["reason"] == "cancelled"
    killed = await h.wait_for(job.id, timeout=5)
    assert killed.status == "killed"
    assert _state(killed)["result"]["signal"] == signal.SIGTERM
    # Check: no recurrence after the abort, however far the clock moves.
    clock.advance(3600)
    assert await h.drive() == "idle"
    assert [j.id for j in await _jobs(h)] == [job.id]
    assert not (await h.tasks(live=True)).items
    await h.close()


# ------------------------------------------------------------------ 6. subagent action


async def test_a_subagent_action_answers_each_run_and_abort_cancels_its_child(
    backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    provider = GatedProvider(FauxProvider(["the report", "never sent"]), "write the report")
    provider.release.set()  # the first run answers at once
    h = await _open(backend, tmp_path, clock, provider=provider)
    c = await h.root()
    t0 = clock.now()
    s = await c.schedule(Recurrence(every=60), prompt="write the report")
    async with _supervised(h, s) as sup:
        clock.advance(60)
        await _until(_scheduled_at(h, s, t0 + 120), "the first run settled", sup)
        (owner,) = (await h.tasks(kind="subagent")).items
        assert owner.spawned_by == s and owner.status == "done"
        answer = await h.entry(_state(owner)["result"]["entry_id"])
        assert answer is not None and answer.conversation_id == owner.owned_conversation_id
        assert answer.content == {"text": "the report"}
        assert _state(await h.task(s))["last_run"] == {
            "due": t0 + 60,
            "task": owner.id,
            "kind": "subagent",
            "status": "done",
            "entry_id": answer.id,
        }
        # The second run's child is held inside its model request.
        provider.release.clear()
        provider.entered.clear()
        clock.advance(60)
        await asyncio.wait_for(provider.entered.wait(), 5)
        owners = (await h.tasks(kind="subagent")).items
        second = owners[-1]
        assert len(owners) == 2 and second.status == "waiting"
        child = second.owned_conversation_id
        assert child is not None
        child_live = (await h.tasks(conversation_ids=[child], live=True)).items
        assert any(t.kind == "generation" for t in child_live)
        marked = await c.abort_background(s)
        assert marked == sorted({s, second.id, *(t.id for t in child_live)})
        final = await asyncio.wait_for(sup, 5)
    assert final.status == "aborted"
    await h.wait_for(second.id, timeout=5)
    assert await _status(h, second.id) == "aborted"
    assert all(not t.live for t in (await h.get_tasks([t.id for t in child_live])).values())
    prompt = _state(await h.task(second.id))["prompt"]
    result = await pico.ConversationHandle(h, child).result(prompt)
    assert result is not None and result.status == "cancelled"
    assert provider.inner.request_count == 1  # the held second request never reached it
    await h.close()


# ------------------------------------------------------------------ 7. bad input


_BAD: dict[str, tuple[dict[str, Any], type[pico.PicoError]]] = {
    "not a recurrence": (
        {"recurrence": {"every": 60}, "job": _echo()},
        pico.InvalidArgumentError,
    ),
    "both job and prompt": (
        {"recurrence": Recurrence(every=60), "job": _echo(), "prompt": "go"},
        pico.InvalidArgumentError,
    ),
    "neither job nor prompt": ({"recurrence": Recurrence(every=60)}, pico.InvalidArgumentError),
    "job not a launch spec": (
        {"recurrence": Recurrence(every=60), "job": ("sh", "-c", "echo tick")},
        pico.InvalidArgumentError,
    ),
    "prompt without a provider": (
        {"recurrence": Recurrence(every=60), "prompt": "write the report"},
        pico.CommandRejectedError,
    ),
    "until before the first run": (
        {"recurrence": Recurrence(every=60, until=1_000_030.0), "job": _echo()},
        pico.InvalidArgumentError,
    ),
}


@pytest.mark.parametrize("case", list(_BAD))
async def test_a_bad_schedule_is_rejected_and_writes_nothing(
    backend: Backend, tmp_path: Path, case: str
) -> None:
    clock = FakeClock(start=1_000_000.0)
    h = await _open(backend, tmp_path, clock)
    c = await h.root()
    head = h.head()
    given, error = _BAD[case]
    kwargs = dict(given)
    recurrence = kwargs.pop("recurrence")
    with pytest.raises(error) as raised:
        await c.schedule(recurrence, **kwargs)
    assert str(raised.value)  # a sentence naming what was wrong
    assert h.head() == head
    assert not (await h.tasks()).items
    # Check: the handle is still usable.
    s = await c.schedule(Recurrence(every=60), job=_echo())
    assert await _status(h, s) == "scheduled"
    await h.close()


# ------------------------------------------------------------------ 8. reopen


async def test_a_reopen_while_collecting_adopts_the_job_and_creates_no_second_one(
    stored_backend: Backend, tmp_path: Path
) -> None:
    clock = FakeClock()
    gate = tmp_path / "gate"
    h = await _open(stored_backend, tmp_path, clock)
    c = await h.root()
    t0 = clock.now()
    s = await c.schedule(Recurrence(every=60), job=_gated(gate))
    async with _supervised(h, s) as sup:
        clock.advance(60)

        async def running() -> bool:
            jobs = await _jobs(h)
            return bool(jobs) and jobs[0].status == "running"

        await _until(running, "the job runs", sup)
        (first,) = await _jobs(h)
    await h.close()  # J keeps running, unobserved
    h = await _open(stored_backend, tmp_path, clock)
    try:
        assert await _status(h, s) == "collecting"
        assert await _status(h, first.id) == "running"
        async with _supervised(h, s) as sup:
            gate.touch()
            await _until(_scheduled_at(h, s, t0 + 120), "S continues after J", sup)
            state = _state(await h.task(s))
            assert state["runs_done"] == 1 and state["outcomes"] == {"exited": 1}
            assert state["last_run"]["task"] == first.id
            assert state["last_run"]["exit_code"] == 0
            assert [j.id for j in await _jobs(h)] == [first.id]
    finally:
        gate.touch()  # never leave the job waiting, even when the test fails
        with contextlib.suppress(pico.PicoError):
            await h.close()
