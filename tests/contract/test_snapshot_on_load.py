"""A load that replays a long stream (a store written before snapshots, or whose snapshots
were lost) leaves a snapshot, so the next load replays a short tail. Inside a command that
snapshot waits for the command's save: written in the middle of the command it would end
the command's read snapshot (SQLite reads on the writer's connection, which a write must
begin a transaction on) or commit under a claim's lock; it is written after the batch, as
a due snapshot is."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import pico
from pico import Command
from pico.domain.ids import conversation_uuid
from pico.infrastructure import storage
from tests.backends import Backend

NOTE = pico.conversation_value("load.note", int)
PROBE = pico.session_value("load.probe", int)


async def _history_without_snapshots(backend: Backend, monkeypatch: Any) -> int:
    """A conversation of 30 commands, written while no snapshot was ever due."""
    monkeypatch.setattr(storage, "SNAPSHOT_INTERVAL", 10_000)
    h = await backend.open()
    cid = await h.command(lambda tx: tx.create_conversation())
    for i in range(30):

        def note(tx: Command, i: int = i) -> None:
            tx.set_value(NOTE, i, conversation_id=cid)

        await h.command(note)
    await h.close()
    return int(cid)


async def _note(h: pico.Harness, cid: int) -> int | None:
    c = await h.conversation(cid)
    assert c is not None
    return await c.get_value(NOTE)


async def test_a_long_replay_inside_a_command_is_snapshotted_after_its_save(
    backend: Backend, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cid = await _history_without_snapshots(backend, monkeypatch)
    monkeypatch.setattr(storage, "SNAPSHOT_INTERVAL", 10)  # that history is now long
    h = await backend.open()
    stream = conversation_uuid(backend.session, cid)
    snapshots = h._line.storage.snapshots  # type: ignore[attr-defined]
    assert list(snapshots.get(stream)) == []  # the open did not load the conversation
    writer: Any = getattr(h._line.storage.recorder, "writer", None)  # type: ignore[attr-defined]
    seen: dict[str, Any] = {}

    def build(tx: Command) -> None:
        tx.get_value(PROBE)  # a read: the command's read snapshot begins
        if backend.name == "sqlite":  # it reads on the writer's connection
            seen["before"] = writer.connection().in_transaction
        tx.set_value(NOTE, 99, conversation_id=cid)  # loads the conversation: 31 events
        if backend.name == "sqlite":
            seen["after"] = writer.connection().in_transaction
        seen["read"] = tx.get_value(NOTE, conversation_id=cid)

    with caplog.at_level(logging.WARNING, logger="pico.storage"):
        await h.command(build)
    assert not [r for r in caplog.records if "snapshot" in r.getMessage()]
    if backend.name == "sqlite":  # one read snapshot for the whole command
        assert seen["before"] is True and seen["after"] is True
    assert seen["read"] == 29  # the command reads what was committed before it
    # Snapshotted: at the load where no transaction was open (memory, JSONL), after the
    # batch where one was (SQLite), then holding the command's own change too.
    (newest,) = list(snapshots.get(stream, desc=True, limit=1))
    assert newest.originator_version >= 31
    assert await _note(h, cid) == 99
    await h.close()


async def test_a_command_that_fails_after_a_long_replay_snapshots_nothing(
    backend: Backend, monkeypatch: Any
) -> None:
    """The aggregate a failed command loaded holds that command's unsaved event: no
    snapshot is taken of it, then or at a later save that does not save it."""
    cid = await _history_without_snapshots(backend, monkeypatch)
    monkeypatch.setattr(storage, "SNAPSHOT_INTERVAL", 10)
    h = await backend.open()
    stream = conversation_uuid(backend.session, cid)
    snapshots = h._line.storage.snapshots  # type: ignore[attr-defined]

    def build(tx: Command) -> None:
        tx.get_value(PROBE)
        tx.set_value(NOTE, 1234, conversation_id=cid)  # loads and changes the conversation
        raise RuntimeError("the command changes its mind")

    with pytest.raises(RuntimeError, match="changes its mind"):
        await h.command(build)
    await h.set_value(PROBE, 1)  # a later save of the session only
    (stored,) = list(h._line.storage.events.get(stream, desc=True, limit=1))  # type: ignore[attr-defined]
    assert stored.originator_version == 31  # the failed command's event was never stored
    # A snapshot past it would stand for that event: a reload would skip the next one.
    assert all(s.originator_version <= 31 for s in snapshots.get(stream))
    await h.close()
    h = await backend.open(read_only=True)
    assert await _note(h, cid) == 29
    await h.close()
