"""A claim on PostgreSQL locks its own session only (issue 16: commands of different
sessions never wait for each other beyond row-level contention).

The session's write lock is a transaction-level advisory lock on its key, taken first by
the claim and by every write transaction of its owner (infrastructure/sql/store.py
``_LOCK_SESSION``). A claim in progress on one session — here held open from a raw
connection, as a claim stuck between its lock and its commit would be — must not delay
another session's commands, and must hold off an open of its own session until it ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import psycopg

import pico
from tests.backends import require_postgres

LOCK = "SELECT pg_advisory_xact_lock(7305730, hashtext(%s))"


async def test_a_claim_in_progress_on_one_session_never_delays_another_sessions_commands() -> None:
    url = require_postgres("the per-session claim lock")
    a_id, b_id = f"lock-a-{uuid.uuid4().hex[:8]}", f"lock-b-{uuid.uuid4().hex[:8]}"
    b = await pico.Harness.open(url, session=b_id)
    await b.close()
    a = await pico.Harness.open(url, session=a_id)
    c = await a.root()
    with psycopg.connect(url) as held:  # a claim of B between its lock and its commit
        held.execute(LOCK, (b_id,))
        # Check: A's commands commit while B's lock is held (a table lock would block them).
        for i in range(5):
            await asyncio.wait_for(c.append("user", f"while B is locked {i}"), timeout=5)
        # Check: an open of B waits for the lock (it would claim on top of the holder).
        opening = asyncio.ensure_future(asyncio.to_thread(_open_sync, url, b_id))
        await asyncio.sleep(0.5)
        assert not opening.done()
        held.rollback()  # the stuck claim ends: B's open gets in
        assert await asyncio.wait_for(opening, timeout=10) == b_id
    assert [e.content for e in (await c.entries()).items][-1] == "while B is locked 4"
    await a.close()


def _open_sync(url: str, session: str) -> str:
    async def go() -> str:
        h = await pico.Harness.open(url, session=session)
        await h.close()
        return h.session_id

    return asyncio.run(go())


async def test_an_owner_writing_waits_for_a_claim_of_its_own_session() -> None:
    url = require_postgres("the per-session claim lock")
    session = f"lock-s-{uuid.uuid4().hex[:8]}"
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    await c.append("user", "before")
    locked, hold = threading.Event(), 1.0

    def claim_in_progress() -> None:  # the session's lock, as a claim holds it, for 1 s
        with psycopg.connect(url) as held:
            held.execute(LOCK, (session,))
            locked.set()
            time.sleep(hold)
            held.rollback()

    holder = threading.Thread(target=claim_in_progress)
    holder.start()
    assert locked.wait(10)
    start = time.monotonic()
    # Check: the owner's write waits for the lock instead of racing the claim (a write
    # runs on the caller's thread, so it waits synchronously), then commits.
    assert isinstance(await c.append("user", "during"), int)
    assert time.monotonic() - start >= hold * 0.8
    holder.join()
    assert [e.content for e in (await c.entries()).items] == ["before", "during"]
    await h.close()


async def test_a_rebuild_holds_off_its_own_sessions_owner_and_no_other_session() -> None:
    url = require_postgres("the per-session claim lock")
    a_id, b_id = f"lock-r-{uuid.uuid4().hex[:8]}", f"lock-o-{uuid.uuid4().hex[:8]}"
    a = await pico.Harness.open(url, session=a_id)
    await (await a.root()).append("user", "to rebuild")
    await a.close()
    b = await pico.Harness.open(url, session=b_id)
    c = await b.root()
    with psycopg.connect(url) as held:  # A's owner mid-transaction holds A's lock
        held.execute(LOCK, (a_id,))
        rebuilding = asyncio.ensure_future(pico.rebuild(url, session=a_id))
        await asyncio.sleep(0.5)
        # Check: the rebuild waits for A's lock; B's owner commits meanwhile.
        assert not rebuilding.done()
        await asyncio.wait_for(c.append("user", "B goes on"), timeout=5)
        held.rollback()
        report = await asyncio.wait_for(rebuilding, timeout=30)
    assert report.session == a_id
    assert (await pico.replay(url, session=a_id)).equal
    await b.close()
