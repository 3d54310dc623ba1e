"""Shutdown and abort exactly per the seed (§6.4, §6.6, §8.2), on every backend.

Shutdown seals public admission, marks ALL live work and cancels every queued input of
every mode in ONE command, drives the cancellation to settlement and closes. A foreground
abort cancels queued steering and follow-ups in every conversation its selection reaches.
Interleavings are forced with events a blocking tool waits on, never with timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import pico
from pico import Command, FauxProvider, FauxResponse, ToolContext
from pico.application.flows.inputs import queue_address
from pico.domain.json import JsonObject
from tests.backends import Backend
from tests.contract.test_agent import SCHEMA, _bounded
from tests.scheddefs import Scripted

NOTE = pico.conversation_value("app.note", str)
FLAG = pico.session_value("app.flag", int)


@dataclass
class Blocker:
    """A tool that runs until the stop signal reaches it, reports that, then waits for the
    test to release it: "shutdown is in progress" becomes a state, not a race."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    signalled: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    wait_for_signal: bool = True

    def tool(self) -> pico.Tool:
        async def block(args: JsonObject, ctx: ToolContext) -> str:
            self.started.set()
            if self.wait_for_signal:
                await ctx.signal.wait()
                self.signalled.set()
            await self.release.wait()
            return "released"

        return pico.Tool("block", "Block until released", SCHEMA, block)


def _work() -> Scripted:
    work = Scripted()
    work.on_recover = lambda task, ctx: asyncio.sleep(0)  # a waiting task stays waiting
    return work


async def _open(backend: Backend, blocker: Blocker, script: list[Any]) -> pico.Harness:
    return await backend.open(
        provider=FauxProvider(script), tools=[blocker.tool()], definitions=[_work()]
    )


async def _queue_every_mode(c: pico.ConversationHandle, tag: str) -> dict[str, int]:
    return {
        "steer": await c.steer(f"steer {tag}"),
        "follow_up": await c.follow_up(f"follow up {tag}"),
        "next_run": await c.next_run(f"next run {tag}"),
        "write": await c.append_message(f"note {tag}"),
    }


async def _status(c: pico.ConversationHandle, input_id: int) -> tuple[str, str | None]:
    result = await c.result(input_id)
    assert result is not None, input_id
    return result.status, result.reason


async def _busy_fork(c: pico.ConversationHandle, at: int) -> pico.ConversationHandle:
    """A second conversation tree, busy with foreground work that waits for the outside."""
    fork = await c.fork(at_entry=at)
    await fork.harness.command(
        lambda tx: tx.create_task(fork.id, "work", status="waiting", foreground=True)
    )
    return fork


async def _queue_values(c: pico.ConversationHandle) -> list[str]:
    page = await c.scan_values(after=("pico.queue.", ""), limit=1000)
    return [f"{v.namespace}/{v.key}" for v in page.items if v.namespace.startswith("pico.queue.")]


