"""A read-only JSONL handle follows another writer's appends (seed 003 §9.4, §10.2 "Watch
registration races a commit"): the writer in this process or in another, the reader's
``watch`` and reads seeing each new batch whole, a torn tail only once it is complete,
only the appended bytes read, and a journal cut under the reader refused."""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.application.watch import WatchEvent, WatchSignal
from tests.contract.test_watch import Seen as WatchRecorder
from tests.processes import spawn_child

TIMEOUT = 10.0
SESSION = "main"


class Seen(WatchRecorder):
    """The watch contract's recording listener; ``until`` waits for a condition on it."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def __call__(self, event: WatchEvent) -> None:
        super().__call__(event)
        self._changed.set()

    async def until(self, done: Callable[[Seen], bool]) -> None:
        async def wait() -> None:
            while not done(self):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout=TIMEOUT)


def _url(tmp_path: Path) -> str:
    return f"jsonl:///{tmp_path / 'store'}"


def _journal(tmp_path: Path) -> Path:
    return tmp_path / "store" / f"{SESSION}.jsonl"


def _store(h: pico.Harness) -> Any:
    """The reader's JSONL store (its cursor and byte count)."""
    return h._line.storage.recorder.store  # type: ignore[attr-defined]


def _main_batches(h: pico.Harness, after: int) -> list[tuple[int, int, int]]:
    """(first, last, boundary position) of every stored main batch after ``after``."""
    out: list[tuple[int, int, int]] = []
    for record in h.audit(after=after, limit=1000):
        if record.event == "Session.Committed" and record.payload.get("scope") == "main":
            first, last = record.payload["first"], record.payload["last"]
            assert isinstance(first, int) and isinstance(last, int)
            out.append((first, last, record.position))
    return out


async def _ids(h: pico.Harness, conversation_id: int) -> list[int]:
    return [e.id for e in (await h.entries(conversation_id, limit=1000)).items]


# ------------------------------------------------------------------ same process


async def test_a_read_only_handle_follows_a_writer_in_this_process_whole_and_in_order(
    tmp_path: Path,
) -> None:
    url = _url(tmp_path)
    writer = await pico.Harness.open(url, session=SESSION)
    c = await writer.root()
    before = [await c.append("user", f"before {i}") for i in range(2)]
    reader = await pico.Harness.open(url, session=SESSION, read_only=True)
    try:
        seen = Seen()
        reader.watch(c.id, seen)
        assert [e.id for e in seen.base.entries] == before
        during = [await c.append("user", f"during {i}") for i in range(4)]

        def pair(tx: pico.Command) -> list[int]:
            return [tx.append_entry(c.id, "user", "pair a"), tx.append_entry(c.id, "user", "b")]

        paired: list[int] = await writer.command(pair)
        expected = _main_batches(writer, seen.base.position)
        await seen.until(lambda s: len(s.commits()) == len(expected))
        # Check: each of the writer's batches once, whole (the pair in one commit), in order.
        got = [(m.first_seq, m.last_seq, m.position) for m in seen.commits()]
        assert got == expected
        assert [len(m.changes) for m in seen.commits()][-1] >= 2
        assert seen.entry_ids() == during + paired
        # Check: the reader's reads show the same entries (and the same head).
        assert await _ids(reader, c.id) == before + during + paired
        assert reader.main_head() == writer.main_head()
        assert not [e for e in seen.events if isinstance(e, WatchSignal)]
    finally:
        await reader.close()
        await writer.close()


async def test_the_reader_sees_the_writers_new_tasks_and_conversations(tmp_path: Path) -> None:
    url = _url(tmp_path)
    provider = pico.FauxProvider(["hi"])
    writer = await pico.Harness.open(url, session=SESSION, provider=provider)
    c = await writer.root()
    reader = await pico.Harness.open(url, session=SESSION, read_only=True)
    try:
        assert not (await reader.tasks()).items
        input_id = await c.accept("hello")  # the input and its generation task, one commit
        other: int = await writer.command(lambda tx: tx.create_conversation())
        # Check: task, entry and conversation reads refresh too.
        [task] = (await writer.tasks(limit=1)).items
        seen = await reader.task(task.id)
        assert seen is not None and seen.conversation_id == c.id
        assert (await reader.entry(input_id)) == (await writer.entry(input_id))
        assert await reader.conversation(other) is not None
    finally:
        await reader.close()
        await writer.close()


