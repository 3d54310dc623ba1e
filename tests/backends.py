"""Backends every contract runs against, shared by the tests and the BDD step library."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pico

BACKENDS = ["memory", "sqlite", "postgresql", "jsonl"]


def postgres_url() -> str | None:
    return os.environ.get("PICO_TEST_POSTGRES_URL") or None


def require_postgres(what: str) -> str:
    """The PostgreSQL URL, or skip locally; under PICO_REQUIRE_ALL_BACKENDS (CI) a missing
    server fails the test instead of skipping it."""
    import pytest

    url = postgres_url()
    if url is None:
        if os.environ.get("PICO_REQUIRE_ALL_BACKENDS"):
            pytest.fail("PICO_TEST_POSTGRES_URL is not set but every backend is required")
        pytest.skip(f"set PICO_TEST_POSTGRES_URL to run {what} on PostgreSQL")
    return url


def end_backends(pids: list[int]) -> None:
    """End these PostgreSQL backends from another connection, as a restart or
    ``idle_session_timeout`` would, and wait until each is gone."""
    import psycopg

    url = require_postgres("ending connections").replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(100):
            alive = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
            ).fetchone()
            if alive is not None and alive[0] == 0:
                return
            time.sleep(0.02)
    raise AssertionError(f"backends {pids} did not end")


@dataclass
class Backend:
    """Where one test's sessions live. ``url`` survives close/reopen within the test."""

    name: str
    url: str
    session: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:12]}")

    @property
    def exclusive_writer(self) -> bool:
        """Does the writer hold a lock while open (JSONL), so that a second writer is
        refused instead of taking the session over?"""
        return self.name == "jsonl"

    async def open(self, session: str | None = None, **kwargs: object) -> pico.Harness:
        return await pico.Harness.open(self.url, session=session or self.session, **kwargs)  # type: ignore[arg-type]


def make_backend(name: str, tmp_path: Path) -> Backend:
    if name == "memory":
        return Backend(name, f"memory://{uuid.uuid4().hex}")
    if name == "sqlite":
        return Backend(name, f"sqlite:///{tmp_path / 'pico.db'}")
    if name == "jsonl":
        return Backend(name, f"jsonl:///{tmp_path / 'jsonl'}")
    return Backend(name, require_postgres("this test"))


Opener = Callable[..., Awaitable[pico.Harness]]
