"""JSONL snapshots (``S+snapshots.jsonl``): an optimisation that is never authoritative.
A reopen restores the newest snapshot per aggregate, so it replays the tail of a stream,
not all of it; an unreadable snapshot, or one ahead of a journal a crash cut back, is
dropped and that aggregate replays more events; the file is compacted on a writer's open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


async def test_a_snapshot_of_a_lost_history_is_never_restored_later(tmp_path: Path) -> None:
    """The journal loses its tail but the snapshot file keeps a snapshot of it; the new
    history then grows past that version. The writer's open removed the stale snapshot
    before appending, so every later open restores exactly what a replay gives."""
    from pico.domain.ids import conversation_uuid

    await _build(tmp_path, SNAPSHOT_INTERVAL // 2)  # the root reaches its first snapshot
    main, snapshots = _files(tmp_path)
    lines = main.read_bytes().splitlines(keepends=True)
    main.write_bytes(b"".join(lines[:-12]))  # the lost tail
    h = await pico.Harness.open(_url(tmp_path))
    c = await h.root()
    await c.command(lambda tx: tx.append_entry("user", "unselected"))  # shift the parity
    for i in range(12):
        await c.append("user", f"new {i}")
    cid = c.id
    await h.close()
    h = await pico.Harness.open(_url(tmp_path))
    restored = h._line.storage.load(conversation_uuid("main", cid))
    await h.close()
    snapshots.unlink()
    reader = await pico.Harness.open(_url(tmp_path), read_only=True)
    replayed = reader._line.storage.load(conversation_uuid("main", cid))
    await reader.close()
    assert restored is not None and replayed is not None
    assert vars(restored) == vars(replayed)


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
