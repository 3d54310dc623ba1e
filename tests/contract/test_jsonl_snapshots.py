"""JSONL snapshots (``S+snapshots.jsonl``): an optimisation that is never authoritative.
A reopen restores the newest snapshot per aggregate, so it replays the tail of a stream,
not all of it; an unreadable snapshot, or one ahead of a journal a crash cut back, is
dropped and that aggregate replays more events; the file is compacted on a writer's open."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.infrastructure.storage import SNAPSHOT_INTERVAL
from tests.digest import state_digest


def _url(tmp_path: Path) -> str:
    return f"jsonl:///{tmp_path / 'store'}"


def _files(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "store" / "main.jsonl", tmp_path / "store" / "main+snapshots.jsonl"


async def _build(tmp_path: Path, commands: int) -> tuple[Any, int]:
    h = await pico.Harness.open(_url(tmp_path))
    c = await h.root()
    for i in range(commands):
        await c.append("user", f"message {i}")
    digest = await state_digest(h)
    head = h.head()
    await h.close()
    return digest, head


def _replayed(monkeypatch: Any) -> list[int]:
    """Count the events each aggregate reload reads after its snapshot."""
    from eventsourcing.persistence import EventStore

    counts: list[int] = []
    original = EventStore.get

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        events = list(original(self, *args, **kwargs))
        counts.append(len(events))
        return iter(events)

    monkeypatch.setattr(EventStore, "get", counting)
    return counts


async def test_a_reopen_starts_from_the_newest_snapshots(tmp_path: Path, monkeypatch: Any) -> None:
    digest, head = await _build(tmp_path, SNAPSHOT_INTERVAL * 3)
    _, snapshots = _files(tmp_path)
    assert snapshots.exists() and snapshots.read_bytes().endswith(b"\n")
    counts = _replayed(monkeypatch)
    h = await pico.Harness.open(_url(tmp_path))
    # Every reload replayed less than one snapshot interval (the Session stream alone has
    # 600+ events, the root conversation 1,200+).
    assert counts and max(counts) < SNAPSHOT_INTERVAL * 2, counts
    assert h.head() == head and await state_digest(h) == digest
    await h.close()


async def test_an_unreadable_snapshot_file_is_left_alone_and_the_streams_replay(
    tmp_path: Path,
) -> None:
    digest, head = await _build(tmp_path, SNAPSHOT_INTERVAL * 2)
    _, snapshots = _files(tmp_path)
    damaged = b"{not json\n" + snapshots.read_bytes()
    snapshots.write_bytes(damaged)
    h = await pico.Harness.open(_url(tmp_path))
    assert h.head() == head and await state_digest(h) == digest
    c = await h.root()
    for i in range(SNAPSHOT_INTERVAL):  # would snapshot: not into a file it could not read
        await c.append("user", f"more {i}")
    await h.close()
    assert snapshots.read_bytes() == damaged


async def test_a_snapshot_ahead_of_a_cut_back_journal_is_not_used(tmp_path: Path) -> None:
    """Process durability and a power loss can keep a snapshot whose batch the journal
    lost: the snapshot is ahead of its stream and must not be restored."""
    await _build(tmp_path, SNAPSHOT_INTERVAL)
    main, snapshots = _files(tmp_path)
    kept = main.read_bytes()
    h = await pico.Harness.open(_url(tmp_path))
    c = await h.root()
    for i in range(SNAPSHOT_INTERVAL):
        await c.append("user", f"later {i}")
    await h.close()
    assert len(snapshots.read_bytes().splitlines()) > 2
    main.write_bytes(kept)  # the later batches are gone, their snapshots are not
    h = await pico.Harness.open(_url(tmp_path))
    c = await h.root()
    texts = [e.content for e in (await c.entries(limit=1000)).items]
    assert texts[-1] == f"message {SNAPSHOT_INTERVAL - 1}"  # the journal's state, exactly
    assert await c.append("user", "after the cut") > 0  # and it writes on from there
    await h.close()


async def test_the_snapshot_file_is_compacted_on_a_writers_open(tmp_path: Path) -> None:
    await _build(tmp_path, SNAPSHOT_INTERVAL * 12)
    _, snapshots = _files(tmp_path)
    before = len(snapshots.read_bytes().splitlines())
    reader = await pico.Harness.open(_url(tmp_path), read_only=True)
    await reader.close()
    assert len(snapshots.read_bytes().splitlines()) == before  # a reader writes nothing
    h = await pico.Harness.open(_url(tmp_path))
    await h.close()
    after = snapshots.read_bytes().splitlines()
    ids = {json.loads(line)[0] for line in after}
    assert len(after) == len(ids) < before  # the newest snapshot per aggregate only


async def test_a_long_replay_leaves_a_snapshot_for_the_next_open(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A journal with no snapshots (written before they existed, or with its snapshot file
    lost) replays whole once; that open snapshots what it replayed, so the next open
    replays a short tail."""
    digest, _ = await _build(tmp_path, SNAPSHOT_INTERVAL * 3)
    _, snapshots = _files(tmp_path)
    snapshots.unlink()
    counts = _replayed(monkeypatch)
    h = await pico.Harness.open(_url(tmp_path))
    await h.close()
    assert max(counts) > SNAPSHOT_INTERVAL * 2  # the whole stream, once
    counts.clear()
    h = await pico.Harness.open(_url(tmp_path))
    assert max(counts) < SNAPSHOT_INTERVAL, counts
    assert await state_digest(h) == digest
    await h.close()


