"""Workers and inboxes on PostgreSQL (issue 16, docs/workers.md; seed 003 §1.2 "One writer
per session", §6.6, §8.1; seed 000 "Claiming a run"), with workers as asyncio tasks in
this process (``tests/workers_support.py``) and one ``pico worker`` subprocess.

An API process submits commands to a session's inbox; the worker that holds (or then
picks) the session executes each under its request key in its own serialized command,
replies, drives the session and releases it when idle, advertising its next due work.
Each test reads back durable state: transcripts through a read-only open, and the
``pico_leases`` / ``pico_work`` / ``pico_inbox`` rows with SQL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.application.inbox import InboxItem, execute
from pico.domain.json import JsonObject
from pico.infrastructure.sql.work import SqlWorkQueue
from tests.backends import require_postgres
from tests.processes import ROOT
from tests.scheddefs import Scripted, settle
from tests.workers_support import (
    answer,
    create_session,
    inbox_rows,
    lease_rows,
    prefix,
    running,
    wait_for,
    work_rows,
)

#: Short leases so a test never waits long on one; renewals well inside the ttl.
LEASE = pico.Lease(ttl=4.0, renew_every=1.0)
#: What a loaded 2-core box may add to anything that should be prompt.
BOUND = 2.0

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@pytest.fixture
def pg() -> Iterator[str]:
    yield require_postgres("workers and inboxes")


def _worker(url: str, start: str, **kwargs: Any) -> pico.Worker:
    kwargs.setdefault("lease", LEASE)
    kwargs.setdefault("idle_after", 0.5)
    kwargs.setdefault("poll_every", 1.0)
    kwargs.setdefault("provider", FauxProvider([answer] * 20))
    return pico.open_worker(url, prefix=start, **kwargs)


async def _transcript(url: str, session: str) -> list[tuple[str, Any]]:
    """``(kind, content)`` of the root conversation's entries, read-only."""
    h = await pico.Harness.open(url, session=session, read_only=True)
    try:
        c = await h.root()
        return [(e.kind, e.content) for e in (await c.entries(limit=1000)).items]
    finally:
        await h.close()


async def _result(url: str, session: str, input_id: int) -> pico.InputResult | None:
    h = await pico.Harness.open(url, session=session, read_only=True)
    try:
        return await (await h.root()).result(input_id)
    finally:
        await h.close()


def _users(transcript: list[tuple[str, Any]]) -> list[Any]:
    return [content for kind, content in transcript if kind == "user"]


def _assistants(transcript: list[tuple[str, Any]]) -> list[Any]:
    return [content for kind, content in transcript if kind == "assistant"]


def _released(url: str, start: str) -> bool:
    return not lease_rows(url, start) and not work_rows(url, start)


# ------------------------------------------------------------------ 1. inbox -> worker -> reply
async def test_an_input_submitted_to_the_inbox_is_answered_by_a_worker_that_then_releases_it(
    pg: str,
) -> None:
    start = prefix("wk-reply")
    session = start + "a"
    await create_session(pg, session)
    worker = _worker(pg, start, provider=FauxProvider(["hi there"]))
    async with running(worker), pico.Inbox(pg) as inbox:
        sent = await inbox.accept(session, "hello")
        assert (sent.session_id, sent.kind, sent.duplicate) == (session, "accept", False)
        input_id = await inbox.reply(sent, timeout=10.0)
        assert isinstance(input_id, int)
        # While it is held, the only lease row is the worker's.
        assert {row[1] for row in lease_rows(pg, start)} <= {worker.owner}
        await wait_for("the session released", lambda: worker.finished, within=5.0)
    # Check: the idle session was released, its lease deleted and no work advertised.
    assert worker.finished == [(session, "idle")] and worker.picked == 1
    assert _released(pg, start)
    transcript = await _transcript(pg, session)
    assert _users(transcript) == ["hello"]
    assert _assistants(transcript) == [{"text": "hi there"}]
    result = await _result(pg, session, input_id)
    assert result is not None and result.status == "done"
    # The command row is done, its reply the input id.
    ((_, _, key, kind, done, reply),) = inbox_rows(pg, start)
    assert (key, kind, done) == (sent.request_key, "accept", True)
    assert reply == f'{{"ok":true,"value":{input_id}}}'


