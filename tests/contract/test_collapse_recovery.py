"""Collapse recovery (§8.5), on every backend: an attempt whose complete candidate (summary
and reported usage) is durable is published on recovery without asking the summarizer
again and with its usage recorded once; an attempt interrupted before that retries within
the captured budget, or fails and the generation waiting on it proceeds unchanged; an
abort keeps the known usage and replaces nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pico
from pico.application.model import Done, Message, Request, Response, TextDelta, TextPart
from pico.infrastructure.container import open_storage
from tests.backends import Backend
from tests.integration.test_crash_and_faults import FaultyStorage


class Summarizer:
    """A model provider that answers every request with one summary and a reported usage,
    or (``hold``) starts the answer and never finishes it."""

    def __init__(
        self, text: str = "", usage: pico.Usage | None = None, *, hold: bool = False
    ) -> None:
        self.text = text
        self.usage = usage
        self.hold = hold
        self.requests: list[Request] = []
        self.started = asyncio.Event()

    async def stream(self, request: Request) -> AsyncIterator[Any]:
        self.requests.append(request)
        self.started.set()
        if self.hold:
            await asyncio.Event().wait()  # interrupted here: no candidate exists
        yield TextDelta(self.text)
        message = Message("assistant", (TextPart(self.text),))
        yield Done(Response(message, "end_turn", self.usage))

    async def poll(self, handle: str) -> Any:
        raise AssertionError("a summary is never deferred")


class DiesBeforePublishing(FaultyStorage):
    """The real storage; once the watched collapse's candidate is durable, the next write
    (its publication) calls ``die`` instead of committing — as if the process died
    between the two commands."""

    def __init__(self, inner: Any, die: Callable[[], None]) -> None:
        super().__init__(inner)
        self.die = die
        self.watch: int | None = None
        self.armed = False

    def save(
        self, aggregates: Sequence[Any], *, working: Sequence[Any] = (), defer: bool = False
    ) -> None:
        if self.armed:
            self.die()
        self.inner.save(aggregates, working=working, defer=defer)
        if self.watch is not None:
            task = self.inner.tasks.get_tasks([self.watch]).get(self.watch)
            state = task.state if task is not None else None
            self.armed = isinstance(state, dict) and state.get("phase") == "candidate"


def _die() -> None:
    raise OSError("the process died before the summary was published")


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, timeout=10)


async def _history(c: pico.ConversationHandle, turns: int = 3) -> None:
    for i in range(turns):
        await c.append("user", f"question {i}")
        await c.append("assistant", {"text": f"answer {i}"})


async def _die_before_publishing(backend: Backend, usage: pico.Usage) -> int:
    """Run one collapse whose candidate is recorded and whose publication never commits;
    return its id. The owner is closed afterwards, as a crashed one would be gone."""
    storage = DiesBeforePublishing(
        open_storage(backend.url, session=backend.session, durability=None, read_only=False),
        _die,
    )
    h = await pico.Harness.open(storage, provider=Summarizer("the recorded summary", usage))
    c = await h.root()
    await _history(c)
    collapse = await c.collapse()
    storage.watch = collapse
    with contextlib.suppress(pico.PicoError):  # the publication's write failed: faulted
        await _bounded(c.drive())
    assert storage.armed and h.faulted is not None
    await h.close()
    return collapse


async def test_a_recorded_candidate_is_published_on_recovery_without_asking_again(
    backend: Backend,
) -> None:
    collapse = await _die_before_publishing(backend, pico.Usage(120, 30))
    fresh = Summarizer("a second summary that must not be asked for")
    h = await backend.open(provider=fresh)
    left = await h.task(collapse)
    assert left is not None and left.status == "summarizing"  # in flight, not published
    assert isinstance(left.state, dict) and left.state["phase"] == "candidate"
    c = await h.root()
    assert [e.kind for e in await c.context_entries()] == ["user", "assistant"] * 3
    assert await _bounded(c.drive()) == "idle"
    assert fresh.requests == []  # the summarizer was not called again
    done = await h.task(collapse)
    assert done is not None and done.status == "done"
    assert isinstance(done.state, dict)
    assert done.state["usage"] == {"input": 120, "output": 30}  # recorded once, not twice
    context = await c.context_entries()
    assert [e.kind for e in context] == ["summary", "user", "assistant"]
    assert context[0].content == "the recorded summary"
    assert context[0].id == done.state["summary_entry"]
    await h.close()


async def test_a_recorded_candidate_goes_stale_on_recovery_when_the_prefix_changed(
    backend: Backend,
) -> None:
    collapse = await _die_before_publishing(backend, pico.Usage(7, 3))
    fresh = Summarizer("never asked")
    h = await backend.open(provider=fresh)
    c = await h.root()
    handoff = await c.handoff("start over")  # a competing edit before recovery publishes
    assert await _bounded(c.drive()) == "idle"
    stale = await h.task(collapse)
    assert stale is not None and stale.status == "stale"
    assert isinstance(stale.state, dict) and stale.state["usage"] == {"input": 7, "output": 3}
    assert fresh.requests == []
    assert [e.id for e in await c.context_entries()] == [handoff]
    assert not [e for e in (await c.entries()).items if e.kind == "summary"]
    await h.close()


async def _interrupt_summarizing(backend: Backend, *, budget: int, prompt: bool) -> int:
    """Start a collapse (or a turn over the context budget that waits on one), close the
    owner while the summarizer has not answered, and return the collapse's id."""
    held = Summarizer(hold=True)
    h = await backend.open(provider=held)
    assert h.services is not None
    h.services.max_attempts = budget  # captured by the collapse when it is created
    c = await h.root()
    await _history(c)
    if prompt:
        h.services.context_budget = 10  # estimated tokens: the turn collapses first
        await c.accept("and now?")
    else:
        await c.collapse()
    drive = asyncio.ensure_future(c.drive())
    await _bounded(held.started.wait())
    (collapse,) = (await h.tasks(kind="collapse", limit=5)).items
    assert collapse.status == "summarizing"
    await h.close()  # the owner goes away mid-summary: nothing is recorded
    await _bounded(drive)
    return collapse.id


