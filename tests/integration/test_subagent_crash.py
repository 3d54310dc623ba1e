"""Subagents across a real SIGKILL (§5.7, §8.6, issue 11 "recovery tests with a killed
process between creation and child completion"): a child process spawns or delegates, is
killed at a chosen durable point, and the test process reopens the same storage and
drives. Recovery drives the child's existing tasks (never a second child, never a second
S), the launch is one command, and the child's answer and S's settlement are one command:
after the kill either both are durable or neither is. Real SQLite files and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap
from typing import Any

import pytest

import pico
from pico import FauxProvider
from tests.backends import Backend
from tests.processes import spawn_child

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    import pico
    from pico.infrastructure.container import open_storage
    from tests.contract.test_delegation import _call
    from tests.contract.test_subagents import GatedProvider
    from tests.integration.test_crash_and_faults import FaultyStorage

    def say(**signals):
        print(json.dumps(signals), flush=True)

    class DiesAtTheFirstHalf(FaultyStorage):
        # The real storage; right after the first save that makes any of the watched
        # writes visible, that save is made durable and the process SIGKILLs itself.
        def __init__(self, inner):
            super().__init__(inner)
            self.watch = None  # () -> bool, checked after each save

        def save(self, aggregates, *, working=(), defer=False):
            self.inner.save(aggregates, working=working, defer=defer)
            if self.watch is not None and self.watch():
                self.inner.flush()
                say(signal="half")
                os.kill(os.getpid(), signal.SIGKILL)

    async def ids(h, s):
        owner = await h.task(s)
        conversations = len((await h.conversations()).items)
        return {"s": s, "child": owner.owned_conversation_id,
                "prompt": owner.state["prompt"], "conversations": conversations}

    async def spawn_held(url, session):
        # The spawn is durable; the child's generation streams, held by a barrier.
        provider = GatedProvider(pico.FauxProvider([]), "child work")
        h = await pico.Harness.open(url, session=session, provider=provider)
        c = await h.root()
        s = await c.spawn("child work")
        asyncio.ensure_future(h.drive())
        await provider.entered.wait()
        say(signal="streaming", **(await ids(h, s)))
        await asyncio.Event().wait()  # SIGKILLed here

    async def launch_half(url, session):
        # The first save after which any subagent task is visible is the last one.
        storage = DiesAtTheFirstHalf(
            open_storage(url, session=session, durability=None, read_only=False)
        )
        h = await pico.Harness.open(storage, provider=pico.FauxProvider([]))
        c = await h.root()
        storage.watch = lambda: bool(
            storage.inner.tasks.scan_tasks(kind="subagent", limit=1).items
        )
        await c.spawn("child work")
        raise AssertionError("the spawn's save must have killed this process")

    async def delegate_held(url, session):
        # The parent's model calls the shipped subagent tool; the child's stream is held.
        provider = GatedProvider(pico.FauxProvider([_call()]), "child work")
        h = await pico.Harness.open(
            url, session=session, provider=provider, tools=[pico.subagent_tool()]
        )
        c = await h.root()
        question = await c.accept("check the tests")
        asyncio.ensure_future(c.drive())
        await provider.entered.wait()
        (s,) = [t.id for t in (await h.tasks(kind="subagent")).items]
        say(signal="streaming", question=question, **(await ids(h, s)))
        await asyncio.Event().wait()  # SIGKILLed here

    async def answer(url, session, when):
        # The child's generation has its answer; S's settlement is the next command.
        async def after_response(outcome):
            say(signal="answered")
            if when == "hook holds":
                await asyncio.Event().wait()  # the settlement never starts

        storage = DiesAtTheFirstHalf(
            open_storage(url, session=session, durability=None, read_only=False)
        )
        h = await pico.Harness.open(
            storage,
            provider=pico.FauxProvider(["the child answer"]),
            hooks=pico.Hooks(after_response=after_response),
        )
        c = await h.root()
        s = await c.spawn("child work")
        child = (await h.task(s)).owned_conversation_id
        if when == "half durable":
            def either_half():
                owner = storage.inner.tasks.get_tasks([s])[s]
                kind = storage.inner.reads.scan_entries(child, kind="assistant", limit=1)
                return not owner.live or bool(kind.items)

            storage.watch = either_half
        await h.drive()
        await asyncio.Event().wait()  # "hook returns": SIGKILLed by the test by now

    name, url, session, *rest = sys.argv[1:]
    flows = {"spawn_held": spawn_held, "launch_half": launch_half,
             "delegate_held": delegate_held, "answer": answer}
    asyncio.run(flows[name](url, session, *rest))
    """
)