async def test_more_commands_than_one_page_are_all_executed_in_one_hold(pg: str) -> None:
    start = prefix("wk-page")
    session = start + "a"
    await create_session(pg, session)
    worker = _worker(pg, start, idle_after=1.0, poll_every=30.0)
    async with pico.Inbox(pg) as inbox:
        # 130 context-only messages: more than the 100 a drain reads per page.
        sent = [
            await inbox.submit(session, "append_message", {"input": f"m{i}"}) for i in range(130)
        ]
        async with running(worker):
            replies = [await inbox.reply(s, timeout=30.0) for s in sent]
            await wait_for("the session released", lambda: worker.finished, within=10.0)
    # Check: every command executed, in submission order, by ONE hold of the session.
    assert worker.picked == 1 and worker.finished == [(session, "idle")]
    assert _users(await _transcript(pg, session)) == [f"m{i}" for i in range(130)]
    ids = [r for r in replies if isinstance(r, int)]
    assert len(set(ids)) == 130 and ids == sorted(ids)
    assert all(done for (_, _, _, _, done, _) in inbox_rows(pg, start))


# ------------------------------------------------------------------ 2. request keys
async def test_a_request_key_names_one_command_once_and_refuses_another_command(
    pg: str,
) -> None:
    start = prefix("wk-key")
    session = start + "a"
    await create_session(pg, session)
    async with pico.Inbox(pg) as inbox:
        first = await inbox.accept(session, "hello", request_id="req-1")
        again = await inbox.accept(session, "hello", request_id="req-1")
        assert again == dataclasses.replace(first, duplicate=True)
        # The same key for another command (other input, other kind): refused, not stored.
        with pytest.raises(pico.RequestKeyConflictError, match="req-1"):
            await inbox.accept(session, "something else", request_id="req-1")
        with pytest.raises(pico.RequestKeyConflictError, match="req-1"):
            await inbox.steer(session, "hello", request_id="req-1")
        assert [row[0] for row in inbox_rows(pg, start)] == [first.id]
        worker = _worker(pg, start)
        async with running(worker):
            input_id = await inbox.reply(first, timeout=10.0)
            assert await inbox.reply(again, timeout=1.0) == input_id
            await wait_for("the session released", lambda: worker.finished, within=5.0)
            # After the reply the key still names that command: a retry gets its reply.
            late = await inbox.accept(session, "hello", request_id="req-1")
            assert late.duplicate and await inbox.reply(late, timeout=1.0) == input_id
    # Check: one input, answered once.
    transcript = await _transcript(pg, session)
    assert _users(transcript) == ["hello"]
    assert _assistants(transcript) == [{"text": "answer to hello"}]


async def test_a_command_executed_by_an_owner_that_died_before_its_reply_is_not_applied_twice(
    pg: str,
) -> None:
    start = prefix("wk-crash")
    session = start + "a"
    await create_session(pg, session)
    async with pico.Inbox(pg) as inbox:
        sent = await inbox.accept(session, "hello", request_id="req-crash")
        # The first owner: takes the session, executes the command (committed), and
        # "crashes" before storing the reply.
        queue = SqlWorkQueue(pg, prefix=start)
        try:
            (item,) = await queue.pending(session)
        finally:
            await queue.close()
        assert isinstance(item, InboxItem) and item.request_key == "req-crash"
        owner = await pico.Harness.open(pg, session=session, lease=LEASE, provider=FauxProvider([]))
        original = await execute(owner, item)
        await owner.close()
        assert _users(await _transcript(pg, session)) == ["hello"]
        ((_, _, _, _, done, _),) = inbox_rows(pg, start)
        assert done is False  # no reply stored: the command waits for the next owner
        # The release saw the waiting command and advertised the session as due now.
        ((_, due),) = work_rows(pg, start)
        assert due is not None and due <= 0.0
        worker = _worker(pg, start)
        async with running(worker):
            # Check: the next owner's execution finds the key and returns the same id.
            assert await inbox.reply(sent, timeout=10.0) == original
            await wait_for("the session released", lambda: worker.finished, within=5.0)
    transcript = await _transcript(pg, session)
    assert _users(transcript) == ["hello"]  # no second input
    assert _assistants(transcript) == [{"text": "answer to hello"}]
    assert worker.finished == [(session, "idle")]


