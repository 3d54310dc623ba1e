"""The scheduler (§6) on every backend: roles, dependencies, timers, permits, claims,
cancellation ordering, faults, close and shutdown. Races are forced with barriers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import pico
from pico import Command
from pico.application.tasks import TaskExecution
from tests.backends import Backend
from tests.scheddefs import Scripted, settle


async def _open(backend: Backend, work: Scripted, clock: Any = None) -> pico.Harness:
    return await backend.open(definitions=[work], clock=clock)


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


async def _yield(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _create(cid: int, **kw: Any) -> Any:
    return lambda tx: tx.create_task(cid, "work", **kw)


async def test_a_ready_task_executes_and_the_drive_goes_idle(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    assert work.calls == []  # creating work starts nothing
    assert await _bounded(c.drive()) == "idle"
    assert work.calls == [("execute", tid)]
    assert (await h.task(tid)).status == "done"  # type: ignore[union-attr]
    assert await _bounded(h.drive()) == "idle"
    await h.close()


async def test_dependencies_mean_terminal_not_successful(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()

    def graph(tx: Command) -> tuple[int, int, int, int, int]:
        a = tx.create_task(c.id, "work", status="failed")
        b = tx.create_task(c.id, "work", status="done")
        t = tx.create_task(c.id, "work", after=[a, b], foreground=True)
        w = tx.create_task(c.id, "work", status="waiting")
        blocked = tx.create_task(c.id, "work", after=[w])
        return a, b, t, w, blocked

    _a, _b, t, _w, blocked = await h.command(graph)
    work.on_recover = lambda task, ctx: asyncio.sleep(0)  # a waiting task stays waiting
    assert await _bounded(h.drive()) == "suspended"
    assert ("execute", t) in work.calls  # failed and done dependencies both unblock
    assert ("execute", blocked) not in work.calls  # a live dependency blocks
    assert (await h.task(blocked)).role == "ready"  # type: ignore[union-attr]
    await h.close()


async def test_a_live_dependency_outside_the_drives_scope_still_blocks(
    backend: Backend,
) -> None:
    # A drive of an owned child conversation covers the child's subtree only; the
    # dependency lives in the owner's conversation (same ownership tree, outside the
    # drive's scope). Out of scope is not terminal: the task waits until it settles.
    work = Scripted()
    h = await _open(backend, work)
    a = await h.root()

    def graph(tx: Command) -> tuple[int, int, int]:
        owner = tx.create_task(a.id, "work", status="waiting")
        child = tx.create_owned_conversation(owner)
        dep = tx.create_task(a.id, "work", status="waiting")
        return child, dep, tx.create_task(child, "work", after=[dep], foreground=True)

    child, dep, blocked = await h.command(graph)
    work.on_recover = lambda task, ctx: asyncio.sleep(0)  # waiting tasks stay waiting
    drive = pico.ConversationHandle(h, child).drive
    assert await _bounded(drive()) == "suspended"  # nothing runnable in its scope
    assert ("execute", blocked) not in work.calls
    await h.command(lambda tx: tx.patch_task(dep, status="done"))
    assert await _bounded(drive()) == "idle"
    assert ("execute", blocked) in work.calls
    await h.close()


async def test_a_future_timer_is_waited_for_not_reported(backend: Backend) -> None:
    work = Scripted()
    clock = pico.FakeClock()
    h = await _open(backend, work, clock)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True, not_before=clock.now() + 60))
    drive = asyncio.ensure_future(c.drive())
    await _yield()
    assert not drive.done() and work.calls == []
    clock.advance(59)
    await _yield()
    assert not drive.done() and work.calls == []
    clock.advance(1)
    assert await _bounded(drive) == "idle"
    assert work.calls == [("execute", tid)]
    await h.close()


async def test_permits_apply_only_inside_the_granting_drive(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    a = await h.root()
    b = pico.ConversationHandle(h, await h.command(lambda tx: tx.create_conversation()))
    tid = await h.command(_create(a.id, foreground=True, required_permit="deferred-poll"))
    assert await _bounded(h.drive()) == "suspended"  # no permit
    assert await _bounded(b.drive(permits=["deferred-poll"])) == "idle"  # other tree
    assert work.calls == []
    assert await _bounded(a.drive(permits=["deferred-poll"])) == "idle"
    assert work.calls == [("execute", tid)]
    await h.close()


async def test_inflight_work_is_recovered_after_reopen(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    intent = asyncio.Event()

    async def intent_then_interrupted(task: Any, ctx: TaskExecution) -> None:
        await ctx.command(lambda tx: tx.patch_task(task.id, status="started"))
        intent.set()
        await ctx.signal.wait()  # interrupted before the outcome

    work.on_execute = intent_then_interrupted
    drive = asyncio.ensure_future(c.drive())
    await _bounded(intent.wait())
    await h.close()
    assert await _bounded(drive) == "closed"
    work2 = Scripted()
    h2 = await _open(backend, work2)
    assert (await h2.task(tid)).role == "inflight"  # type: ignore[union-attr]
    assert await _bounded((await h2.root()).drive()) == "idle"
    assert work2.calls == [("recover", tid)]  # recover, never a second execute
    assert (await h2.task(tid)).status == "done"  # type: ignore[union-attr]
    await h2.close()


async def test_waiting_tasks_are_rearmed_once_per_waiting_phase(backend: Backend) -> None:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, status="waiting", foreground=True))
    assert await _bounded(c.drive()) == "suspended"
    assert await _bounded(c.drive()) == "suspended"
    assert work.calls == [("recover", tid)]
    # A new waiting phase is re-armed again.
    await h.command(lambda tx: tx.patch_task(tid, status="pending"))
    work.on_execute = lambda task, ctx: ctx.command(
        lambda tx: tx.patch_task(task.id, status="waiting")
    )
    assert await _bounded(c.drive()) == "suspended"
    assert work.calls == [("recover", tid), ("execute", tid), ("recover", tid)]
    await h.close()


async def test_overlapping_drives_share_one_execution_per_task(backend: Backend) -> None:
    work = Scripted()
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(task: Any, ctx: TaskExecution) -> None:
        entered.set()
        await release.wait()
        await settle(ctx, "done")

    work.on_execute = slow
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    one = asyncio.ensure_future(c.drive())
    two = asyncio.ensure_future(h.drive())
    await _bounded(entered.wait())
    await _yield()
    release.set()
    assert await _bounded(one) == "idle" and await _bounded(two) == "idle"
    assert work.calls == [("execute", tid)]
    await h.close()


async def test_cancelling_one_callers_wait_affects_no_other(backend: Backend) -> None:
    work = Scripted()
    release = asyncio.Event()

    async def slow(task: Any, ctx: TaskExecution) -> None:
        await release.wait()
        await settle(ctx, "done")

    work.on_execute = slow
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    impatient = asyncio.ensure_future(c.drive())
    patient = asyncio.ensure_future(h.drive())
    await _yield()
    impatient.cancel()
    await _yield()
    assert impatient.cancelled() and not patient.done()
    release.set()
    assert await _bounded(patient) == "idle"
    task = await h.task(tid)
    assert task is not None and task.status == "done" and not task.abort_requested
    await h.close()


async def test_abort_while_the_effect_runs_joins_then_aborts_under_one_claim(
    backend: Backend,
) -> None:
    work = Scripted()
    entered = asyncio.Event()

    async def cooperative(task: Any, ctx: TaskExecution) -> None:
        entered.set()
        await ctx.signal.wait()  # stops when signalled, writes no outcome itself

    work.on_execute = cooperative
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    drive = asyncio.ensure_future(c.drive())
    await _bounded(entered.wait())
    assert await c.abort() == [tid]
    assert await c.abort() == []  # repeated abort joins the outstanding one
    assert await _bounded(drive) == "idle"
    assert work.calls == [("execute", tid), ("abort", tid)]
    task = await h.task(tid)
    assert task is not None and task.status == "aborted" and task.abort_requested
    await h.close()


async def test_settlement_that_wins_the_race_is_not_aborted(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    assert await _bounded(c.drive()) == "idle"  # settled first
    assert await c.abort() == []  # nothing live is selected
    assert await _bounded(c.drive()) == "idle"
    assert work.calls == [("execute", tid)]
    assert (await h.task(tid)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_an_unmarked_successor_cannot_escape_a_marked_task(backend: Backend) -> None:
    work = Scripted()
    entered = asyncio.Event()

    async def chain(task: Any, ctx: TaskExecution) -> None:
        entered.set()
        await ctx.signal.wait()
        if ctx.current().abort_requested:  # successor commands re-check cancellation
            return
        await ctx.command(lambda tx: tx.create_task(task.conversation_id, "work"))

    work.on_execute = chain
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    drive = asyncio.ensure_future(c.drive())
    await _bounded(entered.wait())
    await c.abort()
    assert await _bounded(drive) == "idle"
    assert [t.id for t in (await h.tasks(limit=10)).items] == [tid]  # no successor
    await h.close()


async def test_an_unexpected_effect_exception_faults_the_handle(backend: Backend) -> None:
    work = Scripted()

    async def broken(task: Any, ctx: TaskExecution) -> None:
        raise RuntimeError("bug in the effect")

    work.on_execute = broken
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    with pytest.raises(RuntimeError, match="bug in the effect"):
        await _bounded(c.drive())
    assert work.calls == [("execute", tid)]  # not relaunched forever
    assert h.faulted is not None
    with pytest.raises(pico.HandleFaultedError):
        await h.command(_create(c.id))
    await h.close()


async def test_a_late_callback_cannot_write_through_an_ended_execution(
    backend: Backend,
) -> None:
    work = Scripted()
    kept: list[TaskExecution] = []

    async def leak(task: Any, ctx: TaskExecution) -> None:
        kept.append(ctx)
        await settle(ctx, "done")

    work.on_execute = leak
    h = await _open(backend, work)
    c = await h.root()
    await h.command(_create(c.id, foreground=True))
    assert await _bounded(c.drive()) == "idle"
    head = h.head()
    with pytest.raises(pico.StaleExecutionError):
        await kept[0].command(lambda tx: tx.append_entry(c.id, "note", "late"))
    assert h.head() == head
    await h.close()


async def test_close_interrupts_cooperatively_and_writes_no_outcome(backend: Backend) -> None:
    work = Scripted()
    entered = asyncio.Event()

    async def cooperative(task: Any, ctx: TaskExecution) -> None:
        entered.set()
        await ctx.signal.wait()

    work.on_execute = cooperative
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    drive = asyncio.ensure_future(c.drive())
    await _bounded(entered.wait())
    head = h.head()
    await h.close()
    assert await _bounded(drive) == "closed"
    h2 = await _open(backend, Scripted())
    task = await h2.task(tid)
    assert task is not None and task.role == "ready" and not task.abort_requested
    assert h2.head() == head + 0  # close wrote nothing (the reopen's claim is no commit)
    await h2.close()


async def test_shutdown_cancels_all_live_work_including_background(backend: Backend) -> None:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()

    def plan(tx: Command) -> list[int]:
        fg = tx.create_task(c.id, "work", foreground=True, not_before=10**12)
        bg = tx.create_task(c.id, "work", status="waiting")
        owner = tx.create_task(c.id, "work", status="waiting")
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "work", status="waiting")
        return [fg, bg, owner, inner]

    ids = await h.command(plan)
    await h.shutdown()
    h2 = await _open(backend, Scripted())
    tasks = await h2.get_tasks(ids)
    assert {t.status for t in tasks.values()} == {"aborted"}
    assert all(t.abort_requested for t in tasks.values())
    await h2.close()


async def test_abort_background_selects_a_root_its_dependencies_and_owned_subtree(
    backend: Backend,
) -> None:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()

    def plan(tx: Command) -> dict[str, int]:
        fg_dep = tx.create_task(c.id, "work", status="waiting")
        fg = tx.create_task(c.id, "work", status="waiting", foreground=True, after=[fg_dep])
        bg_dep = tx.create_task(c.id, "work", status="waiting")
        bg = tx.create_task(c.id, "work", status="waiting", after=[bg_dep])
        child = tx.create_owned_conversation(bg)
        inner = tx.create_task(child, "work", status="waiting")
        other = tx.create_task(c.id, "work", status="waiting")
        return {
            "fg_dep": fg_dep,
            "fg": fg,
            "bg_dep": bg_dep,
            "bg": bg,
            "inner": inner,
            "other": other,
        }

    ids = await h.command(plan)
    with pytest.raises(pico.CommandRejectedError):
        await c.abort_background(ids["fg"])  # required by foreground: not detached
    marked = await c.abort_background(ids["bg"])
    assert marked == sorted([ids["bg_dep"], ids["bg"], ids["inner"]])
    assert await _bounded(h.drive()) == "suspended"  # the rest still waits outside
    statuses = {k: (await h.task(v)).status for k, v in ids.items()}  # type: ignore[union-attr]
    assert statuses == {
        "fg_dep": "waiting",
        "fg": "waiting",
        "bg_dep": "aborted",
        "bg": "aborted",
        "inner": "aborted",
        "other": "waiting",
    }
    assert await c.abort() == sorted([ids["fg_dep"], ids["fg"]])
    await h.close()


async def test_drive_scope_follows_ownership_not_fork_provenance(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    m = await c.append("user", "m")
    fork = await c.fork(at_entry=m)

    def plan(tx: Command) -> tuple[int, int]:
        owner = tx.create_task(c.id, "work", status="waiting", foreground=True)
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "work", foreground=True)
        return owner, inner

    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    owner, inner = await h.command(plan)
    in_fork = await h.command(_create(fork.id, foreground=True))
    assert await _bounded(c.drive()) == "suspended"  # the owner still waits
    assert ("execute", inner) in work.calls  # owned child work is in scope
    assert ("execute", in_fork) not in work.calls  # a fork is not
    assert await _bounded(fork.drive()) == "idle"
    assert ("execute", in_fork) in work.calls
    assert owner
    await h.close()


async def test_a_conversation_drive_does_not_wait_for_detached_background_work(
    backend: Backend,
) -> None:
    work = Scripted()
    release = asyncio.Event()

    async def slow(task: Any, ctx: TaskExecution) -> None:
        await release.wait()
        await settle(ctx, "done")

    h = await _open(backend, work)
    c = await h.root()
    bg = await h.command(_create(c.id, foreground=False))
    work.on_execute = slow
    assert await _bounded(c.drive()) == "idle"  # serviced (launched), not waited for
    assert work.calls == [("execute", bg)]
    release.set()
    assert await _bounded(h.drive()) == "idle"  # a session drive waits for everything
    assert (await h.task(bg)).status == "done"  # type: ignore[union-attr]
    await h.close()


class Outside:
    """An outside event source (a human, a process): subscribers get its events."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.satisfied = False

    def subscribe(self, notify: Any) -> Any:
        self.listeners.append(notify)
        return lambda: self.listeners.remove(notify)

    def emit(self, event: Any) -> None:
        for notify in list(self.listeners):
            notify(event)


