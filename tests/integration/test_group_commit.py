"""Group commit on SQLite: deferred settlements, their flush points, and their failures.

A command run with ``defer=True`` is saved and published at once but its transaction stays
open until the next durable command, a drive's return, ``flush`` or the flush window. Other
connections must not see it before; the owning session must; nothing returned to a caller
may be undurable; a failed flush faults the handle; and a crash keeps a prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.application import line as line_module
from pico.domain.json import JsonObject
from pico.infrastructure.container import open_storage
from tests.backends import Backend, make_backend
from tests.integration.test_crash_and_faults import FaultyStorage

ROOT = Path(__file__).resolve().parents[2]

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@pytest.fixture
def sqlite(tmp_path: Path) -> Backend:
    """Group commit is SQLite's: PostgreSQL and the memory store commit every command."""
    return make_backend("sqlite", tmp_path)


@pytest.fixture
def no_flush_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the explicit flush points commit (the window would otherwise race the test)."""
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 3600.0)


@contextlib.contextmanager
def _writer_statements(h: pico.Harness) -> Iterator[list[str]]:
    """The SQL statements the session's writer connection runs in the block."""
    conn = h._line.storage.recorder.writer.connection()  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        conn.set_trace_callback(None)


async def _entry_ids(url: str, session: str) -> list[int]:
    """What another connection (a read-only handle) sees as committed."""
    other = await pico.Harness.open(url, session=session, read_only=True)
    try:
        return [e.id for e in (await (await other.root()).entries()).items]
    finally:
        await other.close()


def _append(conversation_id: int, text: str) -> Any:
    def build(tx: pico.Command) -> int:
        return tx.append_entry(conversation_id, "user", text)

    return build


async def test_a_deferred_command_is_the_sessions_at_once_and_others_after_the_flush(
    sqlite: Backend, no_flush_window: None
) -> None:
    h = await sqlite.open()
    c = await h.root()
    kept = await c.append("user", "durable")
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    # Check: the owning session reads its own deferred command ...
    assert [e.id for e in (await c.entries()).items] == [kept, deferred]
    # ... another connection does not, until a flush point.
    assert await _entry_ids(sqlite.url, sqlite.session) == [kept]
    assert h._line.pending
    h._line.flush()
    assert not h._line.pending
    assert await _entry_ids(sqlite.url, sqlite.session) == [kept, deferred]
    await h.close()


async def test_a_durable_command_commits_the_deferred_ones_before_it(
    sqlite: Backend, no_flush_window: None
) -> None:
    h = await sqlite.open()
    c = await h.root()
    first = await h._line.run(_append(c.id, "one"), defer=True)
    second = await h._line.run(_append(c.id, "two"), defer=True)
    assert await _entry_ids(sqlite.url, sqlite.session) == []
    third = await c.append("user", "three")  # a durable command
    assert not h._line.pending
    assert await _entry_ids(sqlite.url, sqlite.session) == [first, second, third]
    await h.close()


async def test_the_flush_window_commits_an_idle_batch(
    sqlite: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 0.005)
    h = await sqlite.open()
    c = await h.root()
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    assert h._line.pending
    await asyncio.sleep(0.2)  # the loop runs the window's timer
    assert not h._line.pending
    assert await _entry_ids(sqlite.url, sqlite.session) == [deferred]
    await h.close()


