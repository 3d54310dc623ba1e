"""§10.2 "Persistence paused after construction": while a batch's rows are written but not
committed, every reader still sees the old complete state. Forced with barriers."""

from __future__ import annotations

import asyncio
import threading
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

    def paused(work: Any) -> None:
        def inner(cur: Any) -> None:
            work(cur)  # every row of the batch is written, not yet committed
            written.set()
            assert release.wait(10)

        real(inner)

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
