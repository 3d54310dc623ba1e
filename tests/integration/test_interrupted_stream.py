"""A process killed while a generation streams (§8.3): the next owner publishes the
committed partial as the interrupted answer and never calls the provider for it again;
with no committed partial it retries within the captured budget, or fails once it is
spent. Never a fabricated answer."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap

import pico
from pico import FauxProvider
from tests.backends import Backend
from tests.processes import spawn_child

CHUNK = "abcdefghij" * 10  # 100 characters
#: Six chunks fill one frame (>= 512 characters): it is committed before the seventh.
PARTIAL = CHUNK * 6

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import pico
    from pico.application.model import TextDelta

    class Hanging:
        def __init__(self, chunks):
            self.chunks = chunks

        async def stream(self, request):
            for _ in range(self.chunks):
                yield TextDelta(sys.argv[5])
            # Resumed only after the frame write above was awaited: the partial is
            # committed (or there is none). The process dies here, mid-stream.
            print("streaming", flush=True)
            await asyncio.Event().wait()

        async def poll(self, handle):
            raise AssertionError("not deferred")

    async def main(url, session, chunks, budget):
        h = await pico.Harness.open(url, session=session, provider=Hanging(chunks))
        h.services.max_attempts = budget
        c = await h.root()
        await c.accept("tell me a long story")
        await c.drive()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    """
)


async def _crash_mid_stream(backend: Backend, *, chunks: int, budget: int) -> None:
    """Run a child that streams ``chunks`` chunks and hangs; SIGKILL it once it says so."""
    proc = spawn_child(CHILD, backend.url, backend.session, str(chunks), str(budget), CHUNK)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=30)
        assert line.strip() == "streaming"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


async def _the_streaming_generation(h: pico.Harness) -> pico.TaskSnapshot:
    (generation,) = (await h.tasks(kind="generation", limit=10)).items
    assert generation.status == "streaming"  # the crash left it in flight
    return generation


async def test_a_committed_partial_is_published_as_the_interrupted_answer(
    sql_backend: Backend,
) -> None:
    await _crash_mid_stream(sql_backend, chunks=6, budget=3)
    fresh = FauxProvider(["a fabricated answer"])
    h = await sql_backend.open(provider=fresh)
    generation = await _the_streaming_generation(h)
    frames = pico.working_list(
        "pico.frames", str, scope=pico.working_scope(f"task/{generation.id}")
    )
    assert "".join(e.value for e in (await h.read_list(frames)).items) == PARTIAL
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert fresh.requests == []  # the interrupted response is not asked for again
    (user, answer) = await c.context_entries()
    result = await c.result(user.id)
    assert result is not None and result.status == "interrupted"
    assert result.entry_id == answer.id
    assert answer.kind == "assistant" and answer.content == {"text": PARTIAL}
    assert answer.metadata["interrupted"] is True  # type: ignore[index]
    assert answer.metadata["stop_reason"] == "interrupted"  # type: ignore[index]
    assert (await h.task(generation.id)).status == "done"  # type: ignore[union-attr]
    assert (await h.read_list(frames)).items == ()  # the working scope is retired
    # The conversation goes on: the next turn sees the partial answer in its context.
    _, nxt = await c.prompt("go on")
    assert nxt is not None and nxt.status == "done"
    assert [m.text for m in fresh.requests[0].messages] == [
        "tell me a long story",
        PARTIAL,
        "go on",
    ]
    await h.close()


async def test_no_committed_partial_retries_the_request_within_the_budget(
    sql_backend: Backend,
) -> None:
    await _crash_mid_stream(sql_backend, chunks=0, budget=3)
    fresh = FauxProvider(["the whole answer"])
    h = await sql_backend.open(provider=fresh)
    generation = await _the_streaming_generation(h)
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert len(fresh.requests) == 1  # retried once, by the same generation
    (user, answer) = await c.context_entries()
    result = await c.result(user.id)
    assert result is not None and result.status == "done" and result.entry_id == answer.id
    assert answer.content == {"text": "the whole answer"}
    assert "interrupted" not in (answer.metadata or {})
    done = await h.task(generation.id)
    assert done is not None and done.status == "done"
    assert isinstance(done.state, dict) and done.state["attempt"] == 1
    await h.close()


async def test_no_committed_partial_fails_when_the_budget_is_spent(
    sql_backend: Backend,
) -> None:
    await _crash_mid_stream(sql_backend, chunks=0, budget=1)
    fresh = FauxProvider(["never asked"])
    h = await sql_backend.open(provider=fresh)
    generation = await _the_streaming_generation(h)
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert fresh.requests == []
    (user,) = await c.context_entries()  # no fabricated answer
    result = await c.result(user.id)
    assert result is not None and result.status == "failed"
    assert result.reason is not None and "interrupted" in result.reason
    assert (await h.task(generation.id)).status == "failed"  # type: ignore[union-attr]
    await h.close()