async def test_the_reader_follows_a_turn_whose_frames_went_to_a_sidecar(tmp_path: Path) -> None:
    url = _url(tmp_path)
    provider = pico.FauxProvider(["a streamed answer"], chunk_chars=3)
    writer = await pico.Harness.open(url, session=SESSION, provider=provider)
    c = await writer.root()
    reader = await pico.Harness.open(url, session=SESSION, read_only=True)
    try:
        seen = Seen()
        reader.watch(c.id, seen)
        _, result = await c.prompt("hello")
        assert result is not None and result.entry_id is not None
        # Check: the working batches (and their retirement) replay on the reader as well.
        answer = await reader.entry(result.entry_id)
        assert answer is not None and answer == await writer.entry(result.entry_id)
        assert await _ids(reader, c.id) == await _ids(writer, c.id)
        await seen.until(lambda s: result.entry_id in s.entry_ids())
    finally:
        await reader.close()
        await writer.close()


async def test_a_refresh_never_runs_inside_a_read_snapshot(tmp_path: Path) -> None:
    url = _url(tmp_path)
    writer = await pico.Harness.open(url, session=SESSION)
    c = await writer.root()
    first = await c.append("user", "first")
    reader = await pico.Harness.open(url, session=SESSION, read_only=True)
    try:
        storage: Any = reader._line.storage
        with storage.snapshot():
            head = reader.main_head()
            position = storage.last_position()
            second = await c.append("user", "second")  # committed while the snapshot is open
            # Check: inside the snapshot every read answers from the state it began with.
            assert reader.main_head() == head
            assert storage.last_position() == position
            assert await _ids(reader, c.id) == [first]
            assert storage.audit(after=position) == []
        # Check: the next read outside it sees the new batch.
        assert await _ids(reader, c.id) == [first, second]
        assert storage.last_position() > position
    finally:
        await reader.close()
        await writer.close()


# ------------------------------------------------------------------ another process