async def test_one_window_timer_serves_successive_batches_and_never_flushes_early(
    sqlite: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's timer stays armed across a commit: when it fires for commands a commit
    already made durable, the commands deferred since wait for their own deadline (their
    first save plus the window), and are committed then. The loop's clock is held by the
    test, and the test fires the timer: nothing depends on how fast the machine is."""
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 1.0)
    h = await sqlite.open()
    c = await h.root()
    line = h._line
    loop = asyncio.get_running_loop()
    clock = [1000.0]
    armed: list[float] = []  # when each window timer was armed for
    handles: list[asyncio.TimerHandle] = []
    real_call_at = loop.call_at

    def call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if callback != line._flush_due:
            return real_call_at(when, callback, *args, **kwargs)
        armed.append(when)
        handle = real_call_at(when + 3600, callback, *args, **kwargs)  # the test fires it
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "time", lambda: clock[0])
    monkeypatch.setattr(loop, "call_at", call_at)
    try:
        first = await line.run(_append(c.id, "first"), defer=True)
        assert armed == [1001.0]
        clock[0] = 1000.5
        durable = await c.append("user", "durable")  # commits the first with it
        assert not line.pending
        clock[0] = 1000.75
        second = await line.run(_append(c.id, "second"), defer=True)
        assert armed == [1001.0]  # the timer armed for the first serves the second
        clock[0] = 1001.0
        line._flush_due()  # due for the first, which is durable: the second is not due
        assert line.pending
        assert await _entry_ids(sqlite.url, sqlite.session) == [first, durable]
        assert armed == [1001.0, 1001.75]
        clock[0] = 1001.75
        line._flush_due()
        assert not line.pending
        assert await _entry_ids(sqlite.url, sqlite.session) == [first, durable, second]
        assert armed == [1001.0, 1001.75]  # nothing pending: no timer armed again
    finally:
        for handle in handles:
            handle.cancel()
        await h.close()


async def test_closing_commits_a_deferred_batch(sqlite: Backend, no_flush_window: None) -> None:
    h = await sqlite.open()
    c = await h.root()
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    await h.close()
    assert await _entry_ids(sqlite.url, sqlite.session) == [deferred]


async def test_another_session_on_the_same_file_commits_the_open_batch_first(
    sqlite: Backend, no_flush_window: None
) -> None:
    # Session A's open batch holds SQLite's write lock; B, on the same thread, must not
    # wait for it (it would wait the whole busy timeout: A cannot run meanwhile).
    a = await sqlite.open()
    b = await sqlite.open(session=f"{sqlite.session}-b")
    c = await a.root()
    deferred = await a._line.run(_append(c.id, "A, deferred"), defer=True)
    b_entry = await asyncio.wait_for((await b.root()).append("user", "B"), timeout=5)
    assert await _entry_ids(sqlite.url, sqlite.session) == [deferred]
    assert await _entry_ids(sqlite.url, f"{sqlite.session}-b") == [b_entry]
    await a.close()
    await b.close()


async def test_the_change_token_is_read_once_a_batch_and_moves_with_another_writer(
    sqlite: Backend, no_flush_window: None
) -> None:
    """The owner's mirrors check the writer's change token before each read. Inside an
    open batch (its BEGIN IMMEDIATE holds the file's write lock) no other connection can
    commit, so ``PRAGMA data_version`` is read once a batch; another writer must first
    commit the batch (``flush_pending``), and after its commit the token moves."""
    a = await sqlite.open()
    b = await sqlite.open(session=f"{sqlite.session}-b")
    c = await a.root()
    writer = a._line.storage.recorder.writer  # type: ignore[attr-defined]
    await a._line.run(_append(c.id, "A, deferred"), defer=True)
    assert writer.pending
    with _writer_statements(a) as statements:
        before = [writer.change_token() for _ in range(3)]
    assert before[0] == before[1] == before[2]
    assert statements.count("PRAGMA data_version") == 1
    await (await b.root()).append("user", "B")  # commits A's batch first, then its own
    assert not writer.pending
    with _writer_statements(a) as statements:
        after = writer.change_token()
    assert statements.count("PRAGMA data_version") == 1
    assert after != before[0]  # B's commit moved it: the mirrors read the store again
    await a._line.run(_append(c.id, "A, next batch"), defer=True)
    with _writer_statements(a) as statements:
        assert writer.change_token() == after  # a new batch reads it again, once
    assert statements.count("PRAGMA data_version") == 1
    await a.close()
    await b.close()


async def test_a_reload_sees_the_deferred_events_of_an_evicted_aggregate(
    sqlite: Backend, no_flush_window: None
) -> None:
    # Stream loads use their own connection: they must not miss a deferred batch, or the
    # next save of the reloaded aggregate collides with its own unflushed version.
    h = await sqlite.open()
    c = await h.root()
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    h._line._cache.clear()  # the conversation aggregate must be reloaded from storage
    after = await c.append("user", "after the reload")
    assert h.faulted is None
    assert await _entry_ids(sqlite.url, sqlite.session) == [deferred, after]
    await h.close()


async def test_a_failed_flush_faults_the_handle_and_reopen_keeps_the_durable_prefix(
    sqlite: Backend, no_flush_window: None
) -> None:
    storage = FaultyStorage(
        open_storage(sqlite.url, session=sqlite.session, durability=None, read_only=False)
    )
    h = await pico.Harness.open(storage)
    c = await h.root()
    kept = await c.append("user", "durable")
    await h._line.run(_append(c.id, "deferred"), defer=True)
    storage.fail = "flush"
    with pytest.raises(pico.PersistenceUncertainError):
        h._line.flush()
    assert h.faulted is not None and not h._line.pending
    with pytest.raises(pico.HandleFaultedError):
        await c.append("user", "refused")
    await h.close()
    h2 = await sqlite.open()
    assert [e.id for e in (await (await h2.root()).entries()).items] == [kept]
    await h2.close()


async def test_a_turn_group_commits_its_settlements_and_returns_only_durable_results(
    sqlite: Backend, no_flush_window: None
) -> None:

    async def read(args: JsonObject, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    provider = pico.FauxProvider(
        [
            pico.FauxResponse(text="Looking.", tool_calls=[("read", {"path": "a"})] * 2),
            "Both say the same.",
        ]
    )
    h = await sqlite.open(provider=provider, tools=[pico.Tool("read", "Read", SCHEMA, read)])
    c = await h.root()
    with _writer_statements(h) as statements:
        input_id, result = await c.prompt("Do the files agree?")
    assert result is not None and result.status == "done"
    commits = [s for s in statements if s == "COMMIT"]
    commands = len([s for s in statements if s.startswith("INSERT INTO pico_commits")])
    # Check: fewer transactions than commands (settlements joined the next durable one),
    # but one before each provider call and one for both tool calls' intents (they share
    # it), and the drive's own at its return.
    assert 4 <= len(commits) < commands, (len(commits), commands)
    # Check: what prompt returned is already durable for every other reader.
    other = await pico.Harness.open(sqlite.url, session=sqlite.session, read_only=True)
    assert await (await other.root()).result(input_id) == result
    await other.close()
    await h.close()


async def test_parallel_tool_calls_share_the_commit_of_their_running_intents(
    sqlite: Backend, no_flush_window: None
) -> None:
    """The tool calls of one response are launched in one scheduler pass. Each commits its
    running intent before its tool runs (another connection sees it); the intents share
    ONE commit (``CommandLine.run(group=True)``): when the first tool runs, the second's
    intent is durable too, and the four effects of the turn (two provider calls, two
    tools) need three commits, not four."""
    seen: list[tuple[str, list[str]]] = []

    async def read(args: JsonObject, ctx: pico.ToolContext) -> str:
        tools = await other.tasks(kind="tool")  # what is committed, read elsewhere
        seen.append((str(args["path"]), [t.status for t in tools.items]))
        return f"contents of {args['path']}"

    calls: list[tuple[str, JsonObject]] = [("read", {"path": "a"}), ("read", {"path": "b"})]
    provider = pico.FauxProvider([pico.FauxResponse(text="Looking.", tool_calls=calls), "Same."])
    h = await sqlite.open(provider=provider, tools=[pico.Tool("read", "Read", SCHEMA, read)])
    c = await h.root()
    other = await pico.Harness.open(sqlite.url, session=sqlite.session, read_only=True)
    with _writer_statements(h) as statements:
        _, result = await c.prompt("Do the files agree?")
    assert result is not None and result.status == "done"
    # Both intents were durable before the first tool ran (its result is deferred).
    assert seen == [("a", ["running", "running"]), ("b", ["running", "running"])]
    # A commit before each provider call and one for both tools; the drive's own at the end.
    assert statements.count("COMMIT") == 4
    await other.close()
    await h.close()


async def test_a_fault_before_the_shared_commit_runs_no_tool(
    sqlite: Backend, no_flush_window: None
) -> None:
    """The commit the tool calls' intents share fails: neither tool runs (the first's
    execution raises the uncertain persistence, the second finds the handle faulted), and
    a reopened session holds neither intent."""
    storage = FaultyStorage(
        open_storage(sqlite.url, session=sqlite.session, durability=None, read_only=False)
    )
    ran: list[str] = []

    async def read(args: JsonObject, ctx: pico.ToolContext) -> str:
        ran.append(str(args["path"]))
        return "contents"

    calls: list[tuple[str, JsonObject]] = [("read", {"path": "a"}), ("read", {"path": "b"})]
    provider = pico.FauxProvider([pico.FauxResponse(text="Looking.", tool_calls=calls), "Same."])
    h = await pico.Harness.open(
        storage, provider=provider, tools=[pico.Tool("read", "Read", SCHEMA, read)]
    )
    c = await h.root()
    flush = storage.flush
    flushes = 0

    def failing_second_flush() -> None:  # the provider call's intent commits; then the tools'
        nonlocal flushes
        flushes += 1
        if flushes == 2:
            storage.fail = "flush"
        flush()

    storage.flush = failing_second_flush  # type: ignore[method-assign]
    with pytest.raises((pico.PersistenceUncertainError, pico.HandleFaultedError)):
        await c.prompt("Do the files agree?")
    assert provider.request_count == 1  # the flush that failed came after the provider call
    assert ran == [] and h.faulted is not None
    await h.close()
    h2 = await pico.Harness.open(sqlite.url, session=sqlite.session, read_only=True)
    tools = await h2.tasks(kind="tool")
    assert [t.status for t in tools.items] == []  # the settlement creating them was lost too
    await h2.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import pico

    SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}

    async def read(args, ctx):
        return "contents"

    async def main(url):
        script = []
        for i in range(10000):
            script.append(pico.FauxResponse(text="look", tool_calls=[("read", {"path": "a"})]))
            script.append(f"answer {i}")
        h = await pico.Harness.open(
            url, session="crash", provider=pico.FauxProvider(script, keep_requests=False),
            tools=[pico.Tool("read", "Read", SCHEMA, read)],
        )
        c = await h.root()
        i = 0
        while True:
            input_id, result = await c.prompt(f"question {i}")
            print(input_id, result.status, flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_killed_process_keeps_every_result_a_prompt_returned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    returned = [proc.stdout.readline().split() for _ in range(60)]
    os.kill(proc.pid, signal.SIGKILL)  # mid-turn, wherever it is (deferred batch or not)
    proc.wait()
    assert all(status == "done" for _, status in returned)

    async def read(args: JsonObject, ctx: pico.ToolContext) -> str:
        return "contents"

    h = await pico.Harness.open(
        url,
        session="crash",
        provider=pico.FauxProvider(["recovered"] * 10),
        tools=[pico.Tool("read", "Read", SCHEMA, read)],
    )
    c = await h.root()
    # Check: every result a prompt returned is durable.
    for input_id, _ in returned:
        result = await c.result(int(input_id))
        assert result is not None and result.status == "done", (input_id, result)
    # Check: the session resumes from the kept prefix: the interrupted turn (if any)
    # finishes and a new prompt is answered.
    await asyncio.wait_for(c.drive(), timeout=10)
    _, result = await asyncio.wait_for(c.prompt("after the crash"), timeout=10)
    assert result is not None and result.status == "done"
    await h.close()
