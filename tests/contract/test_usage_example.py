"""§9.5 end-to-end usage, spawn included (watch comes with its own issue)."""

from __future__ import annotations

import asyncio
from typing import Any

import pico
from pico import FauxProvider
from tests.backends import Backend


async def test_the_end_to_end_usage_example(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(
        [
            "The parser has two problems.",
            "a long answer that will be aborted",
            "The tests look fine.",
            "Here is a loop-based implementation.",
        ],
        chunk_chars=3,
        cadence=1.0,
        clock=clock,
    )
    h = await backend.open(provider=provider, clock=clock)
    c = await h.root()

    async def drive(conv: pico.ConversationHandle) -> str:
        task = asyncio.ensure_future(conv.drive())
        while not task.done():
            clock.advance(1.0)
            await asyncio.sleep(0)
        return task.result()

    async def drive_session() -> str:
        task = asyncio.ensure_future(h.drive())
        while not task.done():
            clock.advance(1.0)
            await asyncio.sleep(0)
        return task.result()

    accepted = await c.accept("Inspect the parser", request_id="web-42")
    assert await drive(c) == "idle"
    result = await c.result(accepted)
    assert result is not None and result.status == "done"
    completed_answer = result.entry_id
    assert completed_answer is not None
    shown = await h.entry(completed_answer)
    assert shown is not None and shown.kind == "assistant"

    # Cancellation is durable intent; keep or start a drive for cleanup.
    second = await c.accept("Explain everything")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(20):
        await asyncio.sleep(0)
    await c.abort()
    while not driving.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert driving.result() == "idle"
    assert (await c.result(second)).status == "cancelled"  # type: ignore[union-attr]
    assert await drive(c) == "idle"  # also covers a previously idle drive
    assert await h.drive() == "idle"  # supervises everything

    # Application values copied into the child (which tools it is offered is spawn's
    # tools=; here every registered tool, none).
    active_tools = pico.conversation_value("demo.active-tools", list[str], rewind=False)
    model = pico.conversation_value("demo.model", str, rewind=False)
    await c.set_value(model, "faux-large")
    child = await c.spawn(
        "Inspect only tests",
        context="fresh",
        values=pico.Initialization(inherit=[model], set=[(active_tools, ["read"])]),
    )
    spawned = await h.task(child)
    assert spawned is not None and spawned.status == "waiting"  # no effect started here
    assert await drive_session() == "idle"  # supervise detached work too
    spawned = await h.task(child)
    assert spawned is not None and spawned.status == "done"
    assert isinstance(spawned.state, dict)
    reference: Any = spawned.state["result"]  # the result reference S keeps
    assert reference["status"] == "done"
    kid = await h.conversation(spawned.owned_conversation_id or 0)
    assert kid is not None
    assert await kid.get_value(model) == "faux-large"
    assert await kid.get_value(active_tools) == ["read"]
    answer = await h.entry(reference["entry_id"])
    assert answer is not None and answer.content == {"text": "The tests look fine."}

    alternate = await c.fork(at_entry=completed_answer)
    third = await alternate.accept("Try a different implementation")
    assert await drive(alternate) == "idle"  # source and unrelated forks remain parked
    alt = await alternate.result(third)
    assert alt is not None and alt.status == "done"
    # The alternate saw history through the answer, not the aborted question after it.
    texts = [m.text for m in provider.requests[-1].messages]
    assert "Explain everything" not in texts and texts[-1] == "Try a different implementation"
    await h.close()


async def test_one_oldest_input_of_each_mode_is_placed_per_boundary(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(["a", "b", "c"], chunk_chars=1, cadence=1.0, clock=clock)
    h = await backend.open(provider=provider, clock=clock)
    assert h.services is not None
    h.services.queue_selection = "one"
    c = await h.root()
    await c.accept("start")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(20):
        await asyncio.sleep(0)
    f1 = await c.follow_up("f1")
    f2 = await c.follow_up("f2")
    while not driving.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    # One follow-up per answer boundary, oldest first: f1 after "a", f2 after "b".
    user_texts = [[m.text for m in r.messages if m.role == "user"][-1] for r in provider.requests]
    assert user_texts == ["start", "f1", "f2"]
    assert [(await c.result(i)).status for i in (f1, f2)] == ["done", "done"]  # type: ignore[union-attr]
    await h.close()