_WRITER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    import pico

    async def main() -> None:
        url, session, go = sys.argv[1], sys.argv[2], sys.argv[3]
        h = await pico.Harness.open(url, session=session)
        c = await h.root()
        ids = [await c.append("user", f"before {i}") for i in range(2)]
        print(json.dumps({"conversation": c.id, "before": ids}), flush=True)
        while not os.path.exists(go):  # the reader's barrier: it watches, then says go
            time.sleep(0.01)
        during = [await c.append("user", f"during {i}") for i in range(5)]

        def pair(tx):
            return [tx.append_entry(c.id, "user", "pair a"), tx.append_entry(c.id, "user", "b")]

        during += await h.command(pair)
        print(json.dumps({"during": during}), flush=True)
        await h.close()

    asyncio.run(main())
    """
)


async def test_a_read_only_handle_follows_a_writer_in_another_process_gaplessly(
    tmp_path: Path,
) -> None:
    import json

    url = _url(tmp_path)
    go = tmp_path / "go"
    child = spawn_child(_WRITER, url, SESSION, str(go))
    loop = asyncio.get_running_loop()

    async def line() -> dict[str, Any]:
        assert child.stdout is not None
        text = await asyncio.wait_for(
            loop.run_in_executor(None, child.stdout.readline), timeout=TIMEOUT
        )
        assert text, "the writing child exited early"
        value: dict[str, Any] = json.loads(text)
        return value

    reader: pico.Harness | None = None
    try:
        ready = await line()
        cid, before = ready["conversation"], ready["before"]
        reader = await pico.Harness.open(url, session=SESSION, read_only=True)
        seen = Seen()
        reader.watch(cid, seen)
        assert [e.id for e in seen.base.entries] == before
        go.touch()
        during = (await line())["during"]
        assert child.wait(timeout=TIMEOUT) == 0
        await seen.until(lambda s: len(s.entry_ids()) >= len(during))
        # Check: the child's batches, each once and whole, in order, none missing.
        expected = _main_batches(reader, seen.base.position)
        assert [(m.first_seq, m.last_seq, m.position) for m in seen.commits()] == expected
        assert len(expected) == len(during) - 1  # the pair is one batch
        assert seen.entry_ids() == during
        assert await _ids(reader, cid) == before + during
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if reader is not None:
            await reader.close()


# ------------------------------------------------------------------ the bytes of the file


async def _withheld_last_batch(tmp_path: Path) -> tuple[int, list[int], bytes]:
    """A session whose journal lacks its last batch's line (returned, with the conversation
    and the entries the journal keeps): the writer is closed, the line is ours to write."""
    writer = await pico.Harness.open(_url(tmp_path), session=SESSION)
    c = await writer.root()
    kept = [await c.append("user", "kept")]
    await c.append("user", "withheld")
    await writer.close()
    path = _journal(tmp_path)
    data = path.read_bytes()
    cut = data.rindex(b"\n", 0, len(data) - 1) + 1
    os.truncate(path, cut)
    return c.id, kept, data[cut:]


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


async def test_a_torn_tail_is_delivered_only_once_it_is_complete(tmp_path: Path) -> None:
    cid, kept, line = await _withheld_last_batch(tmp_path)
    path = _journal(tmp_path)
    reader = await pico.Harness.open(_url(tmp_path), session=SESSION, read_only=True)
    try:
        store = _store(reader)
        storage: Any = reader._line.storage
        seen = Seen()
        reader.watch(cid, seen)
        position = storage.last_position()
        _append(path, line[: len(line) // 2])  # the writer is mid-append
        # Check: half a line is not a batch: nothing applied, nothing consumed.
        assert store.refresh() == 0
        assert storage.last_position() == position
        assert await _ids(reader, cid) == kept
        consumed = store._cursor.main_length
        _append(path, line[len(line) // 2 :])
        assert await _ids(reader, cid) != kept  # the completed line is read from `consumed`
        assert store._cursor.main_length == consumed + len(line) == path.stat().st_size
        await seen.until(lambda s: len(s.commits()) == 1)
        # Check: delivered once, whole: the batch the writer committed.
        [(first, last, at)] = _main_batches(reader, position)
        commit = seen.commits()[0]
        assert (commit.first_seq, commit.last_seq, commit.position) == (first, last, at)
        assert len(seen.entry_ids()) == 1
        assert await _ids(reader, cid) == [*kept, *seen.entry_ids()]
    finally:
        await reader.close()


async def test_a_refresh_reads_only_the_appended_bytes_and_nothing_without_a_change(
    tmp_path: Path,
) -> None:
    url = _url(tmp_path)
    writer = await pico.Harness.open(url, session=SESSION)
    c = await writer.root()
    await c.append("user", "first")
    path = _journal(tmp_path)
    reader = await pico.Harness.open(url, session=SESSION, read_only=True)
    try:
        journal = _store(reader).journal
        read = journal.bytes_read
        assert read == path.stat().st_size  # the open read the file once
        # Check: reads with nothing new cost a stat, no read.
        for _ in range(3):
            await _ids(reader, c.id)
            reader.audit(after=0, limit=10)
        assert journal.bytes_read == read
        size = path.stat().st_size
        await c.append("user", "second")
        grown = path.stat().st_size - size
        assert len(await _ids(reader, c.id)) == 2
        # Check: the new line and the one byte before it (the line boundary), no more.
        assert journal.bytes_read - read == grown + 1
    finally:
        await reader.close()
        await writer.close()


@pytest.mark.parametrize("damage", ["truncated", "replaced", "rewritten"])
async def test_a_journal_cut_under_the_reader_is_storage_corruption(
    tmp_path: Path, damage: str
) -> None:
    cid, _kept, line = await _withheld_last_batch(tmp_path)
    path = _journal(tmp_path)
    _append(path, line)
    reader = await pico.Harness.open(_url(tmp_path), session=SESSION, read_only=True)
    try:
        seen = Seen()
        reader.watch(cid, seen)
        size = path.stat().st_size
        if damage == "truncated":
            os.truncate(path, size - len(line))
        elif damage == "replaced":  # another file under the same name, the same bytes
            shutil.copy(path, tmp_path / "copy")
            _append(tmp_path / "copy", line)
            os.replace(tmp_path / "copy", path)
        else:  # the last line cut and a longer one written in place of it
            os.truncate(path, size - len(line))
            _append(path, b" " + line + line)
        with pytest.raises(pico.StorageCorruptError, match=str(path)):
            await reader.entries(cid)
        # Check: the watcher is told, once, and the reader's state did not move.
        await seen.until(lambda s: any(isinstance(e, WatchSignal) for e in s.events))
        [signal] = [e for e in seen.events if isinstance(e, WatchSignal)]
        assert signal.kind == "fault" and str(path) in signal.detail
        assert seen.commits() == []
    finally:
        await reader.close()


async def test_a_batch_that_does_not_parse_applies_none_of_the_new_batches(
    tmp_path: Path,
) -> None:
    cid, kept, line = await _withheld_last_batch(tmp_path)
    path = _journal(tmp_path)
    reader = await pico.Harness.open(_url(tmp_path), session=SESSION, read_only=True)
    try:
        storage: Any = reader._line.storage
        position = storage.last_position()
        broken = b'{"seq": [99, 99], "scope": "main", "events": "broken"}\n'
        _append(path, line + broken)
        with pytest.raises(pico.StorageCorruptError, match="not a batch record"):
            await reader.entries(cid)
        # Check: the good batch before the broken one was not applied either.
        assert _store(reader)._cursor.main_length == path.stat().st_size - len(line + broken)
        with pytest.raises(pico.StorageCorruptError):
            storage.last_position()
        os.truncate(path, path.stat().st_size - len(broken))  # the damaged line moved away
        assert await _ids(reader, cid) != kept
        assert storage.last_position() > position
    finally:
        await reader.close()
