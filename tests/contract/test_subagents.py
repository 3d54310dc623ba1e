"""Subagents (§4.3, §5.6, §5.7, §6.4, §6.5, §8.6): ``conversation.spawn`` and the owner task
S of a child conversation, on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import pico
from pico import FauxFailure, FauxProvider
from pico.application.faux import ScriptItem
from pico.application.flows.inputs import input_result_address
from pico.application.model import Deferred, Request, Response, StreamEvent
from tests.backends import Backend

MODEL = pico.conversation_value("demo.model", str)  # rewindable
PLAN = pico.conversation_value("demo.plan", str, rewind=False)  # sticky
MODE = pico.conversation_value("demo.mode", str, rewind=False)
ABSENT = pico.conversation_value("demo.absent", str, rewind=False)
NOTES = pico.conversation_list("demo.notes", str)


class GatedProvider:
    """The faux provider, except that a request whose last user text contains ``key`` waits
    for ``release`` before it streams: a barrier that holds a child's generation."""

    def __init__(self, inner: FauxProvider, key: str) -> None:
        self.inner = inner
        self.key = key
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        last = request.messages[-1].text if request.messages else ""
        if self.key in last:
            self.entered.set()
            await self.release.wait()
        async for event in self.inner.stream(request):
            yield event

    async def poll(self, handle: str) -> Response | Deferred:
        return await self.inner.poll(handle)


def _state(task: pico.TaskSnapshot | None) -> dict[str, Any]:
    assert task is not None and isinstance(task.state, dict)
    return task.state


def _text(entry: pico.Entry | None) -> str:
    assert entry is not None and isinstance(entry.content, dict)
    return str(entry.content["text"])


async def _spawned(h: pico.Harness, s: int) -> tuple[pico.TaskSnapshot, int]:
    task = await h.task(s)
    assert task is not None
    assert task.owned_conversation_id is not None
    return task, task.owned_conversation_id


async def test_spawn_is_one_command_creating_owner_child_values_prompt_and_generation(
    backend: Backend,
) -> None:
    h = await backend.open(provider=FauxProvider(["child answer"]))
    c = await h.root()
    await c.set_value(MODEL, "big")
    await c.set_value(PLAN, "plan A")
    await c.set_value(MODE, "plan-mode")  # unselected: absent in the child
    await c.append_list(NOTES, "a note")  # lists are never copied
    head = h.head()
    last = h.audit(limit=1000)[-1].position
    s = await c.spawn(
        "Inspect only tests",
        context="fresh",
        values=pico.Initialization(inherit=[MODEL, PLAN, ABSENT], set=[(PLAN, "plan B")]),
    )
    written = h.audit(after=last)
    # ONE creation command: a single commit boundary among the new events.
    assert [r.event for r in written].count("Session.Committed") == 1
    owner, child = await _spawned(h, s)
    assert owner.kind == "subagent" and owner.status == "waiting" and owner.role == "waiting"
    assert owner.conversation_id == c.id and owner.foreground is False  # detached (§5.6)
    assert s > head and child > s
    snap = await (await h.conversation(child)).snapshot()  # type: ignore[union-attr]
    assert snap.owner_task_id == s  # the reciprocal link (§5.7)
    assert snap.source is None  # initialization, not a historical fork
    kid = await h.conversation(child)
    assert kid is not None
    assert await kid.get_value(MODEL) == "big"  # selected present: copied
    assert await kid.get_value(PLAN) == "plan B"  # the override after the copy
    assert await kid.get_value(MODE) is None  # unselected: absent, no parent fallback
    assert await kid.get_value(ABSENT) is None  # selected absent stays absent
    assert not (await kid.read_list(NOTES)).items
    prompt = (await kid.context_entries())[-1]
    assert prompt.kind == "user" and prompt.content == "Inspect only tests"
    assert [e.id for e in await kid.context_entries()] == [prompt.id]  # fresh context
    live = (await h.tasks(conversation_ids=[child], live=True)).items
    assert [(t.kind, t.spawned_by) for t in live] == [("generation", s)]
    assert (await kid.result(prompt.id)) == pico.InputResult("running")
    # A later parent change does not reach the child: a copy, not a live link.
    await c.set_value(MODEL, "small")
    assert await kid.get_value(MODEL) == "big"
    await h.close()


