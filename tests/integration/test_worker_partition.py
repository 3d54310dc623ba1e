"""A partitioned worker (issue 16): its lease renewals hang (the network to the lease's
connection is cut; its process is alive and its session mid-tool). It must stop executing
BEFORE the database lets anyone else take the session — its runner ends "lease lost" while
the lease row is still valid on the database's clock, and the running tool gets its
signal — and then a second worker takes the session over after the expiry and finishes
the turn. The old owner's handle, kept open past the takeover, has its write refused
(faulted; and with the fault set aside, fenced by the successor's claim) with nothing of
it stored (B goes on committing meanwhile, so the check is on what A tried to write).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.application.worker import Worker
from pico.domain.json import JsonObject
from pico.infrastructure.container import open_storage
from pico.infrastructure.sql.work import SqlWorkQueue
from tests.backends import require_postgres
from tests.integration.test_leases import BlockedLeases
from tests.workers_support import create_session, lease_rows, prefix, running, wait_for

LEASE = pico.Lease(ttl=3.0, renew_every=0.5)  # the owner's deadline: 2.25 s after a send
SCHEMA: JsonObject = {"type": "object", "properties": {}}
STALE = pico.session_value("stale-owner", int)


@pytest.fixture
def pg() -> Iterator[str]:
    yield require_postgres("a partitioned worker")


def _seconds_left(url: str, session: str) -> float | None:
    """Seconds until the session's lease expires, on the database's clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM expires_at - now())::float8 FROM pico_leases "
            "WHERE session_id = %s",
            (session,),
        ).fetchone()
    return None if row is None else float(row[0])


async def test_a_partitioned_worker_stops_before_its_lease_expires_and_another_finishes(
    pg: str,
) -> None:
    start = prefix("wk-part")
    session = start + "a"
    await create_session(pg, session)
    started, signalled = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    async def slow(args: JsonObject, ctx: ToolContext) -> str:
        runs.append("run")
        started.set()
        if len(runs) > 1:
            return "done at once"  # the successor's run (replay="safe": it runs again)
        await ctx.signal.wait()  # a cooperative tool: it stops at its signal
        signalled.set()
        return "stopped"

    tools = [pico.Tool("slow", "Slow", SCHEMA, slow, replay="safe")]
    turn: list[FauxResponse | str] = [FauxResponse(tool_calls=[("slow", {})]), "finished"]

    # Worker A: its lease stores can be partitioned, and its handle's close waits until
    # the test has tried a write on it after the takeover.
    partitioned = False
    blocked: list[BlockedLeases] = []
    handles: list[pico.Harness] = []
    may_close = asyncio.Event()

    async def opener(url: str, *, session: str, **options: Any) -> pico.Harness:
        storage: Any = open_storage(url, session=session, durability=None, read_only=False)
        real = storage.leases

        def leases() -> BlockedLeases:
            blocked.append(BlockedLeases(real()))
            return blocked[-1]

        storage.leases = leases
        h = await pico.Harness.open(storage, **options)
        real_close = h.close

        async def close(**kwargs: Any) -> None:
            await may_close.wait()
            await real_close(**kwargs)

        h.close = close  # type: ignore[method-assign]
        handles.append(h)
        return h

    queue_a = SqlWorkQueue(pg, prefix=start)
    real_pick = queue_a.pick

    async def pick(owner: str, ttl: float, limit: int) -> list[str]:
        return [] if partitioned else await real_pick(owner, ttl, limit)

    queue_a.pick = pick  # type: ignore[method-assign]
    a = Worker(
        pg,
        queue_a,
        opener=opener,
        lease=LEASE,
        idle_after=0.5,
        poll_every=0.25,
        options={"provider": FauxProvider(list(turn)), "tools": tools},
    )
    async with pico.Inbox(pg) as inbox:
        sent = await inbox.accept(session, "do the slow thing")
        async with running(a):
            await asyncio.wait_for(started.wait(), 15)
            ((_, owner_a, _),) = lease_rows(pg, start)
            assert owner_a == a.owner
            # The partition: every renewal from now on hangs (and never returns).
            partitioned = True
            for store in blocked:
                store.blocked = True
            cut = time.monotonic()
            await asyncio.wait_for(handles[0].lease.lost_event.wait(), LEASE.ttl + 2)  # type: ignore[union-attr]
            # Check: A stopped while the database still shows its lease valid...
            left = _seconds_left(pg, session)
            assert left is not None and left > 0.2, left
            assert time.monotonic() - cut < LEASE.ttl
            # ...and the running tool got its signal.
            await asyncio.wait_for(signalled.wait(), 5)
            runner = a.runners[session]  # still closing: its close waits for the test
            await wait_for("A's runner ended", lambda: runner.ended is not None, within=5.0)
            assert runner.ended == "lease lost"
            # Worker B takes the session over after the expiry and finishes the turn.
            b = pico.open_worker(
                pg,
                prefix=start,
                lease=LEASE,
                idle_after=0.5,
                poll_every=0.25,
                # A's model call already answered with the tool call (it is stored): B's
                # model is asked once, after the recovered tool's result.
                provider=FauxProvider(["finished"]),
                tools=tools,
            )
            async with running(b):
                # B picks the session once A's lease expired (PICK_DEAD) and recovers the
                # tool: replay="safe", so it runs again.
                await wait_for("B's run of the tool", lambda: len(runs) >= 2, within=LEASE.ttl + 10)
                assert {o for _, o, _ in lease_rows(pg, start)} <= {b.owner}
                # The old owner's handle, still open: its write is refused, nothing stored.
                old = handles[0]
                with pytest.raises(pico.HandleFaultedError, match="lease lost"):
                    await (await old.root()).append("user", "from the old owner")
                old._line.faulted = None  # set the local fault aside: the claim still fences
                old._line.admission = None
                with pytest.raises(pico.StaleWriterError):
                    await old.set_value(STALE, 1)  # reaches storage: the claim refuses it
                may_close.set()
                reply = await inbox.reply(sent, timeout=10)
                await wait_for("B finished the turn", lambda: b.finished, within=15.0)
            may_close.set()
    assert isinstance(reply, int)
    assert b.finished == [(session, "idle")]
    assert a.finished == [(session, "lease lost")]
    reader = await pico.Harness.open(pg, session=session, read_only=True)
    try:
        entries = (await (await reader.root()).entries()).items
        contents = [e.content for e in entries]
        assert await reader.get_value(STALE) is None
        # One tool call, run twice (A's stopped run left no result; B's recovery ran it
        # again), one result: B's; nothing of the old owner's write.
        assert runs == ["run", "run"]
        assert [e.kind for e in entries] == ["user", "assistant", "tool", "assistant"]
        assert contents[0] == "do the slow thing" and contents[-1] == {"text": "finished"}
        assert contents[2] == {"content": "done at once", "is_error": False}
        result = await (await reader.root()).result(reply)
        assert result is not None and result.status == "done"
    finally:
        await reader.close()