async def _signal(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
    assert line, f"the child process ended without a signal (exit {proc.poll()})"
    signals: dict[str, Any] = json.loads(line)
    return signals


async def _killed_at(backend: Backend, flow: str, *args: str) -> dict[str, Any]:
    """Run ``flow`` in a child process and SIGKILL it at its first signal."""
    proc = spawn_child(CHILD, flow, backend.url, backend.session, *args)
    try:
        return await _signal(proc)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL


async def _self_killed(backend: Backend, flow: str, *args: str) -> dict[str, Any]:
    """Run ``flow`` in a child process that SIGKILLs itself after its signal."""
    proc = spawn_child(CHILD, flow, backend.url, backend.session, *args)
    try:
        signals = await _signal(proc)
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
        return signals
    finally:
        if proc.poll() is None:  # pragma: no cover - only when an assertion failed
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


async def _only_owner(h: pico.Harness) -> pico.TaskSnapshot:
    (owner,) = (await h.tasks(kind="subagent")).items
    return owner


async def _answers(h: pico.Harness, child: int) -> list[pico.Entry]:
    return list((await h.entries(child, kind="assistant", content=True)).items)


async def test_a_spawn_killed_while_its_child_streams_is_finished_by_the_next_owner(
    sql_backend: Backend,
) -> None:
    seen = await _killed_at(sql_backend, "spawn_held")
    provider = FauxProvider(["recovered answer"])
    h = await sql_backend.open(provider=provider)
    owner = await h.task(seen["s"])
    assert owner is not None and owner.status == "waiting"  # the kill left it in flight
    assert owner.owned_conversation_id == seen["child"]
    (generation,) = (await h.tasks(conversation_ids=[seen["child"]], kind="generation")).items
    assert generation.status == "streaming"  # durable intent, no partial
    assert len((await h.conversations()).items) == seen["conversations"]

    assert await asyncio.wait_for(h.drive(), timeout=10) == "idle"
    owner = await _only_owner(h)  # never a second S
    assert owner.id == seen["s"] and owner.status == "done"
    assert owner.owned_conversation_id == seen["child"]  # never a second child
    assert len((await h.conversations()).items) == seen["conversations"]
    result = _state(owner)["result"]
    assert result["status"] == "done"
    answer = await h.entry(result["entry_id"])
    assert answer is not None and answer.conversation_id == seen["child"]
    assert answer.content == {"text": "recovered answer"}
    assert [m.text for m in provider.requests[-1].messages] == ["child work"]
    kid = await h.conversation(seen["child"])
    assert kid is not None
    assert await kid.result(seen["prompt"]) == pico.InputResult("done", answer.id)
    await h.close()


async def test_a_process_killed_at_the_spawns_first_durable_write_finds_the_whole_launch(
    sql_backend: Backend,
) -> None:
    """The first save that shows a subagent task is made durable, then SIGKILL: S, its
    owned child, the selected prompt with its running result and the child's generation
    are all there, because they are one command."""
    await _self_killed(sql_backend, "launch_half")
    h = await sql_backend.open(provider=FauxProvider(["the child answer"]))
    owner = await _only_owner(h)
    assert owner.status == "waiting" and owner.owned_conversation_id is not None
    child = owner.owned_conversation_id
    kid = await h.conversation(child)
    assert kid is not None
    assert (await kid.snapshot()).owner_task_id == owner.id  # the reciprocal link
    (prompt,) = await kid.context_entries()
    assert prompt.content == "child work" and _state(owner)["prompt"] == prompt.id
    assert await kid.result(prompt.id) == pico.InputResult("running")
    (generation,) = (await h.tasks(conversation_ids=[child], live=True)).items
    assert generation.kind == "generation" and generation.spawned_by == owner.id

    assert await asyncio.wait_for(h.drive(), timeout=10) == "idle"
    owner = await _only_owner(h)
    assert owner.status == "done" and owner.owned_conversation_id == child
    (answer,) = await _answers(h, child)
    assert _state(owner)["result"] == {"status": "done", "entry_id": answer.id}
    await h.close()


async def test_a_foreground_delegation_killed_while_the_child_works_finishes_its_call(
    sql_backend: Backend,
) -> None:
    seen = await _killed_at(sql_backend, "delegate_held")
    provider = FauxProvider(["the tests pass", "all done"])
    h = await sql_backend.open(provider=provider, tools=[pico.subagent_tool()])
    c = await h.root()
    (tool,) = (await h.tasks(conversation_ids=[c.id], kind="tool")).items
    assert tool.status == "finishing" and tool.after == (seen["s"],)
    assert (await c.result(seen["question"])).status == "running"  # type: ignore[union-attr]

    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"  # covers the child
    owner = await _only_owner(h)  # never relaunched
    assert owner.id == seen["s"] and owner.status == "done"
    assert owner.owned_conversation_id == seen["child"]
    assert len((await h.conversations()).items) == seen["conversations"]
    tool = await h.task(tool.id)  # type: ignore[assignment]
    assert tool is not None and tool.status == "done"
    results = [e.content for e in await c.context_entries() if e.kind == "tool"]
    assert results == [{"content": "the tests pass", "is_error": False}]
    result = await c.result(seen["question"])
    assert result is not None and result.status == "done"
    final = await h.entry(result.entry_id or 0)
    assert final is not None and final.content == {"text": "all done"}
    assert len(provider.requests) == 2  # the child's request, then the parent's follow-up
    await h.close()


@pytest.mark.parametrize("when", ["hook holds", "hook returns", "half durable"])
async def test_the_childs_answer_and_its_owners_settlement_survive_a_kill_together(
    sql_backend: Backend, when: str
) -> None:
    """Killed once the child's generation has its answer: while ``after_response`` holds
    (before the settlement command), right after it returns (a race: either outcome), or
    right after the first save showing either half (the answer or S's settlement). Either
    S waits and the child has no answer, or S is done with that answer: never one half."""
    if when == "half durable":
        await _self_killed(sql_backend, "answer", when)
    else:
        seen = await _killed_at(sql_backend, "answer", when)
        assert seen == {"signal": "answered"}
    provider = FauxProvider(["the retried answer"])
    h = await sql_backend.open(provider=provider)
    owner = await _only_owner(h)
    assert owner.owned_conversation_id is not None
    child = owner.owned_conversation_id
    answers = await _answers(h, child)
    if owner.live:
        assert owner.status == "waiting" and answers == []
    else:
        (answer,) = answers
        assert owner.status == "done"
        assert _state(owner)["result"] == {"status": "done", "entry_id": answer.id}
    if when == "hook holds":
        assert owner.live  # the settlement never started
    if when == "half durable":
        assert not owner.live  # the save that showed one half showed both

    assert await asyncio.wait_for(h.drive(), timeout=10) == "idle"
    settled = await _only_owner(h)
    assert settled.id == owner.id and settled.status == "done"
    (answer,) = await _answers(h, child)  # exactly one answer
    assert _state(settled)["result"] == {"status": "done", "entry_id": answer.id}
    if owner.live:
        assert answer.content == {"text": "the retried answer"}
        assert len(provider.requests) == 1
    else:
        assert answer.content == {"text": "the child answer"}
        assert provider.requests == []  # a settled child is never asked again
    kid = await h.conversation(child)
    assert kid is not None
    assert await kid.result(_state(settled)["prompt"]) == pico.InputResult("done", answer.id)
    await h.close()