# ------------------------------------------------------------------ 3. verdicts and validation
async def test_a_command_the_owner_rejects_is_replied_with_its_error_and_done(pg: str) -> None:
    start = prefix("wk-verdict")
    session = start + "a"
    definition = Scripted()
    h = await pico.Harness.open(
        pg, session=session, provider=FauxProvider([]), definitions=[definition]
    )
    c = await h.root()
    work = await h.command(lambda tx: tx.create_task(c.id, "work", status="done"))
    await h.close()
    worker = _worker(pg, start, definitions=[Scripted()])
    async with running(worker), pico.Inbox(pg) as inbox:
        not_approval = await inbox.decide_approval(session, work, "grant")
        no_task = await inbox.decide_approval(session, 99999, "deny")
        no_conversation = await inbox.accept(session, "hi", conversation_id=4242)
        replies: list[BaseException] = []
        for sent in (not_approval, no_task, no_conversation):
            with pytest.raises(pico.PicoError) as caught:
                await inbox.reply(sent, timeout=10.0)
            replies.append(caught.value)
        await wait_for("the session released", lambda: worker.finished, within=5.0)
    assert worker.finished == [(session, "idle")]
    # Check: every row is done; nothing of the rejected commands is stored.
    assert [row[4] for row in inbox_rows(pg, start)] == [True, True, True]
    assert _users(await _transcript(pg, session)) == []
    # The same class and message as the owner's own call raises.
    owner = await pico.Harness.open(
        pg, session=session, provider=FauxProvider([]), definitions=[Scripted()]
    )
    try:
        local: list[BaseException] = []
        for attempt in (
            lambda: owner.decide_approval(work, "grant"),
            lambda: owner.decide_approval(99999, "deny"),
            lambda: owner.conversation(4242),
        ):
            try:
                found = await attempt()
            except pico.PicoError as exc:
                local.append(exc)
            else:
                assert found is None  # no such conversation: the owner raised this itself
                local.append(pico.UnknownConversationError(4242))
    finally:
        await owner.close()
    assert [type(e) for e in replies] == [
        pico.CommandRejectedError,
        pico.UnknownTaskError,
        pico.UnknownConversationError,
    ]
    assert [(type(e), str(e)) for e in replies] == [(type(e), str(e)) for e in local]
    assert "not an approval" in str(replies[0]) and "4242" in str(replies[2])


@pytest.mark.parametrize(
    ("kind", "payload", "error", "says"),
    [
        (
            "decide_approval",
            {"task_id": 1, "decision": "maybe"},
            pico.InvalidArgumentError,
            "maybe",
        ),
        ("accept", {"input": {"x": float("nan")}}, pico.InvalidJsonError, "input"),
        ("accept", {"input": "\udc00"}, pico.InvalidJsonError, "input"),
        (
            "accept",
            {"input": "hi", "conversation_id": "1"},
            pico.InvalidArgumentError,
            "conversation_id",
        ),
        ("answer_tool_call", {"task_id": 1, "content": 3}, pico.InvalidArgumentError, "text"),
        ("delete_everything", {}, pico.InvalidArgumentError, "inbox command"),
    ],
)
async def test_a_bad_submission_is_refused_before_anything_is_stored(
    pg: str, kind: str, payload: dict[str, Any], error: type[pico.PicoError], says: str
) -> None:
    start = prefix("wk-bad")
    session = start + "a"
    await create_session(pg, session)
    async with pico.Inbox(pg) as inbox:
        with pytest.raises(error, match=says) as caught:
            await inbox.submit(session, kind, payload, request_id="req-bad")
        assert type(caught.value) is error
    assert inbox_rows(pg, start) == [] and work_rows(pg, start) == []