async def test_the_child_answer_settles_its_owner_with_a_result_reference(
    backend: Backend,
) -> None:
    provider = FauxProvider(["the parent's answer", "the tests pass"])
    h = await backend.open(provider=provider)
    c = await h.root()
    await c.accept("hello")
    assert await c.drive() == "idle"
    s = await c.spawn("Inspect only tests")
    assert await h.drive() == "idle"  # the session drive supervises detached work
    owner, child = await _spawned(h, s)
    assert owner.status == "done"
    result = _state(owner)["result"]
    answer = await h.entry(result["entry_id"])
    assert answer is not None and _text(answer) == "the tests pass"
    assert answer.conversation_id == child
    assert result["status"] == "done"
    # The child's own input result agrees with its owner's.
    kid = await h.conversation(child)
    assert kid is not None
    prompt = _state(owner)["prompt"]
    assert await kid.result(prompt) == pico.InputResult("done", answer.id)
    # A fresh child saw only its prompt; the parent's transcript is untouched.
    assert [m.text for m in provider.requests[-1].messages] == ["Inspect only tests"]
    assert [e.kind for e in await c.context_entries()] == ["user", "assistant"]
    await h.close()


async def test_an_inherited_context_is_the_parents_complete_prefix(backend: Backend) -> None:
    provider = FauxProvider(["first answer", "child answer"])
    h = await backend.open(provider=provider)
    c = await h.root()
    await c.accept("Inspect the parser")
    assert await c.drive() == "idle"
    s = await c.spawn("Now only the tests", context="inherit")
    _, child = await _spawned(h, s)
    kid = await h.conversation(child)
    assert kid is not None
    parent_ids = [e.id for e in await c.context_entries()]
    child_ids = [e.id for e in await kid.context_entries()]
    assert child_ids[:-1] == parent_ids  # the same entries, not copies
    assert await h.drive() == "idle"
    texts = [m.text for m in provider.requests[-1].messages]
    assert texts == ["Inspect the parser", "first answer", "Now only the tests"]
    # The child's writes never reach the parent.
    assert [e.id for e in await c.context_entries()] == parent_ids
    await h.close()


async def test_the_parent_drive_neither_waits_for_nor_aborts_detached_children(
    backend: Backend,
) -> None:
    inner = FauxProvider(["parent answer", "child answer"])
    provider = GatedProvider(inner, "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()  # the child's generation is streaming, held
    await c.accept("parent work")
    assert await asyncio.wait_for(c.drive(), 5) == "idle"  # not waiting for the child
    assert (await h.task(s)).status == "waiting"  # type: ignore[union-attr]
    assert await c.abort() == []  # the child's foreground work is not required here
    provider.release.set()
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(s)).status == "done"  # type: ignore[union-attr]
    await h.close()


