"""An owner that closes mid-stream leaves its generation streaming; the next owner recovers
it (§8.3) on every backend: the committed frames become the interrupted answer."""

from __future__ import annotations

import asyncio

import pico
from pico import FauxProvider
from tests.backends import Backend


async def test_a_reopened_owner_publishes_the_committed_frames_of_a_closed_stream(
    backend: Backend,
) -> None:
    clock = pico.FakeClock()
    text = "x" * 1500  # frames of 512+ characters commit while it streams
    h = await backend.open(
        provider=FauxProvider([text], chunk_chars=100, cadence=1.0, clock=clock), clock=clock
    )
    c = await h.root()
    input_id = await c.accept("write a lot")
    drive = asyncio.ensure_future(c.drive())
    (generation,) = (await h.tasks(kind="generation", limit=1)).items
    frames = pico.working_list(
        "pico.frames", str, scope=pico.working_scope(f"task/{generation.id}")
    )
    committed = ""
    while len(committed) < 1024:  # two frames are durable; the stream is not finished
        clock.advance(1.0)
        await asyncio.sleep(0)
        committed = "".join(e.value for e in (await h.read_list(frames, limit=100)).items)
    await h.close()  # the owner goes away mid-stream: nothing is settled
    await asyncio.wait_for(drive, timeout=10)
    fresh = FauxProvider(["a fabricated answer"])
    h = await backend.open(provider=fresh)
    assert (await h.task(generation.id)).status == "streaming"  # type: ignore[union-attr]
    c = await h.root()
    assert await asyncio.wait_for(c.drive(), timeout=10) == "idle"
    assert fresh.requests == []
    result = await c.result(input_id)
    assert result is not None and result.status == "interrupted"
    answer = await h.entry(result.entry_id)  # type: ignore[arg-type]
    assert answer is not None and answer.content == {"text": committed}
    assert answer.metadata is not None and answer.metadata["interrupted"] is True
    assert text.startswith(committed) and committed != text  # never the unstreamed rest
    await h.close()