def _observing(outside: Outside, seen: list[Any]) -> Any:
    async def reconcile(event: Any, ctx: TaskExecution) -> None:
        seen.append(event)
        if outside.satisfied or event == "done":
            await settle(ctx, "done")

    async def arm(task: Any, ctx: TaskExecution) -> None:
        ctx.observe(outside.subscribe, reconcile)

    return arm


async def test_an_observer_reconciles_initially_then_on_events(backend: Backend) -> None:
    work = Scripted()
    outside = Outside()
    seen: list[Any] = []
    work.on_recover = _observing(outside, seen)
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, status="waiting", foreground=True))
    assert await _bounded(c.drive()) == "suspended"  # installed: waiting for the outside
    assert seen == [None] and len(outside.listeners) == 1  # the initial reconcile ran
    outside.emit("progress")
    assert await _bounded(c.drive()) == "suspended"
    outside.emit("done")
    assert await _bounded(c.drive()) == "idle"
    assert seen == [None, "progress", "done"]
    assert outside.listeners == []  # settlement ends the phase: unsubscribed
    assert (await h.task(tid)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_an_already_satisfied_condition_is_not_lost(backend: Backend) -> None:
    work = Scripted()
    outside = Outside()
    seen: list[Any] = []
    outside.satisfied = True  # happened before anyone subscribed
    work.on_recover = _observing(outside, seen)
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, status="waiting", foreground=True))
    assert await _bounded(c.drive()) == "idle"
    assert seen == [None] and (await h.task(tid)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_observers_are_rearmed_after_reopen_not_duplicated(backend: Backend) -> None:
    outside = Outside()
    seen: list[Any] = []
    work = Scripted()
    work.on_recover = _observing(outside, seen)
    h = await _open(backend, work)
    c = await h.root()
    await h.command(_create(c.id, status="waiting", foreground=True))
    assert await _bounded(c.drive()) == "suspended"
    assert await _bounded(c.drive()) == "suspended"
    assert len(outside.listeners) == 1  # one per waiting phase, not per drive
    await h.close()
    assert outside.listeners == []  # close seals observers
    outside.emit("during close")  # a notification after close reaches no one
    work2 = Scripted()
    work2.on_recover = _observing(outside, seen)
    h2 = await _open(backend, work2)
    assert await _bounded((await h2.root()).drive()) == "suspended"
    assert len(outside.listeners) == 1  # restored by recovery in the new process
    outside.emit("done")
    assert await _bounded((await h2.root()).drive()) == "idle"
    assert "during close" not in seen
    await h2.close()


@pytest.mark.parametrize("child_first", [True, False])
async def test_a_marked_owner_settles_only_after_its_child_work(
    backend: Backend, child_first: bool
) -> None:
    """Child work finishing during owner cancellation: the owner's abort waits for the
    child's selected work, whichever is signalled first; no success overwrites it."""
    work = Scripted()
    child_entered, child_release = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def child_effect(task: Any, ctx: TaskExecution) -> None:
        child_entered.set()
        await child_release.wait()
        if ctx.current().abort_requested:
            order.append("child aborted")
            return  # the scheduler runs its abort under the same claim
        await settle(ctx, "done")

    async def abort(task: Any, ctx: TaskExecution) -> None:
        order.append(f"abort {task.id}")
        await settle(ctx, "aborted")

    work.on_execute = child_effect
    work.on_abort = abort
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()

    def plan(tx: Command) -> tuple[int, int]:
        owner = tx.create_task(c.id, "work", status="waiting", foreground=True)
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "work", foreground=True)
        return owner, inner

    owner, inner = await h.command(plan)
    drive = asyncio.ensure_future(c.drive())
    await _bounded(child_entered.wait())
    marked = await c.abort()
    assert set(marked) == {owner, inner}
    if not child_first:  # the owner's cancellation is ready first: it must wait
        await _yield(50)
        assert order == []  # neither the owner's abort nor anything else ran
    child_release.set()
    assert await _bounded(drive) == "idle"
    assert order == ["child aborted", f"abort {inner}", f"abort {owner}"]
    tasks = await h.get_tasks([owner, inner])
    assert {t.status for t in tasks.values()} == {"aborted"}
    await h.close()