async def test_shutdown_cancels_every_queued_input_and_all_live_work_then_reopen_is_idle(
    backend: Backend,
) -> None:
    blocker = Blocker()
    h = await _open(backend, blocker, [FauxResponse(tool_calls=[("block", {"path": "x"})])])
    c = await h.root()
    first = await c.append("user", "before the forks")
    fork = await _busy_fork(c, first)  # a second tree with queued input of every mode
    idle = await _busy_fork(c, first)  # a third: only writes and next_run remain, idle

    def background(tx: Command) -> list[int]:
        bg = tx.create_task(c.id, "work", status="waiting")
        owner = tx.create_task(c.id, "work", status="waiting")
        child = tx.create_owned_conversation(owner)
        return [bg, owner, tx.create_task(child, "work", status="waiting", foreground=True)]

    background_ids = await h.command(background)
    turn = await c.accept("start the turn")
    drive = asyncio.ensure_future(c.drive())
    await _bounded(blocker.started.wait())  # the tool runs: the root is busy
    inputs = {
        "root": await _queue_every_mode(c, "root"),
        "fork": await _queue_every_mode(fork, "fork"),
        "idle": await _queue_every_mode(idle, "idle"),
    }
    await idle.abort()  # drops its steering and follow-up; its write and next_run stay
    assert await _bounded(idle.drive()) == "idle"
    assert not (await h.tasks(conversation_ids=[idle.id], live=True)).items
    for name, ids in inputs.items():
        expected = "cancelled" if name == "idle" else "queued"
        for mode in ("steer", "follow_up"):
            assert (await _status(c, ids[mode]))[0] == expected, (name, mode)
        for mode in ("next_run", "write"):
            assert (await _status(c, ids[mode]))[0] == "queued", (name, mode)
    handles = {"root": c, "fork": fork, "idle": idle}
    before = {n: [e.id for e in (await x.entries(limit=1000)).items] for n, x in handles.items()}
    live_before = {t.id for t in (await h.tasks(live=True, limit=1000)).items}
    assert set(background_ids) <= live_before and len(live_before) == 6

    shutdown = asyncio.ensure_future(h.shutdown())
    await _bounded(blocker.signalled.wait())  # the marks are committed; settlement runs
    # Check: public admission is sealed on every handle, for every kind of command.
    attempts: list[Callable[[], Awaitable[object]]] = [
        lambda: c.append("user", "late"),
        lambda: c.accept("late"),
        lambda: c.prompt("late"),
        lambda: c.steer("late"),
        lambda: c.follow_up("late"),
        lambda: c.next_run("late"),
        lambda: c.append_message("late"),
        lambda: c.cancel_queued(inputs["root"]["next_run"]),
        lambda: c.abort(),
        lambda: fork.set_value(NOTE, "late"),
        lambda: h.set_value(FLAG, 1),
        lambda: fork.fork(at_entry=first),
        lambda: h.command(lambda tx: None),
        lambda: h.command(pico.working_scope("w"), lambda wtx: None),
    ]
    for attempt in attempts:
        with pytest.raises(pico.ShuttingDownError, match="shutting down"):
            await attempt()
    # Reads still answer, and the one cancellation command is already visible.
    assert await _status(c, inputs["root"]["write"]) == ("cancelled", "shutdown")
    assert await _status(c, inputs["idle"]["next_run"]) == ("cancelled", "shutdown")
    assert all(t.abort_requested for t in (await h.tasks(live=True, limit=1000)).items)
    blocker.release.set()
    await _bounded(shutdown)
    assert await _bounded(drive) in ("idle", "closed")
    await h.shutdown()  # a second shutdown is a no-op
    with pytest.raises(pico.ClosedError):
        await c.append("user", "after shutdown")

    h2 = await _open(backend, Blocker(), [])
    c2 = await h2.root()
    # Check: every queued input of every mode in every conversation reads cancelled.
    for name, ids in inputs.items():
        for mode, input_id in ids.items():
            status, reason = await _status(c2, input_id)
            assert status == "cancelled", (name, mode)
            if name != "idle" or mode in ("next_run", "write"):
                assert reason == "shutdown", (name, mode, reason)
    assert (await _status(c2, turn))[0] == "cancelled"  # the running turn's input
    assert not (await h2.tasks(live=True)).items
    assert all(t.abort_requested for t in (await h2.get_tasks(sorted(live_before))).values())
    assert h2.faulted is None
    # Check: history is intact. Every admission entry is still in its transcript; the only
    # new entry is the tool's own result record.
    for name, handle in handles.items():
        after = [
            e for e in (await h2.entries(handle.id, limit=1000)).items if e.id not in before[name]
        ]
        assert [e.id for e in (await h2.entries(handle.id, limit=1000)).items][
            : len(before[name])
        ] == before[name]
        assert [e.kind for e in after] == (["tool"] if name == "root" else []), name
        assert await _queue_values(pico.ConversationHandle(h2, handle.id)) == []
    await h2.close()


