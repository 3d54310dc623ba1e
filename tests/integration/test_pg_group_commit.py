"""Group commit on PostgreSQL (issue 16): deferred commands share one open transaction.

A command run with ``defer=True`` sends its statements (BEGIN with the first of them) and
no COMMIT; the next command joins the transaction, and a durable one (or ``flush``) ends it
with its COMMIT behind the same Sync. The session's own reads run inside the open batch and
see it; other connections, and LISTEN-ers, see it only at COMMIT. A lost batch faults the
handle; a crash loses only the open batch; another session's commands never wait for it.
Counted from libpq's protocol trace on the writer's connection (test_pg_round_trips).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pico
from pico.application import line as line_module
from pico.infrastructure.sql.notify import channel_for
from tests.backends import require_postgres
from tests.integration.test_pg_round_trips import _completed, _traced, _writer_conn
from tests.processes import ROOT, spawn_child


@pytest.fixture
def url() -> str:
    return require_postgres("the group-commit tests")


@pytest.fixture
def session() -> str:
    return f"gc-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def no_flush_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the explicit flush points commit (the window would otherwise race the test)."""
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 3600.0)


def _append(conversation_id: int, text: str) -> Any:
    def build(tx: pico.Command) -> int:
        return tx.append_entry(conversation_id, "user", text)

    return build


async def _committed(url: str, session: str) -> list[int]:
    """The entries another connection (a read-only handle) sees as committed."""
    other = await pico.Harness.open(url, session=session, read_only=True)
    try:
        return [e.id for e in (await (await other.root()).entries()).items]
    finally:
        await other.close()


