"""The watch contract (§9.4, §10.2 "Watch registration races a commit") on every backend:
the base, then each durable main commit touching the conversation whole, previews
separately, and idle / fault / handler_error / rebind signals; races forced in both orders
with barriers; a read-only handle in another process following the owner's commits."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.application import line as line_module
from pico.application.flows.streaming import FRAME_CHARS
from pico.application.model import Request, StreamEvent, TextDelta
from pico.application.watch import (
    WatchBase,
    WatchCommit,
    WatchEvent,
    WatchPreview,
    WatchSignal,
    WatchStream,
)
from pico.domain.json import JsonObject
from pico.infrastructure.container import open_storage
from tests.backends import Backend, make_backend, require_postgres
from tests.integration.test_crash_and_faults import FaultyStorage
from tests.processes import spawn_child

TIMEOUT = 10.0


async def _bounded(aw: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(aw, timeout=TIMEOUT)


class Gated(FauxProvider):
    """The faux provider, holding its stream once ``at`` characters of text have been
    streamed until ``release`` is set (``held`` says it is holding)."""

    def __init__(self, script: list[Any], *, chunk_chars: int, at: list[int]) -> None:
        super().__init__(script, chunk_chars=chunk_chars)
        self.at = list(at)
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        streamed = 0
        async for event in super().stream(request):
            yield event
            if isinstance(event, TextDelta):
                streamed += len(event.text)
                if self.at and streamed >= self.at[0]:
                    self.at.pop(0)
                    self.held.set()
                    await self.release.wait()
                    self.release.clear()

    async def hold(self) -> None:
        await _bounded(self.held.wait())
        self.held.clear()

    def go(self) -> None:
        self.release.set()


class Seen:
    """A listener that records every event it is given."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []

    def __call__(self, event: WatchEvent) -> None:
        self.events.append(event)

    @property
    def base(self) -> WatchBase:
        first = self.events[0]
        assert isinstance(first, WatchBase), first
        return first

    def commits(self) -> list[WatchCommit]:
        return [e for e in self.events if isinstance(e, WatchCommit)]

    def previews(self) -> list[WatchPreview]:
        return [e for e in self.events if isinstance(e, WatchPreview)]

    def signals(self, kind: str | None = None) -> list[WatchSignal]:
        return [e for e in self.events if isinstance(e, WatchSignal) and kind in (None, e.kind)]

    def entry_ids(self) -> list[int]:
        """Entries the commits appended, in delivery order."""
        return [
            int(ch.payload["seq"])  # type: ignore[arg-type]
            for commit in self.commits()
            for ch in commit.changes
            if ch.event == "Conversation.EntryAppended"
        ]


def _append(conversation_id: int, text: str) -> Callable[[pico.Command], int]:
    def build(tx: pico.Command) -> int:
        return tx.append_entry(conversation_id, "user", text)

    return build


def _main_batches(h: pico.Harness, after: int) -> list[tuple[int, int, int]]:
    """(first, last, boundary position) of every stored main batch after ``after``."""
    out: list[tuple[int, int, int]] = []
    for record in h.audit(after=after, limit=1000):
        if record.event == "Session.Committed" and record.payload.get("scope") == "main":
            first, last = record.payload["first"], record.payload["last"]
            assert isinstance(first, int) and isinstance(last, int)
            out.append((first, last, record.position))
    return out


def _text(entry: pico.Entry) -> str:
    content = entry.content
    if isinstance(content, dict):
        value = content.get("text", "")
        return value if isinstance(value, str) else ""
    return content if isinstance(content, str) else ""


# ------------------------------------------------------------------ 1. the base


