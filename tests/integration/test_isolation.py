"""§10.2 "Persistence paused after construction": while a batch's rows are written but not
committed, every reader still sees the old complete state. Forced with barriers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any

import pico
from pico.infrastructure.storage import EventSourcedStorage
from tests.backends import Backend


async def test_readers_never_see_half_a_commit(sql_backend: Backend) -> None:
    # Memory publishes a batch under one lock: there is no open transaction to observe.
    backend = sql_backend
    h = await backend.open()
    c = await h.root()
    first = await c.append("user", "before")
    storage = h._line.storage
    assert isinstance(storage, EventSourcedStorage)
    writer = storage.recorder._writer  # type: ignore[attr-defined]
    written, release = threading.Event(), threading.Event()
    real = writer.transaction

    def paused(work: Any, **kw: Any) -> None:
        def inner(cur: Any) -> None:
            work(cur)  # every row of the batch is written, not yet committed
            written.set()
            assert release.wait(10)

        real(inner, **kw)

    writer.transaction = paused
    reader = await backend.open(read_only=True)

    def build(tx: pico.Command) -> list[int]:
        ids = [tx.append_entry(c.id, "user", f"batch {i}") for i in range(3)]
        tx.append_context(c.id, ids)
        return ids

    loop = asyncio.get_running_loop()
    pending = loop.run_in_executor(None, h._line.run_sync, build)
    assert await loop.run_in_executor(None, written.wait, 10)
    # Check: the reader sees the old state in every table a query touches.
    page = await reader.entries(c.id, limit=100)
    assert [e.id for e in page.items] == [first]
    assert (await (await reader.root()).snapshot()).context == (first,)
    assert reader.head() == first + 1
    release.set()
    ids = await pending
    # Check: after the commit, the whole batch at once.
    page = await reader.entries(c.id, limit=100)
    assert [e.id for e in page.items] == [first, *ids]
    assert reader.head() == ids[-1] + 1
    await reader.close()
    await h.close()


async def test_an_async_build_keeps_its_snapshot_while_another_session_commits(
    tmp_path: Any,
) -> None:
    # Two sessions of one process on one SQLite file. A's builder reads, awaits while B
    # commits (same thread, same database), then reads again and writes: the reads of a
    # build share one snapshot, and B's commits neither fail nor leak into it.
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = await pico.Harness.open(url, session="a")
    b = await pico.Harness.open(url, session="b")
    ca, cb = await a.root(), await b.root()
    before = await ca.append("user", "a1")
    paused, resume = asyncio.Event(), asyncio.Event()

    async def build(tx: pico.Command) -> tuple[list[int], int]:
        seen = [e.id for e in tx.scan_entries(ca.id).items]
        paused.set()
        await resume.wait()
        assert [e.id for e in tx.scan_entries(ca.id).items] == seen  # one snapshot
        entry = tx.append_entry(ca.id, "user", "a2")
        tx.append_context(ca.id, [entry])
        return seen, entry

    result: Awaitable[tuple[list[int], int]] = a.command(build)
    pending = asyncio.ensure_future(result)
    await paused.wait()
    b_ids = [await cb.append("user", f"b{i}") for i in range(3)]
    queued = asyncio.ensure_future(ca.append("user", "queued behind the build"))
    await asyncio.sleep(0.01)
    assert not queued.done()  # A's line is busy with the paused build
    resume.set()
    seen, entry = await pending
    await queued
    assert seen == [before] and entry > before
    assert [e.content for e in (await ca.entries()).items] == [
        "a1",
        "a2",
        "queued behind the build",
    ]
    assert [e.id for e in (await cb.entries()).items] == b_ids
    await a.close()
    await b.close()