async def test_an_inbox_reaches_only_existing_sessions_on_postgresql(
    pg: str, tmp_path: Path
) -> None:
    start = prefix("wk-unknown")
    async with pico.Inbox(pg) as inbox:
        with pytest.raises(pico.UnknownSessionError, match=start + "nobody"):
            await inbox.accept(start + "nobody", "hello")
        with pytest.raises(pico.InvalidArgumentError, match="session"):
            await inbox.accept("", "hello")
    # Check: no command and no work row for the unknown session.
    assert inbox_rows(pg, start) == [] and work_rows(pg, start) == []
    closed = pico.Inbox(pg)
    await closed.close()
    with pytest.raises(pico.ClosedError, match=r"^this inbox is closed; make a new"):
        await closed.accept(start + "nobody", "hello")
    with pytest.raises(pico.ClosedError, match=r"^this inbox is closed"):
        await closed.reply(pico.Submitted(1, start + "x", "k", "accept"))
    for url in (f"sqlite:///{tmp_path / 'w.db'}", "memory://", f"jsonl:///{tmp_path / 'j'}"):
        with pytest.raises(pico.ConfigurationError, match="need PostgreSQL"):
            pico.Inbox(url)
        with pytest.raises(pico.ConfigurationError, match="need PostgreSQL"):
            pico.open_worker(url)
    assert list(tmp_path.iterdir()) == []  # nothing was created


async def test_a_reply_nobody_gives_in_time_is_a_reply_timeout_and_the_command_stays(
    pg: str,
) -> None:
    start = prefix("wk-timeout")
    session = start + "a"
    await create_session(pg, session)
    async with pico.Inbox(pg) as inbox:
        sent = await inbox.accept(session, "hello")
        began = time.monotonic()
        with pytest.raises(pico.ReplyTimeoutError, match=session):
            await inbox.reply(sent, timeout=0.3)
        assert time.monotonic() - began < 0.3 + BOUND
    ((_, _, _, _, done, _),) = inbox_rows(pg, start)
    assert done is False
    ((_, due),) = work_rows(pg, start)
    assert due is not None and due <= 0.0  # still advertised for a worker


# ------------------------------------------------------------------ 4. approvals and held calls
@dataclasses.dataclass
class Tools:
    """A ``read`` tool held for approval by ``before_tool`` and a ``deploy`` tool that
    defers to an outside answer; records what ran."""

    invoked: list[JsonObject] = dataclasses.field(default_factory=list)

    def options(self, provider: FauxProvider) -> dict[str, Any]:
        async def read(args: JsonObject, ctx: ToolContext) -> str:
            self.invoked.append(args)
            return f"contents of {args['path']}"

        async def deploy(args: JsonObject, ctx: ToolContext) -> str:
            ctx.defer()  # an operator answers later
            return "waiting for the operator"

        async def before(call: pico.ToolCall) -> pico.ToolDecision:
            if call.name == "read":
                return pico.ToolDecision("hold", "reads need a person")
            return pico.ToolDecision("allow")

        return {
            "provider": provider,
            "tools": [
                pico.Tool("read", "Read", SCHEMA, read),
                pico.Tool("deploy", "Deploy", SCHEMA, deploy),
            ],
            "hooks": pico.Hooks(before_tool=before),
        }


async def _suspended(url: str, session: str, tools: Tools, call: str) -> tuple[int, pico.Harness]:
    """A session whose first turn called ``call`` and is suspended on it (the harness is
    still open: the caller reads what waits, then closes it)."""
    h = await pico.Harness.open(
        url,
        session=session,
        **tools.options(FauxProvider([FauxResponse(tool_calls=[(call, {"path": "a.py"})])])),
    )
    c = await h.root()
    input_id = await c.accept(f"{call} it")
    assert await asyncio.wait_for(c.drive(), 10.0) == "suspended"
    return input_id, h