async def test_the_base_holds_the_page_placed_inputs_live_tasks_queue_and_previews(
    backend: Backend,
) -> None:
    long = "x" * (FRAME_CHARS * 3)
    provider = Gated(["first answer", long], chunk_chars=64, at=[FRAME_CHARS + 64])
    h = await backend.open(provider=provider)
    c = await h.root()
    first = await c.accept("first")
    second = await c.accept("second")  # busy: queued, placed after the first answer
    drive = asyncio.ensure_future(h.drive())
    await provider.hold()  # the second generation has streamed one frame
    third = await c.accept("third")  # busy again: queued
    seen = Seen()
    unsubscribe = h.watch(c.id, seen, limit=4)
    base = seen.base
    # Check: the conversation and the newest 4 entries, oldest first.
    assert base.conversation == await c.snapshot()
    everything = [e.id for e in (await c.entries(limit=100)).items]
    assert [e.id for e in base.entries] == everything[-4:]
    assert base.as_of == h.main_head()
    # Check: the placement of "second" is visible and its admission entry is referenced.
    placements = [e for e in base.entries if e.kind == "placement"]
    assert [p.content for p in placements] == [{"input": second}]
    assert list(base.referenced_inputs) == [second]
    assert base.referenced_inputs[second].content == "second"
    assert first not in [e.id for e in base.entries]  # outside the page
    # Check: the live generation, the queued third input, the frame streamed so far.
    live = (await h.tasks(conversation_ids=[c.id], live=True, limit=10)).items
    assert [t.id for t in base.tasks] == [t.id for t in live] and len(live) == 1
    assert base.tasks[0].kind == "generation"
    assert base.queued == ((third, "follow_up"),)
    assert [(p.task_id, p.kind) for p in base.previews] == [(live[0].id, "pico.frames")]
    assert (
        "".join(str(v) for v in base.previews[0].value)
        == long[: len("".join(str(v) for v in base.previews[0].value))]
    )
    assert len("".join(str(v) for v in base.previews[0].value)) >= FRAME_CHARS
    json.dumps(base.to_json())  # the wire form is JSON
    provider.go()
    await _bounded(drive)
    unsubscribe()
    await h.close()