def _psql(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's next line, or a failure after ``timeout`` seconds (never a hang)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"the child said nothing for {timeout} s")
    return proc.stdout.readline().strip()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _commands(url: str, session: str) -> int:
    """How many commands of the session are committed (one pico_commits row each)."""
    with _psql(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pico_commits WHERE session_id = %s", (session,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _last_sync(messages: list[tuple[str, str, str]]) -> list[str]:
    """The statements completed in the last round trip (after the ReadyForQuery before it)."""
    ends = [i for i, (w, k, _) in enumerate(messages) if w == "B" and k == "ReadyForQuery"]
    start = ends[-2] + 1 if len(ends) > 1 else 0
    return _completed(messages[start:])


async def test_deferred_commands_share_one_commit_sent_with_the_durable_command(
    url: str, session: str, no_flush_window: None
) -> None:
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    warm = [await c.append("user", f"warm {i}") for i in range(8)]  # psycopg prepares
    conn = _writer_conn(h)
    with _traced(conn) as messages:
        deferred = [await h._line.run(_append(c.id, f"deferred {i}"), defer=True) for i in range(3)]
    done = _completed(messages)
    # Check: one BEGIN for the batch, no COMMIT; the batch stays open on the server.
    assert done.count("BEGIN") == 1 and done[0] == "BEGIN", done
    assert "COMMIT" not in done, done
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert h._line.pending
    assert await _committed(url, session) == warm
    with _traced(conn) as messages:
        durable = await c.append("user", "durable")
    done = _completed(messages)
    # Check: the durable command joins the batch (no BEGIN of its own) and its COMMIT is
    # the batch's only one, behind the same Sync as its own writes.
    assert "BEGIN" not in done and done.count("COMMIT") == 1, done
    last = _last_sync(messages)
    assert last[-1] == "COMMIT" and any(d.startswith("INSERT") for d in last), last
    assert not h._line.pending
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert await _committed(url, session) == [*warm, *deferred, durable]
    await h.close()


async def test_an_agent_turn_commits_fewer_times_than_it_runs_commands(
    url: str, session: str, no_flush_window: None
) -> None:
    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    script: list[Any] = []
    for i in range(3):
        script.append(pico.FauxResponse(text="look", tool_calls=[("read", {"path": f"f{i}"})] * 2))
        script.append(f"answer {i}")
    tool = pico.Tool("read", "Read", {"type": "object"}, read)
    h = await pico.Harness.open(
        url, session=session, provider=pico.FauxProvider(script), tools=[tool]
    )
    c = await h.root()
    await c.prompt("warm up")
    conn = _writer_conn(h)
    before = _commands(url, session)
    with _traced(conn) as messages:
        input_id, result = await c.prompt("Do the files agree?")
    assert result is not None and result.status == "done"
    commits = _completed(messages).count("COMMIT")
    commands = _commands(url, session) - before
    # Check: at least one COMMIT before each effect (two provider calls, two tool runs),
    # and fewer than the turn's commands (each was its own COMMIT before group commit).
    assert 4 <= commits < commands, (commits, commands)
    # Check: each intent's COMMIT goes out with its command, in its one round trip; only
    # the drive's final flush is a COMMIT alone (with the batch's idle-limit reset).
    # (SQLite shares one commit between the two tools' intents, ``CommandLine.groups``;
    # here that would cost round trips.)
    assert not h._line.groups
    trips: list[list[str]] = [[]]
    for who, kind, detail in messages:
        if who == "B" and kind == "CommandComplete":
            trips[-1].append(detail.strip().strip('"'))
        elif who == "B" and kind == "ReadyForQuery":
            trips.append([])
    alone = [trip for trip in trips if "COMMIT" in trip and set(trip) <= {"SET", "COMMIT"}]
    assert len(alone) <= 1, trips
    # Check: what prompt returned is durable for every other reader.
    other = await pico.Harness.open(url, session=session, read_only=True)
    assert await (await other.root()).result(input_id) == result
    await other.close()
    await h.close()


async def test_the_sessions_reads_see_its_open_batch_and_a_listener_hears_only_the_commit(
    url: str, session: str, no_flush_window: None
) -> None:
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    kept = await c.append("user", "durable")
    with _psql(url) as listener:
        listener.execute(f"LISTEN {channel_for(session)}")
        deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
        # Check: the owning session reads its own open batch (on the writer's connection,
        # inside the transaction) ...
        assert [e.id for e in (await c.entries()).items] == [kept, deferred]
        # ... another connection does not, and no notification was delivered for it.
        assert await _committed(url, session) == [kept]
        assert list(listener.notifies(timeout=0.2)) == []
        h._line.flush()
        assert not h._line.pending
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in heard] == [channel_for(session)]
    assert await _committed(url, session) == [kept, deferred]
    await h.close()


def _terminate(url: str, pid: int) -> None:
    with _psql(url) as conn:
        row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row is not None and row[0] is True


@pytest.mark.parametrize("ended_by", ["flush", "durable command"])
async def test_a_lost_batch_rolls_back_whole_faults_the_handle_and_reopen_keeps_the_prefix(
    url: str, session: str, no_flush_window: None, ended_by: str
) -> None:
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    kept = await c.append("user", "durable")
    await h._line.run(_append(c.id, "deferred 1"), defer=True)
    await h._line.run(_append(c.id, "deferred 2"), defer=True)
    # The server ends the writer's backend between deferred commands (a restart, a DBA).
    _terminate(url, _writer_conn(h).info.backend_pid)
    with pytest.raises(pico.PersistenceUncertainError):
        if ended_by == "flush":
            h._line.flush()
        else:
            await c.append("user", "joins the lost batch")
    # Check: the handle is faulted and refuses every later write.
    assert h.faulted is not None and not h._line.pending
    with pytest.raises(pico.HandleFaultedError):
        await c.append("user", "refused")
    await h.close()
    # Check: nothing of the batch is stored; the reopened session continues from the prefix.
    assert await _committed(url, session) == [kept]
    h2 = await pico.Harness.open(url, session=session)
    c2 = await h2.root()
    after = await c2.append("user", "after the reopen")
    assert [e.id for e in (await c2.entries()).items] == [kept, after]
    assert (await h2.verify()).ok
    await h2.close()


async def test_a_failed_statement_inside_the_batch_loses_it_and_faults_the_handle(
    url: str, session: str, no_flush_window: None
) -> None:
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    kept = await c.append("user", "durable")
    await h._line.run(_append(c.id, "deferred"), defer=True)
    # A server-side failure of a statement on the writer's connection (here a read of the
    # session inside the batch) aborts the whole transaction: a COMMIT would only roll it
    # back, so the batch must be reported lost, not committed.
    store = h._line.storage._read_store  # type: ignore[attr-defined]
    with pytest.raises(pico.PicoError), store.read():
        store._rows("SELECT 1 / 0", ())
    with pytest.raises(pico.PersistenceUncertainError):
        h._line.flush()
    assert h.faulted is not None
    await h.close()
    assert await _committed(url, session) == [kept]


async def test_an_idle_open_batch_is_ended_by_the_server_and_faults_its_owner(
    url: str, session: str, no_flush_window: None
) -> None:
    # An owner that stops flushing (a stalled loop, a stopped process) must not hold its
    # locks for longer than the batch's idle limit: the server ends the transaction.
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    kept = await c.append("user", "durable")
    await h._line.run(_append(c.id, "deferred"), defer=True)
    pid = _writer_conn(h).info.backend_pid
    deadline = time.monotonic() + 30
    with _psql(url) as conn:
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the idle batch was never ended"
            time.sleep(0.1)
    with pytest.raises(pico.PersistenceUncertainError):
        h._line.flush()
    await h.close()
    assert await _committed(url, session) == [kept]


# A child that commits one durable append, then two deferred ones, says so, and waits:
# killed with its batch open.
CRASH_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import pico
    from pico.application import line

    line.FLUSH_WINDOW = 3600.0

    async def main(url, session):
        h = await pico.Harness.open(url, session=session)
        c = await h.root()
        kept = await c.append("user", "durable")

        def append(text):
            return lambda tx: tx.append_entry(c.id, "user", text)

        d1 = await h._line.run(append("deferred 1"), defer=True)
        d2 = await h._line.run(append("deferred 2"), defer=True)
        print(kept, d1, d2, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_killed_owner_loses_only_its_open_batch(
    url: str, session: str, children: list[subprocess.Popen[str]]
) -> None:
    proc = spawn_child(CRASH_CHILD, url, session)
    children.append(proc)
    kept, _, _ = (int(x) for x in _readline(proc, 60).split())
    assert await _committed(url, session) == [kept]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Check: the reopened session holds exactly the durable prefix, verifies, and
    # continues; the numbers of the lost commands are simply unused.
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    assert [e.id for e in (await c.entries()).items] == [kept]
    report = await h.verify()
    assert report.ok and report.tail == 0, report
    after = await c.append("user", "after the crash")
    assert after > kept
    assert [e.id for e in (await c.entries()).items] == [kept, after]
    await h.close()


# A second session in its own process: opened first (its claim takes the table lock),
# then, on "go", it commits appends and reports how long they took.
OTHER_CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    import pico

    async def main(url, session):
        h = await pico.Harness.open(url, session=session)
        c = await h.root()
        await c.append("user", "warm up")
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        ids = [await c.append("user", f"B {i}") for i in range(20)]
        print(len(ids), time.perf_counter() - start, flush=True)
        sys.stdin.readline()
        await h.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_another_sessions_commands_do_not_wait_for_an_open_batch(
    url: str, session: str, no_flush_window: None, children: list[subprocess.Popen[str]]
) -> None:
    other_session = f"{session}-b"
    # spawn_child's process, with a stdin to signal it through.
    proc = subprocess.Popen(
        [sys.executable, "-c", OTHER_CHILD, url, other_session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    children.append(proc)
    assert _readline(proc, 60) == "ready"  # the barrier: B's claim is behind it
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    deferred = await h._line.run(_append(c.id, "A, deferred"), defer=True)
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    # Check: B commits all its commands while A's batch stays open (A never flushes here:
    # a wait on A's locks would last until the 30 s read timeout fails the test).
    n, seconds = _readline(proc, 30).split()
    assert int(n) == 20 and float(seconds) < 20
    assert h._line.pending
    assert await _committed(url, session) == []
    assert len(await _committed(url, other_session)) == 21
    h._line.flush()
    assert await _committed(url, session) == [deferred]
    proc.stdin.write("done\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
    await h.close()


async def test_opening_another_session_in_the_process_commits_the_open_batch_first(
    url: str, session: str, no_flush_window: None
) -> None:
    # The open's claim takes LOCK TABLE pico_events, which waits for every open batch;
    # A's batch can only be committed by this thread, which is the one waiting.
    a = await pico.Harness.open(url, session=session)
    c = await a.root()
    deferred = await a._line.run(_append(c.id, "A, deferred"), defer=True)
    b = await pico.Harness.open(url, session=f"{session}-b")
    # Check: A's batch was committed, not ended by the server's idle limit: A goes on.
    assert await _committed(url, session) == [deferred]
    after = await c.append("user", "A, after B opened")
    assert a.faulted is None
    assert await _committed(url, session) == [deferred, after]
    await b.close()
    await a.close()


async def test_a_flush_while_an_async_builder_awaits_inside_its_snapshot_loses_nothing(
    url: str, session: str, no_flush_window: None
) -> None:
    # A drive ending (or a result read) flushes the line while another command's async
    # builder is suspended inside its snapshot, whose reads run on the writer's connection
    # in the open batch: the flush commits the batch under it. That is not an aborted
    # batch: the builder goes on, commits, and nothing is lost or faulted.
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    assert h._line.pending
    inside, resume = asyncio.Event(), asyncio.Event()

    async def build(tx: pico.Command) -> int:
        tx.get_entries([deferred])  # a read on the writer's connection, in the batch
        inside.set()
        await resume.wait()
        assert tx.get_entries([deferred])  # and another after the flush
        entry = tx.append_entry(c.id, "user", "after the flush")
        tx.append_context(c.id, [entry])
        return entry

    building = asyncio.ensure_future(h.command(build))
    await inside.wait()
    h._line.flush()  # what a drive's end does
    assert await _committed(url, session) == [deferred]
    resume.set()
    after = await building
    # Check: the handle is healthy and both commands are durable, in order.
    assert h.faulted is None
    assert await _committed(url, session) == [deferred, after]
    await c.append("user", "and on")
    await h.close()


async def test_a_lost_lease_rolls_the_open_batch_back_at_once_and_frees_the_session(
    url: str, no_flush_window: None
) -> None:
    from tests.integration.test_leases import _open_blockable

    session = f"gc-lease-{uuid.uuid4().hex[:8]}"
    h, leases = await _open_blockable(url, session)
    c = await h.root()
    kept = await c.append("user", "durable")
    await h._line.run(_append(c.id, "deferred, then the lease is lost"), defer=True)
    assert h._line.pending
    leases.blocked = True  # a partition: renewals hang
    assert h.lease is not None
    await asyncio.wait_for(h.lease.lost_event.wait(), 10)
    # Check: the batch is gone now, not at the server's idle limit: the session's lock is
    # free for the next owner at once, and nothing of the batch was committed.
    with _psql(url) as conn:
        row = conn.execute(
            "SELECT pg_try_advisory_xact_lock(7305730, hashtext(%s))", (session,)
        ).fetchone()
        assert row is not None and row[0] is True
        conn.rollback()
    assert await _committed(url, session) == [kept]
    with pytest.raises(pico.HandleFaultedError, match="lease lost"):
        await c.append("user", "after")
    await h.close()