async def test_a_crash_during_shutdown_leaves_marks_the_next_owner_reconciles(
    backend: Backend,
) -> None:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()
    ids = await h.command(
        lambda tx: [tx.create_task(c.id, "work", status="waiting") for _ in range(3)]
    )
    await h.command(lambda tx: [tx.request_abort(i) for i in ids])  # shutdown's first step
    await h.close()  # ... and the process stops before driving the cancellation
    work2 = Scripted()
    h2 = await _open(backend, work2)
    assert await _bounded(h2.drive()) == "idle"
    assert sorted(work2.calls) == sorted(("abort", i) for i in ids)
    assert {t.status for t in (await h2.get_tasks(ids)).values()} == {"aborted"}
    await h2.close()


async def test_an_effect_that_changes_nothing_faults_instead_of_spinning(
    backend: Backend,
) -> None:
    work = Scripted()
    work.on_execute = lambda task, ctx: asyncio.sleep(0)  # returns, commits nothing
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    with pytest.raises(pico.StaleExecutionError, match="without committing a transition"):
        await _bounded(c.drive())
    assert work.calls == [("execute", tid)]
    assert h.faulted is not None
    await h.close()


async def test_an_effect_that_settles_as_abort_starts_keeps_its_outcome(
    backend: Backend,
) -> None:
    """Abort marks while the effect is committing its own outcome: the join re-reads a
    terminal task and runs no abort handler (the other order is tested above)."""
    work = Scripted()
    entered, release = asyncio.Event(), asyncio.Event()

    async def settles_anyway(task: Any, ctx: TaskExecution) -> None:
        entered.set()
        await release.wait()
        await settle(ctx, "done")  # does not look at the signal

    work.on_execute = settles_anyway
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, foreground=True))
    drive = asyncio.ensure_future(c.drive())
    await _bounded(entered.wait())
    assert await c.abort() == [tid]
    release.set()
    assert await _bounded(drive) == "idle"
    assert work.calls == [("execute", tid)]  # no abort handler for a settled task
    task = await h.task(tid)
    assert task is not None and task.status == "done" and task.abort_requested
    await h.close()