async def test_an_approval_decided_through_the_inbox_lets_the_worker_finish_the_turn(
    pg: str,
) -> None:
    start = prefix("wk-approve")
    session = start + "a"
    tools = Tools()
    input_id, h = await _suspended(pg, session, tools, "read")
    (approval,) = await h.pending_approvals()
    await h.close()
    assert tools.invoked == []
    provider = FauxProvider(["after the read"])
    worker = _worker(pg, start, **tools.options(provider))
    async with running(worker), pico.Inbox(pg) as inbox:
        sent = await inbox.decide_approval(session, approval.id, "grant")
        assert await inbox.reply(sent, timeout=10.0) == approval.id
        await wait_for("the session released", lambda: worker.finished, within=10.0)
    assert worker.finished == [(session, "idle")]
    # Check: the tool ran once, after the grant, and the turn reached its answer.
    assert tools.invoked == [{"path": "a.py"}]
    result = await _result(pg, session, input_id)
    assert result is not None and result.status == "done"
    transcript = await _transcript(pg, session)
    assert _assistants(transcript)[-1] == {"text": "after the read"}
    assert [content for kind, content in transcript if kind == "tool"] == [
        {"content": "contents of a.py", "is_error": False}
    ]
    assert _released(pg, start)


async def test_a_held_call_answered_through_the_inbox_lets_the_worker_finish_the_turn(
    pg: str,
) -> None:
    start = prefix("wk-answer")
    session = start + "a"
    tools = Tools()
    input_id, h = await _suspended(pg, session, tools, "deploy")
    (held,) = await h.held_tool_calls((await h.root()).id)
    await h.close()
    provider = FauxProvider(["Deployed."])
    worker = _worker(pg, start, **tools.options(provider))
    async with running(worker), pico.Inbox(pg) as inbox:
        sent = await inbox.answer_tool_call(session, held.id, "approved by alice")
        entry_id = await inbox.reply(sent, timeout=10.0)
        assert isinstance(entry_id, int)
        # Answered twice: the owner's verdict comes back as its own error class.
        twice = await inbox.answer_tool_call(session, held.id, "approved twice")
        with pytest.raises(pico.ToolCallAnsweredError, match=f"entry {entry_id}"):
            await inbox.reply(twice, timeout=10.0)
        await wait_for("the session released", lambda: worker.finished, within=10.0)
    assert worker.finished == [(session, "idle")]
    result = await _result(pg, session, input_id)
    assert result is not None and result.status == "done"
    results = [
        p.content
        for p in provider.requests[-1].messages[-1].parts
        if isinstance(p, pico.ToolResultPart)
    ]
    assert results == ["approved by alice"]
    r = await pico.Harness.open(pg, session=session, read_only=True)
    try:
        entry = await r.entry(entry_id)
    finally:
        await r.close()
    assert entry is not None and entry.kind == "tool"
    assert entry.content == {"content": "approved by alice", "is_error": False}
    assert _assistants(await _transcript(pg, session))[-1] == {"text": "Deployed."}