async def test_a_limit_bounds_the_page_and_without_work_the_base_has_no_tasks(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    ids = [await c.append("user", f"m{i}") for i in range(5)]
    seen = Seen()
    h.watch(c.id, seen, limit=1)
    assert [e.id for e in seen.base.entries] == ids[-1:]
    assert seen.base.tasks == () and seen.base.queued == () and seen.base.previews == ()
    assert seen.base.referenced_inputs == {}
    await h.close()


# ------------------------------------------------------------------ 2. registration races


async def test_a_commit_in_flight_at_registration_is_delivered_once_not_in_the_base(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    before = await c.append("user", "before")
    building, release = asyncio.Event(), asyncio.Event()

    async def build(tx: pico.Command) -> int:
        entry = tx.append_entry(c.id, "user", "racing")  # its id is final already
        building.set()
        await release.wait()
        return entry

    racing: asyncio.Future[int] = asyncio.ensure_future(h.command(build))
    await _bounded(building.wait())
    seen = Seen()
    h.watch(c.id, seen)  # registers while the command holds the line
    # Check: the base is the committed state without the racing command.
    assert [e.id for e in seen.base.entries] == [before]
    assert seen.base.as_of < seen.base.position or seen.base.as_of == before
    release.set()
    entry = await _bounded(racing)
    after = await c.append("user", "after")
    # Check: delivered exactly once, then the next commit: no gap, no duplicate.
    assert seen.entry_ids() == [entry, after]
    assert [(m.first_seq, m.last_seq) for m in seen.commits()] == [
        (f, last) for f, last, _ in _main_batches(h, seen.base.position)
    ]
    assert entry > seen.base.as_of
    await h.close()


async def test_a_commit_finished_before_registration_is_in_the_base_not_delivered(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    building, release = asyncio.Event(), asyncio.Event()

    async def build(tx: pico.Command) -> int:
        entry = tx.append_entry(c.id, "user", "racing")
        building.set()
        await release.wait()
        return entry

    racing: asyncio.Future[int] = asyncio.ensure_future(h.command(build))
    await _bounded(building.wait())
    release.set()
    entry = await _bounded(racing)  # the commit completes first
    seen = Seen()
    h.watch(c.id, seen)
    assert [e.id for e in seen.base.entries] == [entry]
    assert seen.base.as_of >= entry
    after = await c.append("user", "after")
    assert seen.entry_ids() == [after]
    await h.close()


async def test_a_deferred_settlement_pending_at_registration_is_durable_before_the_base(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 3600.0)  # only explicit flushes
    h = await backend.open()
    c = await h.root()
    kept = await c.append("user", "durable")
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    assert h._line.pending
    seen = Seen()
    h.watch(c.id, seen)
    # Check: the base shows the deferred command only because it is durable now.
    assert not h._line.pending
    assert [e.id for e in seen.base.entries] == [kept, deferred]
    if backend.name in ("sqlite", "postgresql"):
        other = await backend.open(read_only=True)
        assert [e.id for e in (await (await other.root()).entries()).items] == [kept, deferred]
        await other.close()
    after = await c.append("user", "after")
    assert seen.entry_ids() == [after]  # not delivered again
    await h.close()


async def test_a_second_watch_over_a_pending_deferred_command_splits_it_cleanly(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 3600.0)
    h = await backend.open()
    c = await h.root()
    first = Seen()
    h.watch(c.id, first)
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    second = Seen()
    h.watch(c.id, second)  # makes it durable: the first watcher is told, the second has it
    assert first.entry_ids() == [deferred]
    assert [e.id for e in second.base.entries] == [deferred] and second.commits() == []
    after = await c.append("user", "after")
    assert first.entry_ids() == [deferred, after] and second.entry_ids() == [after]
    await h.close()


async def test_a_deferred_command_after_registration_is_delivered_when_durable(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(line_module, "FLUSH_WINDOW", 3600.0)
    h = await backend.open()
    c = await h.root()
    seen = Seen()
    h.watch(c.id, seen)
    deferred = await h._line.run(_append(c.id, "deferred"), defer=True)
    assert seen.commits() == []  # saved, not durable: not observable yet
    h._line.flush()
    assert seen.entry_ids() == [deferred]
    await h.close()


# ------------------------------------------------------------------ 3. whole batches


async def test_a_batch_is_one_commit_and_other_conversations_are_filtered_out(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    other: int = await h.command(lambda tx: tx.create_conversation())
    seen = Seen()
    h.watch(c.id, seen)

    def several(tx: pico.Command) -> list[int]:
        a = tx.append_entry(c.id, "user", "a")
        elsewhere = tx.append_entry(other, "user", "elsewhere")
        b = tx.append_entry(c.id, "assistant", "b")
        tx.append_context(c.id, [a, b])
        return [a, elsewhere, b]

    a, elsewhere, b = await h.command(several)
    await h.command(_append(other, "only the other conversation"))
    last = await c.append("user", "last")
    batches = _main_batches(h, seen.base.position)
    assert len(batches) == 3
    commits = seen.commits()
    # Check: the batch arrives whole, once, with its stored boundary; the batch of the
    # other conversation only is not delivered.
    assert [(m.first_seq, m.last_seq) for m in commits] == [b[:2] for b in (batches[0], batches[2])]
    assert commits[0].first_seq == a
    events = [(ch.aggregate, ch.event) for ch in commits[0].changes]
    assert events == [
        (f"conversation/{c.id}", "Conversation.EntryAppended"),
        (f"conversation/{c.id}", "Conversation.EntryAppended"),
        (f"conversation/{c.id}", "Conversation.ContextAppended"),
    ]
    assert seen.entry_ids() == [a, b, last]
    assert elsewhere not in seen.entry_ids()
    seqs = [ch.payload["seq"] for m in commits for ch in m.changes]
    assert seqs == sorted(set(seqs))  # type: ignore[type-var]
    json.dumps([m.to_json() for m in commits])
    await h.close()


# ------------------------------------------------------------------ 4. previews


async def test_previews_carry_only_new_frames_of_the_watched_conversations_tasks(
    backend: Backend,
) -> None:
    long = "".join(chr(ord("a") + i % 26) for i in range(FRAME_CHARS * 4))
    provider = FauxProvider([long, long], chunk_chars=64)
    h = await backend.open(provider=provider)
    c = await h.root()
    other: int = await h.command(lambda tx: tx.create_conversation())
    seen = Seen()
    h.watch(c.id, seen)
    await c.accept("stream, watched")
    await pico.ConversationHandle(h, other).accept("stream, not watched")
    await _bounded(h.drive())
    mine = [t.id for t in (await h.tasks(conversation_ids=[c.id], limit=10)).items]
    previews = seen.previews()
    assert previews, "a streaming generation delivers previews"
    # Check: previews only of the watched conversation's task, each only the new frames.
    assert {p.task_id for p in previews} == set(mine)
    assert all(p.kind == "pico.frames" and len(p.value) >= 1 for p in previews)
    streamed = "".join(str(v) for p in previews for v in p.value)
    assert long.startswith(streamed) and len(streamed) >= FRAME_CHARS * 3
    # Check: previews are not commits (working writes never appear as main changes).
    assert not any("pico.frames" in json.dumps(m.to_json()) for m in seen.commits())
    json.dumps([p.to_json() for p in previews])
    await h.close()


async def test_a_base_preview_then_each_new_frame_once(backend: Backend) -> None:
    long = "".join(chr(ord("a") + i % 26) for i in range(FRAME_CHARS * 4))
    provider = Gated([long], chunk_chars=64, at=[FRAME_CHARS * 2 + 64])
    h = await backend.open(provider=provider)
    c = await h.root()
    await c.accept("stream")
    drive = asyncio.ensure_future(h.drive())
    await provider.hold()
    seen = Seen()
    h.watch(c.id, seen)
    in_base = "".join(str(v) for p in seen.base.previews for v in p.value)
    assert len(in_base) >= FRAME_CHARS * 2
    provider.go()
    await _bounded(drive)
    later = "".join(str(v) for p in seen.previews() for v in p.value)
    # Check: the stream continues after the base's frames, none repeated.
    assert long.startswith(in_base + later) and later
    await h.close()


# ------------------------------------------------------------------ 5. idle


async def test_idle_comes_when_the_turn_is_done_not_between_a_task_and_its_successor(
    backend: Backend,
) -> None:
    async def read(args: JsonObject, ctx: ToolContext) -> str:
        return f"contents of {args['path']}"

    schema: JsonObject = {"type": "object"}
    tools = [
        pico.Tool("read", "Read a file", schema, read),
        pico.Tool("grep", "Search", schema, read),
    ]
    provider = FauxProvider(
        [
            FauxResponse(tool_calls=[("read", {"path": "a"}), ("grep", {"path": "b"})]),
            FauxResponse(tool_calls=[("read", {"path": "c"})]),
            "done",
        ]
    )
    h = await backend.open(provider=provider, tools=tools)
    c = await h.root()
    seen = Seen()
    h.watch(c.id, seen)
    input_id = await c.accept("go")
    await _bounded(h.drive())
    result = await c.result(input_id)
    assert result is not None and result.status == "done"
    # Check: exactly one idle, and it is the last event: after the final answer's commit.
    idle = [i for i, e in enumerate(seen.events) if isinstance(e, WatchSignal) and e.kind == "idle"]
    assert idle == [len(seen.events) - 1]
    final = seen.events[idle[0] - 1]
    assert isinstance(final, WatchCommit)
    assert result.entry_id in [
        ch.payload.get("seq") for ch in final.changes if ch.event == "Conversation.EntryAppended"
    ]
    kinds = {t.kind for t in (await h.tasks(conversation_ids=[c.id], limit=50)).items}
    assert {"generation", "tool"} <= kinds  # tools, joins and generations came and went
    await h.close()


# ------------------------------------------------------------------ 6. listener errors


async def test_a_raising_listener_gets_handler_error_and_the_commit_stays(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    seen = Seen()

    def listener(event: WatchEvent) -> None:
        seen(event)
        if isinstance(event, WatchCommit):
            raise RuntimeError("the listener broke")

    h.watch(c.id, listener)
    first = await c.append("user", "one")
    second = await c.append("user", "two")
    # Check: each failure is told, the commits stay committed, later events still came.
    assert seen.entry_ids() == [first, second]
    errors = seen.signals("handler_error")
    assert len(errors) == 2 and "the listener broke" in errors[0].detail
    assert [e.id for e in (await c.entries()).items] == [first, second]
    assert h.faulted is None
    await h.close()


async def test_an_async_listener_may_await_a_command_after_delivery(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    answered = asyncio.Event()
    replies: list[int] = []
    seen = Seen()

    async def listener(event: WatchEvent) -> None:
        seen(event)
        if isinstance(event, WatchCommit) and not replies:
            replies.append(await c.append("assistant", "reply from the listener"))
            answered.set()

    h.watch(c.id, listener)
    question = await c.append("user", "question")
    await _bounded(answered.wait())  # no deadlock: the coroutine ran after delivery
    await asyncio.sleep(0)  # let the reply's own delivery run
    assert seen.entry_ids() == [question, replies[0]]
    assert seen.signals("handler_error") == []
    await h.close()


async def test_an_async_listener_that_raises_gets_handler_error(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    seen = Seen()
    failed = asyncio.Event()

    async def listener(event: WatchEvent) -> None:
        seen(event)
        if isinstance(event, WatchSignal):
            failed.set()
        elif isinstance(event, WatchCommit):
            raise RuntimeError("async listener broke")

    h.watch(c.id, listener)
    entry = await c.append("user", "one")
    await _bounded(failed.wait())
    assert "async listener broke" in seen.signals("handler_error")[0].detail
    assert (await h.entry(entry)) is not None
    await h.close()


# ------------------------------------------------------------------ 7. bounded buffering


async def test_a_stream_that_is_not_read_is_told_to_rebind_and_ends(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    stream = h.watch(c.id, buffer=3)
    assert isinstance(stream, WatchStream)
    ids = [await c.append("user", f"m{i}") for i in range(5)]
    got: list[WatchEvent] = []

    async def read_all() -> None:
        async for event in stream:
            got.append(event)

    await _bounded(read_all())  # ends by itself
    assert isinstance(got[0], WatchBase)
    assert [type(e) for e in got[1:]] == [WatchCommit, WatchCommit, WatchSignal]
    signal = got[-1]
    assert isinstance(signal, WatchSignal) and signal.kind == "rebind"
    # Check: watching again gives a fresh base holding everything.
    fresh = Seen()
    h.watch(c.id, fresh)
    assert [e.id for e in fresh.base.entries] == ids
    await h.close()


async def test_a_stream_that_is_read_gets_every_commit(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    got: list[WatchEvent] = []
    async with h.watch(c.id, buffer=2) as stream:
        reading = asyncio.ensure_future(_collect(stream, got, commits=3))
        ids = []
        for i in range(3):
            ids.append(await c.append("user", f"m{i}"))
            await asyncio.sleep(0)  # the reader takes each event
            await asyncio.sleep(0)
        await _bounded(reading)
    commits = [e for e in got if isinstance(e, WatchCommit)]
    assert [int(m.first_seq) for m in commits] == ids
    await h.close()


async def _collect(stream: WatchStream, got: list[WatchEvent], *, commits: int) -> None:
    async for event in stream:
        got.append(event)
        if sum(isinstance(e, WatchCommit) for e in got) == commits:
            return


async def test_a_slow_async_listener_is_told_to_rebind_and_gets_nothing_more(
    backend: Backend,
) -> None:
    h = await backend.open()
    c = await h.root()
    gate = asyncio.Event()
    seen = Seen()

    async def slow(event: WatchEvent) -> None:
        seen(event)
        await gate.wait()

    h.watch(c.id, slow, buffer=2)
    for i in range(4):
        await c.append("user", f"m{i}")
    gate.set()
    await asyncio.sleep(0)
    kinds = [type(e).__name__ for e in seen.events]
    assert kinds == ["WatchBase", "WatchCommit", "WatchSignal"]
    assert seen.signals("rebind")
    await c.append("user", "after the rebind")
    assert len(seen.events) == 3  # a retired binding delivers nothing more
    await h.close()


async def test_an_unsubscribed_binding_delivers_nothing_more(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    seen = Seen()
    unsubscribe = h.watch(c.id, seen)
    first = await c.append("user", "one")
    unsubscribe()
    unsubscribe()  # twice is harmless
    await c.append("user", "two")
    assert seen.entry_ids() == [first]
    stream = h.watch(c.id)
    stream.close()
    await c.append("user", "three")
    assert [type(e) for e in [e async for e in stream]] == [WatchBase]
    await h.close()


# ------------------------------------------------------------------ 8. fault


async def test_a_handle_that_faults_delivers_a_fault_signal(backend: Backend) -> None:
    storage = FaultyStorage(
        open_storage(backend.url, session=backend.session, durability=None, read_only=False)
    )
    h = await pico.Harness.open(storage)
    c = await h.root()
    seen = Seen()
    h.watch(c.id, seen)
    stream = h.watch(c.id)
    kept = await c.append("user", "kept")
    storage.fail = "before"
    with pytest.raises(pico.PersistenceUncertainError):
        await c.append("user", "lost")
    assert seen.entry_ids() == [kept]
    assert [s.kind for s in seen.signals()] == ["fault"]
    assert "uncertain persistence" in seen.signals()[0].detail
    streamed = [e async for e in stream]  # the stream ends with the fault
    assert isinstance(streamed[-1], WatchSignal) and streamed[-1].kind == "fault"
    with pytest.raises(pico.HandleFaultedError):
        h.watch(c.id, seen)
    await h.close()


# ------------------------------------------------------------------ 9. another process

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    import pico

    async def main() -> None:
        url, session, cid = sys.argv[1], sys.argv[2], int(sys.argv[3])
        h = await pico.Harness.open(url, session=session, read_only=True)
        stop = asyncio.Event()

        def listener(event):
            data = event.to_json()
            print(json.dumps(data), flush=True)
            if data["type"] == "commit" and any(
                ch["event"] == "Conversation.EntryAppended"
                and ch["payload"]["content"] == "stop"
                for ch in data["changes"]
            ):
                stop.set()

        h.watch(cid, listener)
        await asyncio.wait_for(stop.wait(), timeout=30)
        await h.close()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    "name",
    [
        "sqlite",
        "postgresql",
        "jsonl",
    ],
)
async def test_a_read_only_handle_in_another_process_follows_the_owner_gaplessly(
    name: str, tmp_path: Path
) -> None:
    if name == "postgresql":
        require_postgres("cross-process watch")
    backend = make_backend(name, tmp_path)
    h = await backend.open()
    c = await h.root()
    before = [await c.append("user", f"before {i}") for i in range(3)]
    child = spawn_child(_CHILD, backend.url, backend.session, str(c.id))
    try:
        assert child.stdout is not None
        loop = asyncio.get_running_loop()

        async def line() -> dict[str, Any]:
            text = await asyncio.wait_for(
                loop.run_in_executor(None, child.stdout.readline),  # type: ignore[union-attr]
                timeout=TIMEOUT,
            )
            assert text, "the watching child exited early"
            value: dict[str, Any] = json.loads(text)
            return value

        base = await line()
        assert base["type"] == "base"
        assert [e["id"] for e in base["entries"]] == before
        # Commits of one and several mutations, and one of another conversation only.
        other: int = await h.command(lambda tx: tx.create_conversation())
        during = [await c.append("user", f"during {i}") for i in range(5)]

        def pair(tx: pico.Command) -> None:
            tx.append_entry(c.id, "user", "pair a")
            tx.append_entry(c.id, "user", "pair b")

        await h.command(pair)
        elsewhere = await h.command(_append(other, "elsewhere"))
        await c.append("user", "stop")
        delivered: list[dict[str, Any]] = []
        while not delivered or not any(
            ch["event"] == "Conversation.EntryAppended" and ch["payload"]["content"] == "stop"
            for ch in delivered[-1]["changes"]
        ):
            event = await line()
            assert event["type"] == "commit", event
            delivered.append(event)
        # Check: exactly the owner's batches touching the conversation, in order, once.
        expected = [
            (f, last, at)
            for f, last, at in _main_batches(h, base["position"])
            if f not in (other, elsewhere)
        ]
        got = [(e["first_seq"], e["last_seq"], e["position"]) for e in delivered]
        assert got == expected
        assert len(got) == len(during) + 2
        entry_ids = [
            ch["payload"]["seq"]
            for e in delivered
            for ch in e["changes"]
            if ch["event"] == "Conversation.EntryAppended"
        ]
        all_ids = [e.id for e in (await c.entries(limit=100)).items]
        assert entry_ids == all_ids[len(before) :]
        assert child.wait(timeout=TIMEOUT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        await h.close()


# ------------------------------------------------------------------ 10. bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"conversation_id": 0}, pico.InvalidArgumentError, "conversation_id"),
        ({"conversation_id": "1"}, pico.InvalidArgumentError, "conversation_id"),
        ({"conversation_id": True}, pico.InvalidArgumentError, "conversation_id"),
        ({"conversation_id": 999}, pico.UnknownConversationError, "999"),
        ({"limit": 0}, pico.InvalidArgumentError, "limit"),
        ({"limit": 1001}, pico.InvalidArgumentError, "limit"),
        ({"limit": True}, pico.InvalidArgumentError, "limit"),
        ({"buffer": 0}, pico.InvalidArgumentError, "buffer"),
        ({"buffer": 1.5}, pico.InvalidArgumentError, "buffer"),
        ({"listener": 42}, pico.InvalidArgumentError, "listener"),
        ({"previews": [1]}, pico.InvalidArgumentError, "previews"),
        ({"previews": [""]}, pico.InvalidArgumentError, "previews"),
        ({"previews": "pico.frames"}, pico.InvalidArgumentError, "previews"),
        ({"previews": 5}, pico.InvalidArgumentError, "previews"),
    ],
)
@pytest.mark.parametrize("form", ["listener", "stream"])
async def test_bad_input_is_a_typed_error_and_registers_nothing(
    backend: Backend, kwargs: dict[str, Any], error: type[Exception], words: str, form: str
) -> None:
    h = await backend.open()
    c = await h.root()
    seen = Seen()
    args: dict[str, Any] = {"conversation_id": c.id, "listener": seen}
    if form == "stream" and "listener" not in kwargs:
        args.pop("listener")
    args.update(kwargs)
    with pytest.raises(error) as raised:
        h.watch(**args)
    assert isinstance(raised.value, pico.PicoError)
    assert words in str(raised.value)
    # Check: nothing registered, nothing delivered later.
    assert h.watches.bindings == []
    await c.append("user", "later")
    assert seen.events == []
    await h.close()


async def test_watch_on_a_closed_handle_is_refused(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await h.close()
    with pytest.raises(pico.ClosedError):
        h.watch(c.id, Seen())


async def test_a_second_read_only_watch_while_the_poll_lags_gets_each_commit_once(
    stored_backend: Backend,
) -> None:
    """A read-only hub's cursor lags the storage until its poll runs: a watch registered in
    between has the new commit in its base and must not be delivered it again, while the
    first watcher still gets it."""
    h = await stored_backend.open()
    c = await h.root()
    reader = await stored_backend.open(read_only=True)
    reader.watches.poll_interval = 3600.0  # the test runs the catch-up itself
    first, second = Seen(), Seen()
    reader.watch(c.id, first)
    x = await c.append("user", "x")
    reader.watch(c.id, second)  # before any poll: the base already has x
    assert [e.id for e in second.base.entries] == [x]
    reader.watches.durable()  # the lagging catch-up
    assert first.entry_ids() == [x]
    assert second.entry_ids() == []  # not delivered a second time
    y = await c.append("user", "y")
    reader.watches.durable()
    assert first.entry_ids() == [x, y] and second.entry_ids() == [y]
    await reader.close()
    await h.close()