async def test_a_marked_task_cannot_create_normal_successors(backend: Backend) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    tid = await h.command(_create(c.id, status="waiting"))
    await h.command(lambda tx: tx.request_abort(tid))
    head = h.head()
    with pytest.raises(pico.TaskGraphError, match="marked for cancellation"):
        await h.command(lambda tx: tx.create_task(c.id, "work", spawned_by=tid))
    with pytest.raises(pico.TaskGraphError, match="marked for cancellation"):
        await h.command(lambda tx: tx.create_owned_conversation(tid))
    with pytest.raises(pico.UnknownTaskError, match="spawned_by"):
        await h.command(lambda tx: tx.create_task(c.id, "work", spawned_by=999_999))
    assert h.head() == head
    await h.close()


async def test_aborting_an_owned_child_directly_cancels_its_owner(backend: Backend) -> None:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)
    h = await _open(backend, work)
    c = await h.root()

    def plan(tx: Command) -> tuple[int, int, int]:
        owner = tx.create_task(c.id, "work", status="waiting", foreground=True)
        child = tx.create_owned_conversation(owner)
        inner = tx.create_task(child, "work", status="waiting", foreground=True)
        return owner, child, inner

    owner, child, inner = await h.command(plan)
    child_handle = pico.ConversationHandle(h, child)
    assert sorted(await child_handle.abort()) == sorted([inner, owner])
    assert await _bounded(child_handle.drive()) == "idle"  # the child's own work settles
    assert (await h.task(inner)).status == "aborted"  # type: ignore[union-attr]
    assert await _bounded(c.drive()) == "idle"  # the parent drive completes the owner
    assert (await h.task(owner)).status == "aborted"  # type: ignore[union-attr]
    await h.close()


async def test_a_builder_reads_the_cancellation_mark_and_several_tasks_at_once(
    backend: Backend,
) -> None:
    work = Scripted()
    h = await _open(backend, work)
    c = await h.root()
    a = await h.command(_create(c.id, status="waiting"))
    b = await h.command(_create(c.id, status="waiting"))
    await h.command(lambda tx: tx.request_abort(a))

    def build(tx: pico.Command) -> tuple[Any, ...]:
        before = (tx.abort_marked(a), tx.abort_marked(b), tx.abort_marked(999))
        tx.request_abort(b)  # the batch's own mark counts at once
        return (*before, tx.abort_marked(b), sorted(tx.get_tasks([b, a, 999])))

    assert await h.command(build) == (True, False, None, True, [a, b])
    await h.close()
    # Check: a fresh handle (no cached aggregates) reads the same marks.
    h2 = await _open(backend, work)
    assert await h2.command(lambda tx: (tx.abort_marked(a), tx.abort_marked(b))) == (True, True)
    await h2.close()