# ------------------------------------------------------------------ 5. spread over workers
async def test_sessions_spread_over_two_workers_each_held_by_one_at_a_time(pg: str) -> None:
    start = prefix("wk-spread")
    sessions = [f"{start}{n}" for n in range(6)]
    for session in sessions:
        await create_session(pg, session)
    holding: dict[str, str] = {}  # session -> the worker holding it right now
    overlaps: list[str] = []
    held_by: dict[str, list[str]] = {s: [] for s in sessions}
    # Both workers in this process share one engine (one per URL per process): four
    # sessions held at once must not wait for a connection (its pool grows with them).
    workers = [
        _worker(pg, start, concurrency=2, provider=FauxProvider([answer] * 10)) for _ in range(2)
    ]
    # Both first picks run at the same moment: SKIP LOCKED must give them disjoint rows.
    together = asyncio.Barrier(2)
    for worker in workers:
        queue, opener = worker.queue, worker.opener

        def wrap(worker: pico.Worker, queue: Any, opener: Any) -> None:
            real_pick, first = queue.pick, [True]

            async def pick(owner: str, ttl: float, limit: int) -> list[str]:
                if first[0]:
                    first[0] = False
                    await asyncio.wait_for(together.wait(), 10.0)
                return list(await real_pick(owner, ttl, limit))

            async def open_recorded(url: str, **kwargs: Any) -> Any:
                h = await opener(url, **kwargs)
                session = kwargs["session"]
                if session in holding:
                    overlaps.append(f"{session}: {holding[session]} and {worker.owner}")
                holding[session] = worker.owner
                held_by[session].append(worker.owner)
                real_close = h.close

                async def close(**kw: Any) -> None:
                    if holding.get(session) == worker.owner:
                        del holding[session]
                    await real_close(**kw)

                h.close = close
                return h

            queue.pick = pick
            worker.opener = open_recorded

        wrap(worker, queue, opener)
    # Every session has an input waiting before either worker starts.
    async with pico.Inbox(pg) as inbox:
        sent = [await inbox.accept(s, f"question {n}") for n, s in enumerate(sessions)]
        async with running(workers[0]), running(workers[1]):
            concurrent = 0
            deadline = time.monotonic() + 20.0
            while sum(len(w.finished) for w in workers) < len(sessions):
                assert time.monotonic() < deadline, [w.finished for w in workers]
                # Check with SQL during the run: one lease row per session, a worker's own.
                rows = lease_rows(pg, start)
                assert len({r[0] for r in rows}) == len(rows)
                assert {r[1] for r in rows} <= {w.owner for w in workers}
                concurrent = max(concurrent, len(rows))
                await asyncio.sleep(0.02)
            replies = [await inbox.reply(s, timeout=5.0) for s in sent]
    assert overlaps == []
    # Check: every session picked by exactly one worker, once, and both worked.
    assert all(len(owners) == 1 for owners in held_by.values()), held_by
    finished = sorted(s for w in workers for s, _ in w.finished)
    assert finished == sessions
    assert all(why == "idle" for w in workers for _, why in w.finished)
    assert [w.picked for w in workers] == [len(w.finished) for w in workers]
    assert all(w.picked >= 2 for w in workers), [w.picked for w in workers]
    assert concurrent >= 2
    for n, (session, input_id) in enumerate(zip(sessions, replies, strict=True)):
        assert isinstance(input_id, int)
        transcript = await _transcript(pg, session)
        assert _users(transcript) == [f"question {n}"]
        assert _assistants(transcript) == [{"text": f"answer to question {n}"}]
    assert _released(pg, start)