async def _lose_a_snapshotted_tail(tmp_path: Path) -> None:
    """A journal whose root conversation was snapshotted, then its last lines lost (a
    crash in process durability): the snapshot file is ahead of it."""
    await _build(tmp_path, SNAPSHOT_INTERVAL // 2)  # the root reaches its first snapshot
    main, _ = _files(tmp_path)
    lines = main.read_bytes().splitlines(keepends=True)
    main.write_bytes(b"".join(lines[:-12]))  # the lost tail


async def _grow_past_it_and_compare(tmp_path: Path, h: pico.Harness) -> None:
    """Grow the root past the lost version on ``h`` (a writer just opened), close it; a
    reopen restores the root exactly as a replay without snapshots gives it."""
    from pico.domain.ids import conversation_uuid

    c = await h.root()
    await c.command(lambda tx: tx.append_entry("user", "unselected"))  # shift the parity
    for i in range(12):
        await c.append("user", f"new {i}")
    cid = c.id
    await h.close()
    h = await pico.Harness.open(_url(tmp_path))
    restored = h._line.storage.load(conversation_uuid("main", cid))
    await h.close()
    _files(tmp_path)[1].unlink(missing_ok=True)
    reader = await pico.Harness.open(_url(tmp_path), read_only=True)
    replayed = reader._line.storage.load(conversation_uuid("main", cid))
    await reader.close()
    assert restored is not None and replayed is not None
    assert vars(restored) == vars(replayed)


async def test_a_snapshot_of_a_lost_history_is_never_restored_later(tmp_path: Path) -> None:
    """The journal loses its tail but the snapshot file keeps a snapshot of it; the new
    history then grows past that version. The writer's open removed the stale snapshot
    before appending, so every later open restores exactly what a replay gives."""
    await _lose_a_snapshotted_tail(tmp_path)
    h = await pico.Harness.open(_url(tmp_path))
    await _grow_past_it_and_compare(tmp_path, h)


async def test_a_session_named_like_another_sessions_snapshot_file_is_untouched(
    tmp_path: Path,
) -> None:
    url = _url(tmp_path)
    other = await pico.Harness.open(url, session="a.snapshots")
    for i in range(40):
        await (await other.root()).append("user", f"entry {i}")
    digest = await state_digest(other)
    await other.close()
    a = await pico.Harness.open(url, session="a")
    for i in range(SNAPSHOT_INTERVAL):
        await (await a.root()).append("user", f"a {i}")
    await a.close()
    again = await pico.Harness.open(url, session="a.snapshots")
    assert await state_digest(again) == digest
    await again.close()


@pytest.mark.parametrize(
    "line",
    [
        b'["00000000-0000-0000-0000-000000000001",1e400,"t","{}"]',  # a version past int
        b"[" * 100_000 + b"]" * 100_000,  # nesting past the parser's recursion
        b'["00000000-0000-0000-0000-000000000001",1,"t","{not json"]',  # a body not JSON
        b'["00000000-0000-0000-0000-000000000001",1,"t",{"an":"object"}]',  # not a text
    ],
    ids=["huge-version", "deep-nesting", "body-not-json", "body-an-object"],
)
async def test_a_damaged_snapshot_line_costs_the_open_its_snapshots_only(
    tmp_path: Path, line: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The snapshot file is never authoritative: whatever a line holds, the session opens
    from its journal (the aggregates replay more) and says why in a warning."""
    digest, _ = await _build(tmp_path, SNAPSHOT_INTERVAL * 2)
    _, snapshots = _files(tmp_path)
    snapshots.write_bytes(line + b"\n" + snapshots.read_bytes())
    for read_only in (True, False):
        caplog.clear()
        h = await pico.Harness.open(_url(tmp_path), read_only=read_only)
        assert await state_digest(h) == digest
        await h.close()
        assert any("is not a snapshot" in r.getMessage() for r in caplog.records)


async def test_a_snapshot_append_cut_short_leaves_the_file_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk stops a snapshot line half-way: the part is cut off again, so the file
    still reads as snapshots at the next open (a part left there, the next lines appended
    after it, would have made every later open give the whole file up)."""
    real_write = os.write
    cut = {"armed": False, "done": False}

    def writing(fd: int, data: Any) -> int:
        # The snapshot file's first append after arming, half of it; nothing else.
        if (
            cut["armed"]
            and not cut["done"]
            and os.readlink(f"/proc/self/fd/{fd}").endswith("+snapshots.jsonl")
        ):
            cut["done"] = True
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", writing)
    h = await pico.Harness.open(_url(tmp_path))
    c = await h.root()
    cut["armed"] = True
    for i in range(SNAPSHOT_INTERVAL * 2):
        await c.append("user", f"message {i}")
    digest = await state_digest(h)
    await h.close()
    assert cut["done"]  # a snapshot append failed half-way
    monkeypatch.setattr(os, "write", real_write)
    _, snapshots = _files(tmp_path)
    lines = snapshots.read_bytes().splitlines()
    assert lines and all(isinstance(json.loads(line), list) for line in lines)
    caplog.clear()
    h = await pico.Harness.open(_url(tmp_path))
    assert await state_digest(h) == digest
    await h.close()
    assert not any("is not a snapshot" in r.getMessage() for r in caplog.records)


async def test_a_stale_snapshot_that_cannot_be_rewritten_away_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot ahead of a journal a crash cut back must go before the stream grows past
    it. When the file cannot be rewritten (the rename refused), it is removed (it is only
    a cache), so no later open restores the stale snapshot as current."""
    await _lose_a_snapshotted_tail(tmp_path)
    real_replace = os.replace

    def refusing(src: Any, dst: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(os, "replace", refusing)
    h = await pico.Harness.open(_url(tmp_path))
    monkeypatch.setattr(os, "replace", real_replace)
    assert not _files(tmp_path)[1].exists()  # removed: it held a snapshot of the lost history
    await _grow_past_it_and_compare(tmp_path, h)
