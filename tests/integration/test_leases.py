"""Session leases on PostgreSQL (issue 16; seed 003 §1.2, seed 000 "Claiming a run").

``Harness.open(url, lease=Lease(...))`` acquires a lease row before its claim, renews it
on the database's clock and releases it on close; an open while another worker holds it
is refused with nothing written; a holder whose renewals stop (a partition: its renewal
blocked on a barrier, its process alive) faults BEFORE the database's expiry, and a
second worker then takes the session over, its writes landing while the old handle's
are refused; a holder killed with SIGKILL is taken over within ttl plus a small bound.
"""

from __future__ import annotations

import asyncio
import math
import signal
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pico
from pico.infrastructure.container import open_storage
from tests.backends import require_postgres
from tests.processes import spawn_child

COUNTER = pico.session_value("lease", int)
#: A short lease so the tests run in seconds: the owner's deadline is 1.5 s after a send.
SHORT = pico.Lease(ttl=2.0, renew_every=0.25)
#: What a takeover may take beyond the ttl (retry, open, claim on a shared 2-core box).
BOUND = 1.5


@pytest.fixture
def pg() -> Iterator[str]:
    yield require_postgres("session leases")


def _session() -> str:
    return f"lease-{uuid.uuid4().hex[:12]}"


def _row(url: str, session: str) -> tuple[Any, ...] | None:
    """The lease row with the database's own verdict: (owner, expires_at, now() <
    expires_at, seconds left)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT owner, expires_at, now() < expires_at, "
            "extract(epoch FROM expires_at - now())::float8 "
            "FROM pico_leases WHERE session_id = %s",
            (session,),
        ).fetchone()


def _events(url: str, session: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pico_events WHERE session_number = "
            "(SELECT id FROM pico_session_numbers WHERE session_id = %s)",
            (session,),
        ).fetchone()
        assert row is not None
        return int(row[0])


async def _take_over(url: str, session: str, lease: pico.Lease, *, within: float) -> pico.Harness:
    """Open with ``lease`` as a second worker would: retry after each refusal's
    ``retry_after`` (the database's clock) until it gets in, within ``within`` seconds."""
    start = time.monotonic()
    while True:
        try:
            return await pico.Harness.open(url, session=session, lease=lease)
        except pico.SessionLeasedError as refused:
            if time.monotonic() - start > within:
                raise
            await asyncio.sleep(min(max(refused.retry_after, 0.0) + 0.02, 0.5))


class BlockedLeases:
    """The real lease store, whose renewals can be made to hang (a partition between the
    worker and the database: the statement is never answered)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.blocked = False
        self.entered = asyncio.Event()  # a renewal is hanging
        self.gate = asyncio.Event()  # never set: the partition does not heal

    async def acquire(self, session_id: str, owner: str, ttl: float) -> Any:
        return await self.inner.acquire(session_id, owner, ttl)

    async def renew(self, session_id: str, owner: str, ttl: float) -> Any:
        if self.blocked:
            self.entered.set()
            await self.gate.wait()
        return await self.inner.renew(session_id, owner, ttl)

    async def release(self, session_id: str, owner: str, due: float | None = None) -> None:
        await self.inner.release(session_id, owner, due)

    def close(self) -> None:
        self.inner.close()


async def _open_blockable(url: str, session: str) -> tuple[pico.Harness, BlockedLeases]:
    storage: Any = open_storage(url, session=session, durability=None, read_only=False)
    made: list[BlockedLeases] = []
    real = storage.leases

    def leases() -> BlockedLeases:
        made.append(BlockedLeases(real()))
        return made[-1]

    storage.leases = leases
    h = await pico.Harness.open(storage, lease=SHORT)
    return h, made[0]


async def _renewed(h: pico.Harness, times: int) -> None:
    assert h.lease is not None
    deadline = time.monotonic() + 5.0
    while h.lease.renewals < times:
        assert time.monotonic() < deadline, "the heartbeat did not renew"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("ttl", "renew_every", "says"),
    [
        (0, 0.1, "ttl must be a finite number"),
        (-1.0, 0.1, "ttl must be a finite number"),
        (math.inf, 1.0, "ttl must be a finite number"),
        (math.nan, 1.0, "ttl must be a finite number"),
        (True, 0.1, "ttl must be a finite number"),
        ("10", 1.0, "ttl must be a finite number"),
        (10.0, 0, "renew_every must be a finite number"),
        (10.0, math.nan, "renew_every must be a finite number"),
        (10.0, 5.0, "below half the ttl"),
        (10.0, 7.5, "below half the ttl"),
    ],
)
def test_a_lease_with_bad_timings_is_refused(ttl: Any, renew_every: Any, says: str) -> None:
    with pytest.raises(pico.InvalidArgumentError, match=says):
        pico.Lease(ttl=ttl, renew_every=renew_every)


def test_a_lease_stops_its_margin_before_the_expiry() -> None:
    assert pico.Lease().margin == 1.0 and pico.Lease(ttl=2.0, renew_every=0.5).margin == 0.5


async def test_lease_is_refused_off_postgresql_and_for_read_only_before_anything_opens(
    tmp_path: Path,
) -> None:
    path = tmp_path / "no.db"
    for url in (f"sqlite:///{path}", "memory://", f"jsonl:///{tmp_path / 'j'}"):
        with pytest.raises(pico.ConfigurationError, match="leases need PostgreSQL"):
            await pico.Harness.open(url, lease=pico.Lease())
    assert not path.exists() and not (tmp_path / "j").exists()  # nothing was created
    # A ready Storage without leases (memory) is refused the same way, and closed.
    storage = open_storage("memory://", session="s", durability=None, read_only=False)
    with pytest.raises(pico.ConfigurationError, match="leases need PostgreSQL"):
        await pico.Harness.open(storage, lease=pico.Lease())
    with pytest.raises(pico.InvalidArgumentError, match="read-only open takes no lease"):
        await pico.Harness.open("memory://", read_only=True, lease=pico.Lease())
    with pytest.raises(pico.InvalidArgumentError, match=r"pico\.Lease"):
        await pico.Harness.open("memory://", lease=10.0)  # type: ignore[arg-type]
    # Without lease= nothing changes.
    h = await pico.Harness.open(f"sqlite:///{path}")
    assert h.lease is None
    await h.close()


# ---------------------------------------------------------------------------- PostgreSQL
async def test_a_lease_is_acquired_renewed_on_the_database_clock_and_released_on_close(
    pg: str,
) -> None:
    session = _session()
    h = await pico.Harness.open(pg, session=session, lease=SHORT)
    assert h.lease is not None
    row = _row(pg, session)
    assert row is not None and row[0] == h.lease.owner and row[2] is True
    first = row[1]
    await _renewed(h, 2)
    row = _row(pg, session)
    assert row is not None and row[1] > first and row[0] == h.lease.owner
    await h.set_value(COUNTER, 1)
    await h.close()
    # Check: released (the row is gone), so the next worker gets in at once.
    assert _row(pg, session) is None
    again = await pico.Harness.open(pg, session=session, lease=SHORT)
    assert await again.get_value(COUNTER) == 1
    await again.close()


async def test_a_second_open_while_the_lease_is_held_is_refused_and_writes_nothing(
    pg: str,
) -> None:
    session = _session()
    h = await pico.Harness.open(pg, session=session, lease=SHORT)
    assert h.lease is not None
    await h.set_value(COUNTER, 1)
    before = _events(pg, session)
    with pytest.raises(pico.SessionLeasedError) as refused:
        await pico.Harness.open(pg, session=session, lease=SHORT)
    err = refused.value
    assert isinstance(err, pico.StaleWriterError)
    assert err.holder == h.lease.owner and 0 < err.retry_after <= SHORT.ttl
    assert h.lease.owner in str(err) and "nothing was written" in str(err)
    # Check: no claim landed, so the holder is not fenced and keeps writing.
    assert _events(pg, session) == before
    await h.set_value(COUNTER, 2)
    assert await h.get_value(COUNTER) == 2
    await h.close()


async def test_a_partitioned_holder_faults_before_the_expiry_and_a_second_worker_takes_over(
    pg: str,
) -> None:
    session = _session()
    old, leases = await _open_blockable(pg, session)
    assert old.lease is not None
    await old.set_value(COUNTER, 1)
    await _renewed(old, 1)
    # The partition: the next renewal is sent and never answered.
    leases.blocked = True
    await asyncio.wait_for(leases.entered.wait(), 2.0)
    await asyncio.wait_for(old.lease.lost_event.wait(), SHORT.ttl + 1.0)
    # Check (the database's clock): the holder faulted while its lease was still valid.
    row = _row(pg, session)
    assert row is not None and row[0] == old.lease.owner
    assert row[2] is True and row[3] > 0, f"faulted {-row[3]:.3f}s after the database expiry"
    assert old.faulted is not None and "lease lost" in old.faulted
    with pytest.raises(pico.HandleFaultedError):
        await old.set_value(COUNTER, 99)
    # A second worker gets in only after the database's expiry, within ttl + a bound.
    new = await _take_over(pg, session, SHORT, within=SHORT.ttl + BOUND)
    assert new.lease is not None and _row(pg, session) is not None
    await new.set_value(COUNTER, 2)
    stored = _events(pg, session)
    # Defence in depth: even a stale handle whose local fault came too late is fenced by
    # the new owner's claim: its write raises StaleWriterError and stores nothing.
    old._line.faulted = None
    old._line.admission = None
    with pytest.raises(pico.StaleWriterError):
        await old.set_value(COUNTER, 99)
    assert _events(pg, session) == stored
    # The old handle's close releases nothing of the new owner's lease.
    await old.close()
    row = _row(pg, session)
    assert row is not None and row[0] == new.lease.owner
    assert await new.get_value(COUNTER) == 2
    await new.close()


async def test_a_write_after_the_local_deadline_is_refused_even_before_the_timer_runs(
    pg: str,
) -> None:
    session = _session()
    h, leases = await _open_blockable(pg, session)
    assert h.lease is not None
    leases.blocked = True
    await asyncio.wait_for(leases.entered.wait(), 2.0)
    before = _events(pg, session)
    # The event loop is blocked past the deadline: the timer cannot have run.
    time.sleep(max(0.0, h.lease.deadline - asyncio.get_running_loop().time()) + 0.05)
    assert h.lease.lost is None
    with pytest.raises(pico.HandleFaultedError, match="lease lost"):
        await h.set_value(COUNTER, 1)
    assert _events(pg, session) == before
    await h.close()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import pico

    async def main(url, session):
        h = await pico.Harness.open(
            url, session=session, lease=pico.Lease(ttl=2.0, renew_every=0.25)
        )
        await h.set_value(pico.session_value("lease", int), 1)
        print("ready", h.lease.owner, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_worker_killed_holding_a_lease_is_taken_over_within_the_ttl_and_a_bound(
    pg: str,
) -> None:
    session = _session()
    child = spawn_child(HOLDER, pg, session)
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        word, owner = line.split()
        assert word == "ready"
        with pytest.raises(pico.SessionLeasedError) as refused:
            await pico.Harness.open(pg, session=session, lease=SHORT)
        assert refused.value.holder == owner
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        child.wait(5)
        new = await _take_over(pg, session, SHORT, within=SHORT.ttl + BOUND)
        took = time.monotonic() - killed
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    # Check: within ttl + the bound of the death; the dead owner's write is there.
    assert took <= SHORT.ttl + BOUND, took
    assert await new.get_value(COUNTER) == 1
    await new.set_value(COUNTER, 2)
    await new.close()