# ------------------------------------------------------------------ 6. due timers
class Later(Scripted):
    """``work`` tasks: the first one (no ``not_before``) creates a second due ``delay``
    seconds later and is done; the second records when it ran."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.ran_at: dict[int, float] = {}

        async def execute(task: pico.TaskSnapshot, ctx: pico.TaskExecution) -> None:
            self.ran_at[task.id] = time.time()
            if task.not_before is None:
                due = time.time() + delay
                await ctx.command(
                    lambda tx: tx.create_task(task.conversation_id, "work", not_before=due)
                )
            await settle(ctx, "done")

        self.on_execute = execute


async def test_a_session_released_with_a_timer_is_advertised_for_then_and_picked_when_due(
    pg: str,
) -> None:
    start = prefix("wk-due")
    session = start + "a"
    delay = 2.5
    # Set up under a lease, so the close advertises the first task as due now.
    h = await pico.Harness.open(pg, session=session, lease=LEASE, definitions=[Later(delay)])
    c = await h.root()
    first = await h.command(lambda tx: tx.create_task(c.id, "work"))
    await h.close()
    ((_, due),) = work_rows(pg, start)
    assert due is not None and due <= 0.0
    definition = Later(delay)
    worker = _worker(pg, start, definitions=[definition])
    async with running(worker):
        await wait_for("the first hold released", lambda: worker.finished, within=10.0)
        released = time.time()
        assert worker.finished == [(session, "idle")] and list(definition.ran_at) == [first]
        (second,) = [t for t in (await _tasks(pg, session)) if t.id != first]
        assert second.not_before is not None and second.role == "ready"
        # Check (SQL): the release advertised the timer, due when the task is.
        ((_, due),) = work_rows(pg, start)
        assert due is not None
        assert abs((time.time() + due) - second.not_before) < 0.5, due
        assert due > 0.5
        assert lease_rows(pg, start) == [] and worker.sessions == []
        # Not held meanwhile: nothing picks it before it is due...
        await wait_for("the timer task ran", lambda: second.id in definition.ran_at, within=10.0)
        # ...and it ran once due, promptly.
        ran = definition.ran_at[second.id]
        assert ran >= second.not_before - 0.05, ran - second.not_before
        assert ran - second.not_before < BOUND
        assert ran - released > 0.5
        await wait_for("the second hold released", lambda: len(worker.finished) == 2, within=10.0)
    assert worker.picked == 2 and worker.finished == [(session, "idle"), (session, "idle")]
    assert [t.status for t in await _tasks(pg, session)] == ["done", "done"]
    assert _released(pg, start)


async def _tasks(url: str, session: str) -> list[pico.TaskSnapshot]:
    h = await pico.Harness.open(url, session=session, read_only=True, definitions=[Scripted()])
    try:
        return sorted((await h.tasks()).items, key=lambda t: t.id)
    finally:
        await h.close()


# ------------------------------------------------------------------ 7. wakeups
def _listening(worker: pico.Worker) -> asyncio.Event:
    """Set once the worker waits on its LISTEN connection (its second wait: the first
    only subscribes)."""
    queue: Any = worker.queue
    real_wait, ready = queue.wait, asyncio.Event()

    async def wait(timeout: float) -> set[str]:
        if queue._listening:
            ready.set()
        return set(await real_wait(timeout))

    queue.wait = wait
    return ready


async def test_an_input_wakes_an_idle_worker_by_notification_well_within_its_poll(
    pg: str,
) -> None:
    start = prefix("wk-notify")
    session = start + "a"
    await create_session(pg, session)
    worker = _worker(pg, start, poll_every=30.0)
    ready = _listening(worker)
    async with running(worker), pico.Inbox(pg) as inbox:
        await asyncio.wait_for(ready.wait(), 10.0)
        began = time.monotonic()
        sent = await inbox.accept(session, "wake up")
        took = await wait_for("the pick", lambda: worker.picked == 1, within=BOUND)
        assert isinstance(await inbox.reply(sent, timeout=10.0), int)
        replied = time.monotonic() - began
    assert took < BOUND and replied < BOUND, (took, replied)


@pytest.mark.parametrize("drop", ["ignored", "backend terminated"])
async def test_with_notifications_dropped_an_input_is_picked_up_by_polling(
    pg: str, drop: str
) -> None:
    start = prefix("wk-poll")
    session = start + "a"
    await create_session(pg, session)
    poll = 1.0
    worker = _worker(pg, start, poll_every=poll)
    queue: Any = worker.queue
    ready = _listening(worker)
    waits: list[float] = []
    if drop == "ignored":
        listening = queue.wait

        async def deaf(timeout: float) -> set[str]:
            await listening(0.0)  # keeps ``ready`` honest; a notification is thrown away
            waits.append(timeout)
            await asyncio.sleep(timeout)
            return set()

        queue.wait = deaf
    async with running(worker), pico.Inbox(pg) as inbox:
        await asyncio.wait_for(ready.wait(), 10.0)
        if drop == "backend terminated":
            pid = queue._listen.conn.pgconn.backend_pid
            with psycopg.connect(pg, autocommit=True) as conn:
                row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
            assert row == (True,)
        sent = await inbox.accept(session, "anyone there?")
        took = await wait_for("the pick by polling", lambda: worker.picked == 1, within=10.0)
        assert isinstance(await inbox.reply(sent, timeout=10.0), int)
    assert took < poll + BOUND, took
    if drop == "ignored":
        assert waits and all(w <= poll for w in waits)


# ------------------------------------------------------------------ 8. dead owner
async def test_a_session_whose_owner_died_is_taken_over_and_completed(pg: str) -> None:
    start = prefix("wk-dead")
    dead, alive = start + "dead", start + "alive"
    inputs = {}
    for session in (dead, alive):
        h = await pico.Harness.open(pg, session=session, provider=FauxProvider([]))
        inputs[session] = await (await h.root()).accept(f"hello {session}")  # live work
        await h.close()
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pico_leases (session_id, owner, expires_at, renewed_at) "
            "VALUES (%s, 'crashed-worker', now() - interval '1 second', "
            "now() - interval '11 seconds')",
            (dead,),
        )
        # A live foreign lease, with work advertised: its owner is awake; never taken.
        conn.execute(
            "INSERT INTO pico_leases (session_id, owner, expires_at, renewed_at) "
            "VALUES (%s, 'live-worker', now() + interval '60 seconds', now())",
            (alive,),
        )
        conn.execute("INSERT INTO pico_work (session_id, due_at) VALUES (%s, now())", (alive,))
    worker = _worker(pg, start)
    async with running(worker):
        await wait_for("the dead owner's session done", lambda: worker.finished, within=10.0)
        await asyncio.sleep(0.5)  # a second pick, had the live lease been takeable
    assert worker.finished == [(dead, "idle")] and worker.picked == 1
    result = await _result(pg, dead, inputs[dead])
    assert result is not None and result.status == "done"
    assert _assistants(await _transcript(pg, dead)) == [{"text": f"answer to hello {dead}"}]
    # Check: the live holder's session is untouched and its lease still its own.
    assert [(r[0], r[1]) for r in lease_rows(pg, start)] == [(alive, "live-worker")]
    assert _assistants(await _transcript(pg, alive)) == []
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute("DELETE FROM pico_leases WHERE session_id = %s", (alive,))
        conn.execute("DELETE FROM pico_work WHERE session_id = %s", (alive,))


# ------------------------------------------------------------------ 9. options
@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 2.0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"idle_after": 0}, "idle_after"),
        ({"idle_after": float("nan")}, "idle_after"),
        ({"poll_every": -1.0}, "poll_every"),
        ({"poll_every": float("inf")}, "poll_every"),
        ({"lease": 10.0}, "pico.Lease"),
        ({"session": "s"}, "session"),
        ({"lease": None, "read_only": True}, "read_only"),
        ({"prefix": 3}, "prefix"),
    ],
)
def test_a_worker_with_bad_options_is_refused(pg: str, kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(pico.InvalidArgumentError, match=says):
        pico.open_worker(pg, **kwargs)


# ------------------------------------------------------------------ 10. the CLI
def _pico(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "pico"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def test_pico_worker_answers_an_inbox_and_releases_everything_on_sigterm(pg: str) -> None:
    start = prefix("wk-cli")
    session = start + "a"
    await create_session(pg, session)
    child = _pico(
        "worker", pg, "--prefix", start, "--setup", "tests.workers_support:options",
        "--idle-after", "60", "--lease-ttl", "4", "--renew-every", "1", "--poll-every", "1",
    )  # fmt: skip
    try:
        assert child.stderr is not None
        banner = await asyncio.wait_for(asyncio.to_thread(child.stderr.readline), 20.0)
        assert banner.startswith("pico worker ") and start in banner, banner
        async with pico.Inbox(pg) as inbox:
            sent = await inbox.accept(session, "hello from the API")
            input_id = await inbox.reply(sent, timeout=15.0)
        assert isinstance(input_id, int)
        # Still held (idle_after 60 s): the child's lease row is there.
        ((held, owner, _),) = lease_rows(pg, start)
        assert held == session and owner in banner
        child.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(child.wait, 20.0)
        rest = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    assert code == 0, rest
    assert "stopped" in rest and "released" in rest
    # Check: released on the way out (nothing left under the prefix), the answer stored.
    assert lease_rows(pg, start) == []
    assert _assistants(await _transcript(pg, session)) == [{"text": "answer to hello from the API"}]


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("tests.no_such_module:options", "cannot be imported"),
        ("tests.workers_support:nothing", "has no 'nothing'"),
        ("tests.workers_support", "module:attribute"),
        ("tests.workers_support:BOUND_NOT_A_DICT", "has no"),
        ("tests.workers_support:__all__", "dict of Harness.open options"),
    ],
)
def test_pico_worker_with_a_bad_setup_exits_2_with_one_line(pg: str, setup: str, says: str) -> None:
    child = _pico("worker", pg, "--prefix", prefix("wk-cli-bad"), "--setup", setup)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err