async def test_an_attempt_interrupted_before_its_candidate_asks_again_once(
    backend: Backend,
) -> None:
    collapse = await _interrupt_summarizing(backend, budget=3, prompt=False)
    fresh = Summarizer("the retried summary", pico.Usage(50, 10))
    h = await backend.open(provider=fresh)
    left = await h.task(collapse)
    assert left is not None and isinstance(left.state, dict)
    assert "summary" not in left.state and "usage" not in left.state
    through = left.state["through"]
    c = await h.root()
    assert await _bounded(c.drive()) == "idle"
    assert len(fresh.requests) == 1  # asked exactly once more
    done = await h.task(collapse)
    assert done is not None and done.status == "done" and isinstance(done.state, dict)
    assert done.state["attempt"] == 1 and done.state["through"] == through  # same cut
    assert done.state["usage"] == {"input": 50, "output": 10}
    context = await c.context_entries()
    assert [e.kind for e in context] == ["summary", "user", "assistant"]
    assert context[0].content == "the retried summary"
    await h.close()


async def test_an_interrupted_collapse_with_no_attempts_left_fails_and_the_turn_proceeds(
    backend: Backend,
) -> None:
    collapse = await _interrupt_summarizing(backend, budget=1, prompt=True)
    # The same provider class (the resume gate refuses another provider: hard).
    fresh = Summarizer("answered with the full context")
    h = await backend.open(provider=fresh)  # this owner's default budget is 3: unused
    c = await h.root()
    (generation,) = (await h.tasks(kind="generation", limit=5)).items
    assert collapse in generation.after  # the turn waits on the interrupted collapse
    assert await _bounded(c.drive()) == "idle"
    failed = await h.task(collapse)
    assert failed is not None and failed.status == "failed" and isinstance(failed.state, dict)
    assert "interrupted" in str(failed.state["error"]) and failed.state["attempt"] == 1
    assert len(fresh.requests) == 1  # only the turn's request: no summary retried
    assert fresh.requests[0].messages[0].text == "question 0"  # the context is unchanged
    (question,) = [e for e in (await c.entries()).items if e.content == "and now?"]
    result = await c.result(question.id)
    assert result is not None and result.status == "done"
    assert not [e for e in (await c.entries()).items if e.kind == "summary"]
    await h.close()


async def test_an_aborted_collapse_keeps_its_recorded_usage_and_replaces_nothing(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    provider = pico.FauxProvider(
        ["a summary", "a long streamed answer"], chunk_chars=2, cadence=1.0, clock=clock
    )
    h = await backend.open(provider=provider, clock=clock)
    c = await h.root()
    await _history(c)
    collapse = await c.collapse()
    drive = asyncio.ensure_future(c.drive())

    async def until(status: str, *, tick: bool) -> None:
        while (task := await h.task(collapse)) is None or task.status != status:
            assert not drive.done(), "the drive ended first"
            if tick:
                clock.advance(1.0)
            await asyncio.sleep(0)

    await _bounded(until("summarizing", tick=False))
    await c.accept("a new question")  # the context is busy when the summary completes
    await _bounded(until("parked", tick=True))
    parked = await h.task(collapse)
    assert parked is not None and isinstance(parked.state, dict)
    usage = parked.state["usage"]
    assert isinstance(usage, dict) and isinstance(usage["input"], int) and usage["input"] > 0
    before = [e.id for e in await c.context_entries()]
    assert collapse in await c.abort()
    while not drive.done():
        clock.advance(1.0)
        await asyncio.sleep(0)
    aborted = await h.task(collapse)
    assert aborted is not None and aborted.status == "aborted"
    assert isinstance(aborted.state, dict) and aborted.state["usage"] == usage
    assert [e.id for e in await c.context_entries()][: len(before)] == before
    assert not [e for e in (await c.entries()).items if e.kind == "summary"]
    await h.close()


async def test_a_collapse_aborted_while_summarizing_settles_without_a_summary(
    backend: Backend,
) -> None:
    held = Summarizer(hold=True)
    h = await backend.open(provider=held)
    c = await h.root()
    await _history(c)
    before = (await c.snapshot()).context
    collapse = await c.collapse()
    drive = asyncio.ensure_future(c.drive())
    await _bounded(held.started.wait())
    assert await c.abort() == [collapse]
    assert await _bounded(drive) == "idle"
    aborted = await h.task(collapse)
    assert aborted is not None and aborted.status == "aborted"
    assert isinstance(aborted.state, dict) and "usage" not in aborted.state  # unknown
    assert (await c.snapshot()).context == before and len(held.requests) == 1
    await h.close()
