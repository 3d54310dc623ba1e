"""Watch edge cases found in review: a read-only watcher and an owner's reopen (a claim
with no commit boundary), a batch larger than one read page, a closed handle ending its
streams, and async listeners keeping delivery order."""

from __future__ import annotations

import asyncio

import pico
from pico import WatchEvent, WatchSignal
from tests.backends import Backend
from tests.contract.test_watch import Seen


def _entries(event: WatchEvent) -> list[int]:
    """Entries one delivered event appended."""
    recorder = Seen()
    recorder(event)
    return recorder.entry_ids()


async def test_a_read_only_watcher_passes_an_owner_reopen_and_keeps_yielding(
    stored_backend: Backend,
) -> None:
    h = await stored_backend.open()
    c = await h.root()
    reader = await stored_backend.open(read_only=True)
    reader.watches.poll_interval = 0.01
    seen = Seen()
    reader.watch(c.id, seen)
    await h.close()
    h = await stored_backend.open()  # the reopen stores a claim and no commit boundary
    ticks = 0
    for _ in range(20):  # the event loop keeps running while the reader polls
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 20
    # Check: the cursor moved past the claim, so a poll has nothing to re-read.
    assert reader.watches.position == reader._line.storage.last_position()
    x = await (await h.root()).append("user", "after the reopen")
    for _ in range(200):
        if seen.entry_ids():
            break
        await asyncio.sleep(0.01)
    assert seen.entry_ids() == [x]
    await reader.close()
    await h.close()


async def test_a_batch_larger_than_a_read_page_reaches_a_read_only_watcher_whole(
    stored_backend: Backend,
) -> None:
    h = await stored_backend.open()
    c = await h.root()
    reader = await stored_backend.open(read_only=True)
    reader.watches.poll_interval = 3600.0  # the test runs the catch-up itself
    seen = Seen()
    reader.watch(c.id, seen)

    def many(tx: pico.Command) -> list[int]:
        return [tx.append_entry(c.id, "user", f"e{i}") for i in range(700)]

    ids = await h.command(many)  # 700 events, more than one page of 500
    reader.watches.durable()
    assert len(seen.commits()) == 1 and seen.entry_ids() == ids  # one batch, whole, in order
    await reader.close()
    await h.close()


async def test_closing_the_harness_ends_its_watch_streams(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    stream = h.watch(c.id)
    got: list[WatchEvent] = []

    async def consume() -> None:
        async for event in stream:
            got.append(event)

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0)
    await h.close()
    await asyncio.wait_for(task, 5)  # the iteration ended
    last = got[-1]
    assert isinstance(last, WatchSignal) and last.kind == "closed"


async def test_an_async_listener_handles_batches_strictly_in_order(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    order: list[int] = []
    gate = asyncio.Event()

    async def listener(event: WatchEvent) -> None:
        ids = _entries(event)
        if ids and not order:
            await gate.wait()  # the first batch's handling is slow
        order.extend(ids)

    h.watch(c.id, listener)
    a = await c.append("user", "a")
    b = await c.append("user", "b")
    await asyncio.sleep(0.01)
    assert order == []  # b waits behind a, it does not overtake it
    gate.set()
    for _ in range(100):
        if len(order) == 2:
            break
        await asyncio.sleep(0.01)
    assert order == [a, b]
    await h.close()
