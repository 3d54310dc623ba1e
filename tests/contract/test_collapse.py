"""Collapse (§8.5) and overflow (§8.3), on every backend with the faux provider."""

from __future__ import annotations

import asyncio
from typing import Any

import pico
from pico import FauxFailure, FauxProvider
from tests.backends import Backend


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


async def _history(h: pico.Harness, c: pico.ConversationHandle, turns: int) -> None:
    for i in range(turns):
        await c.append("user", f"question {i}")
        await c.append("assistant", {"text": f"answer {i}"})


async def test_an_idle_collapse_replaces_a_complete_prefix(backend: Backend) -> None:
    provider = FauxProvider(["Summary of the first questions."])
    h = await backend.open(provider=provider)
    c = await h.root()
    await _history(h, c, 3)
    transcript = [e.id for e in (await c.entries()).items]
    collapse = await c.collapse(instructions="Keep names.")
    assert await c.collapse() == collapse  # one live collapse per conversation
    assert await _bounded(c.drive()) == "idle"
    task = await h.task(collapse)
    assert task is not None and task.status == "done"
    context = await c.context_entries()
    assert [e.kind for e in context] == ["summary", "user", "assistant"]
    assert context[0].content == "Summary of the first questions."
    assert [e.id for e in (await c.entries()).items][: len(transcript)] == transcript
    assert "Keep names." in provider.requests[0].messages[-1].text
    await h.close()


async def test_a_collapse_computed_while_busy_publishes_when_the_context_is_editable(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(
        ["a summary", "a long streamed answer"], chunk_chars=2, cadence=1.0, clock=clock
    )
    h = await backend.open(provider=provider, clock=clock)
    c = await h.root()
    await _history(h, c, 3)
    collapse = await c.collapse()
    # The summary streams first; then a turn starts before it is published.
    drive = asyncio.ensure_future(c.drive())
    while (await h.task(collapse)).status == "pending":  # type: ignore[union-attr]
        await asyncio.sleep(0)
    input_id = await c.accept("a new question")
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert drive.result() == "idle"
    assert (await h.task(collapse)).status == "done"  # type: ignore[union-attr]
    assert (await c.result(input_id)).status == "done"  # type: ignore[union-attr]
    assert (await c.context_entries())[0].kind == "summary"
    await h.close()


async def test_a_competing_reset_makes_a_prepared_summary_stale(backend: Backend) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(
        ["a summary that arrives late"], chunk_chars=2, cadence=1.0, clock=clock
    )
    h = await backend.open(provider=provider, clock=clock)
    c = await h.root()
    await _history(h, c, 3)
    collapse = await c.collapse()
    drive = asyncio.ensure_future(c.drive())
    while (await h.task(collapse)).status != "summarizing":  # type: ignore[union-attr]
        await asyncio.sleep(0)
    handoff = await c.handoff("start over")  # competes while the summary streams
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert (await h.task(collapse)).status == "stale"  # type: ignore[union-attr]
    assert [e.id for e in await c.context_entries()] == [handoff]
    assert not [e for e in (await c.entries()).items if e.kind == "summary"]
    await h.close()


async def test_overflow_collapses_then_retries_the_same_generation(backend: Backend) -> None:
    provider = FauxProvider(
        [FauxFailure("overflow", "context too long"), "the summary", "answered with less context"]
    )
    h = await backend.open(provider=provider)
    c = await h.root()
    await _history(h, c, 3)
    input_id, result = await _bounded(c.prompt("one more question"))
    assert result is not None and result.status == "done"
    generations = (await h.tasks(kind="generation", limit=5)).items
    assert len(generations) == 1 and generations[0].status == "done"  # the SAME task
    (collapse,) = (await h.tasks(kind="collapse", limit=5)).items
    assert collapse.status == "done"
    final_request = provider.requests[-1].messages
    assert final_request[0].text.startswith("the summary")
    assert input_id
    await h.close()


async def test_a_second_overflow_fails_instead_of_looping(backend: Backend) -> None:
    provider = FauxProvider([FauxFailure("overflow"), "summary", FauxFailure("overflow")])
    h = await backend.open(provider=provider)
    c = await h.root()
    await _history(h, c, 3)
    _, result = await _bounded(c.prompt("too big"))
    assert result is not None and result.status == "failed"
    await h.close()


async def test_before_collapse_can_decline_and_fails_closed(backend: Backend) -> None:
    calls: list[int] = []

    async def decline(conversation_id: int) -> pico.CollapseDecision:
        calls.append(conversation_id)
        if len(calls) == 2:
            raise RuntimeError("policy down")  # raising declines too
        return pico.CollapseDecision("decline")

    provider = FauxProvider([])
    h = await backend.open(provider=provider, hooks=pico.Hooks(before_collapse=decline))
    c = await h.root()
    await _history(h, c, 3)
    context = (await c.snapshot()).context
    for _ in range(2):
        collapse = await c.collapse()
        assert await _bounded(c.drive()) == "idle"
        assert (await h.task(collapse)).status == "declined"  # type: ignore[union-attr]
    assert (await c.snapshot()).context == context and provider.request_count == 0
    await h.close()


async def test_a_competing_compaction_keeping_the_cut_still_makes_it_stale(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = FauxProvider(["late summary"], chunk_chars=2, cadence=1.0, clock=clock)
    h = await backend.open(provider=provider, clock=clock)
    c = await h.root()
    await _history(h, c, 4)
    first = (await c.snapshot()).context[0]
    collapse = await c.collapse()
    drive = asyncio.ensure_future(c.drive())
    while (await h.task(collapse)).status != "summarizing":  # type: ignore[union-attr]
        await asyncio.sleep(0)
    task = await h.task(collapse)
    assert task is not None and isinstance(task.state, dict)
    through = task.state["through"]
    other = await c.compact("someone else's summary", through=first)  # cut stays selected
    assert through in (await c.snapshot()).context
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert drive.result() == "idle" and h.faulted is None
    assert (await h.task(collapse)).status == "stale"  # type: ignore[union-attr]
    assert (await c.context_entries())[0].id == other
    await h.close()


async def test_over_the_budget_a_collapse_runs_before_the_request_once(
    backend: Backend,
) -> None:
    provider = FauxProvider(["the summary", "answered from the summary"])
    h = await backend.open(provider=provider)
    assert h.services is not None
    h.services.context_budget = 10  # estimated tokens
    c = await h.root()
    await _history(h, c, 4)
    _, result = await _bounded(c.prompt("and now?"))
    assert result is not None and result.status == "done"
    (collapse,) = (await h.tasks(kind="collapse", limit=5)).items
    (generation,) = (await h.tasks(kind="generation", limit=5)).items
    assert collapse.status == "done" and collapse.id in generation.after
    assert provider.request_count == 2  # the summary, then ONE answer request
    assert provider.requests[1].messages[0].text == "the summary"
    await h.close()


async def test_a_declined_automatic_collapse_leaves_the_context_unchanged(
    backend: Backend,
) -> None:
    async def decline(conversation_id: int) -> pico.CollapseDecision:
        return pico.CollapseDecision("decline")

    provider = FauxProvider(["answered with the full context"])
    h = await backend.open(provider=provider, hooks=pico.Hooks(before_collapse=decline))
    assert h.services is not None
    h.services.context_budget = 10
    c = await h.root()
    await _history(h, c, 4)
    _, result = await _bounded(c.prompt("and now?"))
    assert result is not None and result.status == "done"
    assert provider.request_count == 1  # no retry loop creating collapses
    assert len((await h.tasks(kind="collapse", limit=5)).items) == 1
    await h.close()