async def test_abort_background_cancels_the_owner_and_its_child_work(backend: Backend) -> None:
    provider = GatedProvider(FauxProvider(["never published"]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()
    marked = await c.abort_background(s)
    generation = (await h.tasks(conversation_ids=[child], kind="generation")).items[0].id
    assert sorted(marked) == sorted([s, generation])
    assert await asyncio.wait_for(drive, 5) == "idle"
    owner = await h.task(s)
    assert owner is not None and owner.status == "aborted"
    assert _state(owner)["result"] == {"status": "cancelled", "reason": "aborted"}
    kid = await h.conversation(child)
    assert kid is not None
    assert (await kid.result(_state(owner)["prompt"])).status == "cancelled"  # type: ignore[union-attr]
    assert [e.kind for e in await kid.context_entries()] == ["user"]  # no answer published
    await h.close()


async def test_aborting_the_child_directly_cancels_its_owner_within_the_child_drive(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider(["never published"]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    kid = await h.conversation(child)
    assert kid is not None
    drive = asyncio.ensure_future(kid.drive())
    await provider.entered.wait()
    marked = await kid.abort()
    assert s in marked  # the owner is completed as cancelled too (§6.5)
    # The child drive finishes its marked owner's cancellation, though S is the parent's.
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(s)).status == "aborted"  # type: ignore[union-attr]
    await h.close()


@pytest.mark.parametrize("order", ["owner marked first", "child settles first"])
async def test_a_child_finishing_during_owner_cancellation_never_reports_success(
    backend: Backend, order: str
) -> None:
    """§10.2 "Child finishes during owner cancellation", both durable orders: the owner is
    marked while its child's generation is held (the child's work left unmarked), or the
    child's settlement commits before the mark."""
    provider = GatedProvider(FauxProvider(["child answer"]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()
    if order == "owner marked first":
        assert await h.command(lambda tx: tx.request_abort(s)) is True
        provider.release.set()
        assert await asyncio.wait_for(drive, 5) == "idle"
        owner = await h.task(s)
        assert owner is not None and owner.status == "aborted"  # not "done"
        assert _state(owner)["result"]["status"] == "cancelled"
        kid = await h.conversation(child)
        assert kid is not None  # the child's own answer stands in its transcript
        assert [e.kind for e in await kid.context_entries()] == ["user", "assistant"]
    else:
        provider.release.set()
        assert await asyncio.wait_for(drive, 5) == "idle"
        assert await h.command(lambda tx: tx.request_abort(s)) is False  # terminal: no-op
        owner = await h.task(s)
        assert owner is not None and owner.status == "done"
    await h.close()


async def test_a_failed_child_fails_its_owner(backend: Backend) -> None:
    h = await backend.open(provider=FauxProvider([FauxFailure("fatal", "the model refused")]))
    c = await h.root()
    s = await c.spawn("child work")
    assert await h.drive() == "idle"
    owner = await h.task(s)
    assert owner is not None and owner.status == "failed"
    assert _state(owner)["result"]["status"] == "failed"
    assert "the model refused" in _state(owner)["result"]["reason"]
    await h.close()


async def test_recovery_drives_the_existing_child_and_never_recreates_it(
    backend: Backend,
) -> None:
    provider = GatedProvider(FauxProvider([]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()  # streaming intent is durable, the stream is held
    await h.close()  # the process ends between creation and child completion
    await asyncio.gather(drive, return_exceptions=True)
    h = await backend.open(provider=FauxProvider(["recovered answer"]))
    conversations = (await h.conversations()).items
    assert await h.drive() == "idle"
    owner = await h.task(s)
    assert owner is not None and owner.status == "done"
    assert owner.owned_conversation_id == child
    assert len((await h.conversations()).items) == len(conversations)  # no new child
    answer = await h.entry(_state(owner)["result"]["entry_id"])
    assert answer is not None and _text(answer) == "recovered answer"
    await h.close()


async def test_a_waiting_owner_whose_child_has_no_work_left_is_repaired_from_its_result(
    backend: Backend,
) -> None:
    """An owner stored waiting although its child already reached its boundary (a session
    written before owners were settled by the boundary) settles from the prompt's result."""
    h = await backend.open(provider=FauxProvider(["child answer"]))
    c = await h.root()

    def legacy(tx: pico.Command) -> tuple[int, int]:
        s = tx.create_task(c.id, "subagent", status="waiting", state={})
        child = tx.create_owned_conversation(s)
        prompt = tx.append_entry(child, "user", "child work")
        tx.patch_task(s, state={"prompt": prompt})
        return s, prompt

    s, prompt = await h.command(legacy)

    def record(tx: pico.Command) -> None:
        with tx.core():  # the prompt's result, as the child's boundary recorded it
            tx.set_value(input_result_address(prompt), {"status": "done", "entry_id": prompt})

    await h.command(record)
    assert await h.drive() == "idle"
    owner = await h.task(s)
    assert owner is not None and owner.status == "done"
    assert _state(owner)["result"] == {"status": "done", "entry_id": prompt}
    await h.close()


async def test_bad_spawn_arguments_are_refused_and_change_nothing(backend: Backend) -> None:
    h = await backend.open(provider=FauxProvider([]))
    c = await h.root()
    head = h.head()
    with pytest.raises(pico.InvalidArgumentError, match="context"):
        await c.spawn("x", context="both")
    with pytest.raises(pico.InvalidArgumentError, match="not registered"):
        await c.spawn("x", tools=["no-such-tool"])
    with pytest.raises(pico.InvalidJsonError):
        await c.spawn(float("nan"))
    with pytest.raises(pico.AddressPolicyError):
        await c.spawn("x", values=pico.Initialization(inherit=[NOTES]))
    assert h.head() == head
    assert not (await h.tasks(kind="subagent")).items
    s = await c.spawn("x")  # the handle stays usable
    assert (await h.task(s)) is not None
    await h.close()


async def test_a_harness_without_a_provider_cannot_spawn(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    with pytest.raises(pico.CommandRejectedError, match="model provider"):
        await c.spawn("x")
    await h.close()


async def test_reopening_live_subagent_work_without_a_model_says_to_pass_one(
    backend: Backend,
) -> None:
    h = await backend.open(provider=FauxProvider([]))
    c = await h.root()
    await c.spawn("child work")
    await h.close()
    with pytest.raises(pico.TaskDefinitionError, match=r"provider="):
        await backend.open()
    h = await backend.open(provider=FauxProvider(["done"]))  # nothing was changed
    assert await h.drive() == "idle"
    await h.close()


def test_the_built_in_kinds_are_the_agent_flows_definitions() -> None:
    from pico.application.flows import agent_definitions
    from pico.application.tasks import BUILT_IN_KINDS

    services = pico.AgentServices(provider=FauxProvider([]))
    assert {d.kind for d in agent_definitions(services)} == BUILT_IN_KINDS


async def test_a_child_turn_cancelled_on_its_own_settles_its_owner_as_cancelled(
    backend: Backend,
) -> None:
    """Only the child's generation is marked (not the owner): its cancellation ends the
    child's input group, so the owner is settled too instead of waiting forever."""
    provider = GatedProvider(FauxProvider(["never published"]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()
    (generation,) = (await h.tasks(conversation_ids=[child], kind="generation")).items
    assert await h.command(lambda tx: tx.request_abort(generation.id)) is True
    assert await asyncio.wait_for(drive, 5) == "idle"  # not "suspended" on a waiting owner
    owner = await h.task(s)
    assert owner is not None and owner.status == "aborted"
    assert _state(owner)["result"] == {"status": "cancelled", "reason": "aborted"}
    await h.close()


async def test_no_new_work_starts_beneath_an_owner_marked_for_cancellation(
    backend: Backend,
) -> None:
    """§6.4: background cancellation prevents new work beneath its marked owner — a spawn
    inside the child is refused and writes nothing — until the cancellation settles; the
    child is an ordinary conversation again afterwards."""
    provider = GatedProvider(FauxProvider(["later answer"]), "child work")
    h = await backend.open(provider=provider)
    c = await h.root()
    s = await c.spawn("child work")
    _, child = await _spawned(h, s)
    kid = await h.conversation(child)
    assert kid is not None
    drive = asyncio.ensure_future(h.drive())
    await provider.entered.wait()
    await c.abort_background(s)
    head = h.head()
    with pytest.raises(pico.TaskGraphError, match="marked for cancellation"):
        await kid.spawn("nested work beneath a marked owner")
    assert h.head() == head
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(s)).status == "aborted"  # type: ignore[union-attr]
    nested = await kid.spawn("nested work after the cancellation settled")
    assert await h.drive() == "idle"
    assert (await h.task(nested)).status == "done"  # type: ignore[union-attr]
    await h.close()


class _HoldsTheChild(GatedProvider):
    """Also holds the child's request after it spawned the grandchild (its context opens
    with the child's prompt) until ``child_release``: the parent's abort then lands while
    the child's work, and so its owner, is live, whatever order the loop runs them in."""

    def __init__(self, inner: FauxProvider, key: str) -> None:
        super().__init__(inner, key)
        self.child_entered = asyncio.Event()
        self.child_release = asyncio.Event()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        messages = request.messages
        if len(messages) > 1 and messages[0].text == "child task":
            self.child_entered.set()
            await self.child_release.wait()
        async for event in super().stream(request):
            yield event


async def test_a_marked_owner_does_not_wait_for_detached_work_beneath_its_child(
    backend: Backend,
) -> None:
    """The parent aborts a foreground delegation whose child started a background
    grandchild: the owner settles once its SELECTED child work is terminal, and the parent
    drive returns, while the unselected grandchild (held at a barrier) keeps working."""
    from pico import FauxResponse

    calls: list[ScriptItem] = [
        FauxResponse(tool_calls=[("subagent", {"prompt": "child task"})]),
        FauxResponse(tool_calls=[("subagent", {"prompt": "grand work", "background": True})]),
        "child answer",
        "grand answer",
    ]
    provider = _HoldsTheChild(FauxProvider(calls), "grand work")
    tools = [pico.subagent_tool(tools=["subagent"])]
    h = await backend.open(provider=provider, tools=tools)
    c = await h.root()
    question = await c.accept("go")
    drive = asyncio.ensure_future(c.drive())
    await provider.entered.wait()  # the grandchild streams, held
    await provider.child_entered.wait()  # and the child's next request: its owner is live
    (owner,) = (await h.tasks(conversation_ids=[c.id], kind="subagent")).items
    child = owner.owned_conversation_id or 0
    (grand,) = (await h.tasks(conversation_ids=[child], kind="subagent")).items
    marked = await c.abort()
    assert owner.id in marked and grand.id not in marked
    assert await asyncio.wait_for(drive, 5) == "idle"
    assert (await h.task(owner.id)).status == "aborted"  # type: ignore[union-attr]
    assert (await c.result(question)).status == "cancelled"  # type: ignore[union-attr]
    assert (await h.task(grand.id)).status == "waiting"  # type: ignore[union-attr]
    provider.release.set()
    assert await asyncio.wait_for(h.drive(), 5) == "idle"
    assert (await h.task(grand.id)).status == "done"  # type: ignore[union-attr]
    await h.close()
