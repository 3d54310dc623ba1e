"""PostgreSQL connections come from psycopg's pool (issue 16): one pool per database per
process, shared by its sessions, sized by ``PICO_PG_POOL_MAX_SIZE``; the sessions take a
connection per transaction and give it back (``IdleConnections``: most recently used
first); a command that cannot get a connection within ``PICO_PG_POOL_TIMEOUT`` gets
StorageUnavailableError and changes nothing; a connection the server dropped is replaced
before it is lent."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pico
from pico.domain.ids import session_uuid
from tests.backends import require_postgres


def _own_url(url: str, name: str) -> str:
    """The test database under a URL of its own (application_name), so this test's open
    builds a pool of its own instead of sharing the suite's."""
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def _backends(url: str, name: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
    return [r[0] for r in rows]


def _database(h: pico.Harness) -> Any:
    return h._line.storage.recorder.writer.db  # type: ignore[attr-defined]


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """The server's URL, a name of this test's own and its URL, under which an open builds
    a pool of two connections that waits at most half a second for one."""
    base = require_postgres("the connection pool")
    name = f"pool-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("PICO_PG_POOL_MAX_SIZE", "2")
    monkeypatch.setenv("PICO_PG_POOL_TIMEOUT", "0.5")
    return base, name, _own_url(base, name)


async def test_past_the_pool_limit_a_command_fails_clearly_and_a_freed_connection_serves(
    small_pool: tuple[str, str, str],
) -> None:
    base, name, url = small_pool
    a = await pico.Harness.open(url, session=f"{name}-a")
    ca = await a.root()
    await ca.append("user", "a writes")
    # Check: the pool opened no more than its limit.
    assert 1 <= len(_backends(base, name)) <= 2
    # Both of the pool's connections busy elsewhere in the process (two other threads'
    # transactions, say): the one a's commands were lent, and the pool's last.
    db = _database(a)
    held = [db.idle.take(), db.idle.take()]
    with pytest.raises(pico.StorageUnavailableError) as caught:
        await ca.append("user", "no connection for this one")
    message = str(caught.value)
    assert "every connection of this process's pool is in use" in message, message
    assert "PICO_PG_POOL_MAX_SIZE" in message and name in message  # which database, what to do
    # Check: a reload meeting the exhausted pool is the same unavailability, not damage
    # (the adapter translates the pool's timeout; storage passes pico's errors through).
    with pytest.raises(pico.StorageUnavailableError, match="every connection of this process"):
        a._line.storage.load(session_uuid(f"{name}-a"))
    # Check: once a connection is free again the handle serves, and b opens beside a.
    db.idle.give(held.pop())
    await ca.append("user", "a still writes")
    db.idle.give(held.pop())
    b = await pico.Harness.open(url, session=f"{name}-b")  # a claim and a load: two at once
    await (await b.root()).append("user", "b writes")
    await b.close()
    await a.close()
    h = await pico.Harness.open(base, session=f"{name}-a", read_only=True)
    texts = [str(e.content) for e in (await (await h.root()).entries()).items]
    await h.close()
    # Check: the refused command wrote nothing; a's writes are all there.
    assert texts == ["a writes", "a still writes"], texts


async def test_sessions_taking_turns_share_one_connection_and_fit_a_small_pool(
    small_pool: tuple[str, str, str],
) -> None:
    # A process's sessions give their connection back between transactions and are lent
    # the most recently used one: twelve sessions, each claimed, then writing and reading
    # in turn, fit a pool of two connections and use one. (What many claims on one
    # connection did to pico's prepared statements is test_pg_prepared's.)
    base, name, url = small_pool
    hs = [await pico.Harness.open(url, session=f"{name}-{i}") for i in range(12)]
    try:
        cs = [await h.root() for h in hs]
        db = _database(hs[0])
        assert all(_database(h) is db for h in hs)
        used: set[int] = set()
        for turn in range(3):
            for i, c in enumerate(cs):
                await c.append("user", f"{i}.{turn}")
                assert [e.content for e in await c.context_entries()][-1] == f"{i}.{turn}"
                writer = hs[i]._line.storage.recorder.writer  # type: ignore[attr-defined]
                assert writer._fairy is None  # given back after its transaction
                used.add(db.idle._stack[-1].info.backend_pid)
        assert len(used) == 1, used  # one warm backend served all twelve sessions
        assert len(_backends(base, name)) <= 2
        for i, c in enumerate(cs):
            assert [e.content for e in await c.context_entries()] == [f"{i}.{t}" for t in range(3)]
    finally:
        for h in hs:
            await h.close()


async def test_a_connection_the_server_dropped_is_replaced_before_it_is_lent() -> None:
    base = require_postgres("the connection pool")
    name = f"pool-{uuid.uuid4().hex[:8]}"
    url = _own_url(base, name)
    h = await pico.Harness.open(url, session=f"{name}-s")
    await (await h.root()).append("user", "before")
    await h.close()  # its connections go back to the pool, idle
    with psycopg.connect(base, autocommit=True) as conn:
        for pid in _backends(base, name):
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # Check: the next open gets a working connection (the pool checked and replaced it).
    h = await pico.Harness.open(url, session=f"{name}-s")
    c = await h.root()
    await c.append("user", "after")
    assert len((await c.entries()).items) == 2
    await h.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PICO_PG_POOL_MAX_SIZE", "0"),
        ("PICO_PG_POOL_MAX_SIZE", "many"),
        ("PICO_PG_POOL_TIMEOUT", "-1"),
    ],
)
async def test_a_bad_pool_setting_is_refused_before_anything_opens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    url = f"sqlite:///{tmp_path}/pool.db"
    with pytest.raises(pico.ConfigurationError, match=name[len("PICO_") :].lower()):
        await pico.Harness.open(url, session="s")
    monkeypatch.delenv(name)
    h = await pico.Harness.open(url, session="s")  # nothing was created by the refusal
    assert (await (await h.root()).entries()).items == ()
    await h.close()
