"""Helpers for worker and inbox tests (issue 16, docs/workers.md) on the shared test
database: isolated session names, sessions created before an inbox reaches them, a worker
run as an asyncio task and always stopped, the rows of ``pico_leases`` / ``pico_work`` /
``pico_inbox`` read back with SQL, and ``options`` for ``pico worker --setup``.

Every worker a test starts gets ``prefix=prefix(...)`` and every session it should see
starts with that prefix: the database is shared by the whole suite, and a worker without
a prefix would pick other tests' sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg

import pico

__all__ = [
    "answer",
    "create_session",
    "inbox_rows",
    "lease_rows",
    "options",
    "prefix",
    "running",
    "wait_for",
    "work_rows",
]


def prefix(test: str) -> str:
    """A session-name prefix unique to one test run: ``<test>-<8 hex>-``."""
    return f"{test}-{uuid.uuid4().hex[:8]}-"


def answer(request: pico.Request) -> str:
    """A faux model turn that names what it answers (the last message's text)."""
    return f"answer to {request.messages[-1].text}"


def options() -> dict[str, Any]:
    """``Harness.open`` options for ``pico worker --setup tests.workers_support:options``:
    a faux provider answering every turn with ``answer``."""
    return {"provider": pico.FauxProvider([answer] * 1000)}


async def create_session(url: str, session: str, **options: Any) -> None:
    """Create ``session`` (an inbox never creates one): open for writing, then close."""
    options.setdefault("provider", pico.FauxProvider([]))
    h = await pico.Harness.open(url, session=session, **options)
    await h.close()


@contextlib.asynccontextmanager
async def running(worker: pico.Worker, *, stop_within: float = 15.0) -> AsyncIterator[Any]:
    """Run ``worker`` as a task for the block; on exit stop it and wait (bounded) for
    ``run`` to return, raising what it raised."""
    task = asyncio.ensure_future(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_within)


async def wait_for(what: str, check: Callable[[], Any], *, within: float) -> float:
    """Poll ``check`` (sync) every 20 ms until truthy; the seconds it took. Fails naming
    ``what`` after ``within`` seconds."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within:
            raise AssertionError(f"{what}: not within {within} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def _select(url: str, sql: str, like: str) -> list[tuple[Any, ...]]:
    escaped = like.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(sql, (escaped + "%",)).fetchall())


def lease_rows(url: str, start: str) -> list[tuple[Any, ...]]:
    """``(session_id, owner, seconds left on the database's clock)`` of every lease row
    whose session starts with ``start``."""
    return _select(
        url,
        "SELECT session_id, owner, extract(epoch FROM expires_at - now())::float8 "
        "FROM pico_leases WHERE session_id LIKE %s ORDER BY session_id",
        start,
    )


def work_rows(url: str, start: str) -> list[tuple[Any, ...]]:
    """``(session_id, seconds until due, or None for 'infinity')`` of every work row whose
    session starts with ``start``."""
    return _select(
        url,
        "SELECT session_id, CASE WHEN due_at = 'infinity' THEN NULL "
        "ELSE extract(epoch FROM due_at - now())::float8 END "
        "FROM pico_work WHERE session_id LIKE %s ORDER BY session_id",
        start,
    )


def inbox_rows(url: str, start: str) -> list[tuple[Any, ...]]:
    """``(id, session_id, request_key, kind, done, result)`` of every inbox command whose
    session starts with ``start``, oldest first."""
    return _select(
        url,
        "SELECT id, session_id, request_key, kind, done_at IS NOT NULL, result "
        "FROM pico_inbox WHERE session_id LIKE %s ORDER BY id",
        start,
    )
