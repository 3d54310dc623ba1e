"""PostgreSQL connections come from psycopg's pool (issue 16): one pool per database per
process, shared by its sessions, sized by ``PICO_PG_POOL_MAX_SIZE``; a session that cannot
get a connection within ``PICO_PG_POOL_TIMEOUT`` gets StorageUnavailableError and changes
nothing; a connection the server dropped is replaced before it is lent."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

import pico
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


async def test_past_the_pool_limit_an_open_fails_clearly_and_a_freed_connection_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = require_postgres("the connection pool")
    name = f"pool-{uuid.uuid4().hex[:8]}"
    url = _own_url(base, name)
    monkeypatch.setenv("PICO_PG_POOL_MAX_SIZE", "2")
    monkeypatch.setenv("PICO_PG_POOL_TIMEOUT", "0.5")
    a = await pico.Harness.open(url, session=f"{name}-a")
    await (await a.root()).append("user", "a holds its writer's and its reader's connection")
    # Check: the pool opened no more than its limit (the sessions' connections are its).
    assert 1 <= len(_backends(base, name)) <= 2
    with pytest.raises(pico.StorageUnavailableError) as caught:
        b = await pico.Harness.open(url, session=f"{name}-b")
        await (await b.root()).append("user", "b")
    message = str(caught.value)
    assert "every connection of this process's pool is in use" in message, message
    assert "PICO_PG_POOL_MAX_SIZE" in message and name in message  # which database, what to do
    # Check: A is unharmed, and once A is closed its connections serve B.
    await (await a.root()).append("user", "a still writes")
    await a.close()
    b = await pico.Harness.open(url, session=f"{name}-b")
    await (await b.root()).append("user", "b writes now")
    await b.close()
    h = await pico.Harness.open(base, session=f"{name}-a", read_only=True)
    texts = [str(e.content) for e in (await (await h.root()).entries()).items]
    await h.close()
    # Check: the refused open of B wrote nothing into A; A's writes are all there.
    assert len(texts) == 2 and "a still writes" in texts[-1]


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