async def test_abort_cancels_steering_in_owned_children_and_keeps_writes_and_next_run(
    backend: Backend,
) -> None:
    blocker = Blocker(wait_for_signal=False)
    h = await _open(backend, blocker, [FauxResponse(tool_calls=[("block", {"path": "x"})])])
    c = await h.root()
    first = await c.append("user", "before the fork")
    other = await _busy_fork(c, first)  # another tree: the abort must not reach it
    await c.accept("delegate")
    drive = asyncio.ensure_future(c.drive())
    await _bounded(blocker.started.wait())
    [tool] = (await h.tasks(live=True, kind="tool")).items

    def spawn(tx: Command) -> int:  # the running tool owns a busy child conversation
        child = tx.create_owned_conversation(tool.id)
        tx.create_task(child, "work", status="waiting", foreground=True)
        return child

    child = pico.ConversationHandle(h, await h.command(spawn))
    parent_inputs = await _queue_every_mode(c, "parent")
    child_inputs = await _queue_every_mode(child, "child")
    other_steer = await other.steer("steer elsewhere")

    marked = await c.abort()
    live = {t.id: t for t in (await h.tasks(live=True, limit=100)).items}
    assert tool.id in marked and all(live[i].abort_requested for i in marked)
    assert {live[i].conversation_id for i in marked} == {c.id, child.id}
    for ids in (parent_inputs, child_inputs):
        assert await _status(c, ids["steer"]) == ("cancelled", "aborted")
        assert await _status(c, ids["follow_up"]) == ("cancelled", "aborted")
        assert await _status(c, ids["next_run"]) == ("queued", None)
        assert await _status(c, ids["write"]) == ("queued", None)
    assert await _status(c, other_steer) == ("queued", None)  # outside the selection

    # A repeated abort joins the outstanding cancellation: new steering stays queued.
    late = await c.steer("arrived during the cancellation")
    assert await c.abort() == []
    assert await _status(c, late) == ("queued", None)

    blocker.release.set()
    assert await _bounded(drive) == "idle"
    assert not (await h.tasks(conversation_ids=[c.id, child.id], live=True)).items
    for ids in (parent_inputs, child_inputs):
        assert await _status(c, ids["next_run"]) == ("queued", None)
        assert await _status(c, ids["write"]) == ("queued", None)
    assert sorted(await _queue_values(child)) == sorted(
        f"pico.queue.{m}/{queue_address(m, child_inputs[m]).key}" for m in ("next_run", "write")
    )
    await h.close()


async def test_shutdown_of_a_read_only_or_faulted_handle_is_refused(backend: Backend) -> None:
    h = await backend.open()
    await (await h.root()).append("user", "kept")
    head = h.head()
    reader = await backend.open(read_only=True)
    with pytest.raises(pico.ReadOnlyError):
        await reader.shutdown()
    assert reader.head() == head  # the reader is still usable and nothing was written
    await reader.close()
    if backend.exclusive_writer:  # no second owner can fence this one: the lock refuses it
        with pytest.raises(pico.SessionLockedError):
            await backend.open()
        await h.shutdown()
        with pytest.raises(pico.ClosedError):
            await (await h.root()).append("user", "after shutdown")
        h3 = await backend.open()
        assert not (await h3.tasks(live=True)).items
        await h3.close()
        return
    second = await backend.open()  # fences the first owner
    with pytest.raises(pico.StaleWriterError):
        await (await h.root()).append("user", "stale")
    with pytest.raises(pico.HandleFaultedError):
        await h.shutdown()
    await h.close()
    await second.shutdown()
    await second.shutdown()  # a second shutdown is a no-op
    h3 = await backend.open()
    assert not (await h3.tasks(live=True)).items
    await h3.close()


async def test_close_during_shutdown_leaves_the_marks_for_the_next_owner(
    backend: Backend,
) -> None:
    work = _work()
    aborting = asyncio.Event()

    async def slow_abort(task: pico.TaskSnapshot, ctx: Any) -> None:
        aborting.set()
        await ctx.signal.wait()  # close stops the cleanup before it settles anything

    work.on_abort = slow_abort
    h = await backend.open(provider=FauxProvider([]), definitions=[work])
    c = await h.root()
    tid = await h.command(
        lambda tx: tx.create_task(c.id, "work", status="waiting", foreground=True)
    )
    queued = await c.next_run("for later")
    shutdown = asyncio.ensure_future(h.shutdown())
    joined = asyncio.ensure_future(h.shutdown())  # a second call joins the first
    await _bounded(aborting.wait())
    await _bounded(h.close())  # close during shutdown: fine
    await _bounded(asyncio.gather(shutdown, joined))
    assert shutdown.result() is None and joined.result() is None
    h2 = await backend.open(provider=FauxProvider([]), definitions=[_work()])
    c2 = await h2.root()
    assert await _status(c2, queued) == ("cancelled", "shutdown")
    task = await h2.task(tid)
    assert task is not None and task.live and task.abort_requested  # a durable mark
    assert await _bounded(h2.drive()) == "idle"  # the next owner reconciles it
    assert not (await h2.tasks(live=True)).items
    assert (await h2.task(tid)).status == "aborted"  # type: ignore[union-attr]
    await h2.close()
