"""A session migrates between backends unchanged (seed 000 "Records and sequence", issue 12):
the same command stream stores byte-identical event bodies on memory, SQLite, PostgreSQL
and JSONL. Event timestamps come from the wall clock, so the stream runs under one fixed
sequence of timestamps (and claim tokens) on every backend; everything else in a body is
the command's."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.domain import DomainEvent

import pico
from pico import FauxProvider, FauxResponse
from tests.backends import BACKENDS, make_backend

VALUE = pico.conversation_value("app.plan", str, rewind=False)


def _clock() -> Callable[[], datetime]:
    """The same timestamps, one microsecond apart, for each backend's run."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ticks = itertools.count()
    return lambda: start + timedelta(microseconds=next(ticks))


def _tokens() -> Callable[[], uuid.UUID]:
    tokens = (uuid.UUID(int=i) for i in itertools.count(1))
    return lambda: next(tokens)


async def _stream(url: str, session: str) -> list[tuple[str, int, str, bytes]]:
    async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
        return "contents"

    provider = FauxProvider(
        [FauxResponse(text="Let me look.", tool_calls=[("read", {})]), "All read, ünïcode ✓."]
    )
    tool = pico.Tool("read", "Read", {"type": "object"}, read)
    h = await pico.Harness.open(url, session=session, provider=provider, tools=[tool])
    c = await h.root()
    await c.set_value(VALUE, "plan ✓")
    await c.prompt('hello, "world"\n')
    fork = await c.fork(as_of=h.main_head())
    await fork.append("note", {"nested": [1, 2.5, None, True]})
    s = await c.spawn("child")
    await h.command(lambda tx: tx.request_abort(s))
    assert await h.drive() == "idle"
    await h.close()
    # Read back after a reopen: what the storage holds (for JSONL: what the file holds).
    reader = await pico.Harness.open(url, session=session, read_only=True)
    storage: Any = reader._line.storage  # the stored rows themselves, not decoded
    rows = storage.recorder.select_session_events(session, after=0, limit=100_000)
    await reader.close()
    return [(str(e.originator_id), e.originator_version, e.topic, bytes(e.state)) for _, e in rows]


async def test_every_backend_stores_the_same_bodies_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = "migrate-" + uuid.uuid4().hex[:8]
    stored: dict[str, list[tuple[str, int, str, bytes]]] = {}
    for name in BACKENDS:
        (tmp_path / name).mkdir()
        backend = make_backend(name, tmp_path / name)
        monkeypatch.setattr(DomainEvent, "create_timestamp", staticmethod(_clock()))
        # A claim's owner token is random per open: the same tokens for each backend's run.
        monkeypatch.setattr("pico.application.line.uuid.uuid4", _tokens())
        stored[name] = await _stream(backend.url, session)
        monkeypatch.undo()
    reference = stored["memory"]
    assert len(reference) > 50  # a real stream: turns, tools, a fork, a subagent, an abort
    topics = {topic for _, _, topic, _ in reference}
    assert any("ValueSet" in t for t in topics) and any("AbortRequested" in t for t in topics)
    for name, rows in stored.items():
        assert len(rows) == len(reference), name
        for mine, theirs in zip(rows, reference, strict=True):
            assert mine == theirs, (name, mine[:3])
