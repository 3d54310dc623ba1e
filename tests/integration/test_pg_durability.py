"""``durability`` on PostgreSQL (issue 16), as on SQLite: ``process`` (the default) makes
each write transaction commit without waiting for its WAL flush (``SET LOCAL
synchronous_commit = off``: durable against a crash of pico's process, visible to every
other connection at once); ``fsync`` leaves the server's ``synchronous_commit`` in force.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import pico
from pico.infrastructure.sql import writer
from tests.backends import require_postgres

ASYNC = "SET LOCAL synchronous_commit = off"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every write transaction's string as it goes to the server."""
    texts: list[str] = []
    original = writer._ClientBatch.send

    def send(self: Any) -> None:
        texts.append(";".join(self._parts))
        original(self)

    monkeypatch.setattr(writer._ClientBatch, "send", send)
    return texts


@pytest.mark.parametrize(
    ("durability", "asynchronous"), [(None, True), ("process", True), ("fsync", False)]
)
async def test_process_durability_commits_without_waiting_for_the_wal_flush(
    sent: list[str], durability: str | None, asynchronous: bool
) -> None:
    url = require_postgres("durability on PostgreSQL")
    sid = f"durability-{uuid.uuid4().hex[:8]}"
    h = await pico.Harness.open(url, session=sid, durability=durability)
    c = await h.root()
    await c.append("user", "one")
    await c.append("user", "two")
    await h.close()
    commits = [t for t in sent if t.endswith("COMMIT")]
    assert len(commits) >= 2
    # Check: every write transaction of the session says how it commits, or none does.
    assert all(t.endswith(f"{ASYNC};COMMIT") is asynchronous for t in commits), commits
    # Check: what committed asynchronously is there for another connection at once.
    reader = await pico.Harness.open(url, session=sid, read_only=True)
    texts = [str(e.content) for e in (await (await reader.root()).entries()).items]
    await reader.close()
    assert len(texts) == 2 and "two" in texts[1]
