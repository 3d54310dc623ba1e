"""Root test configuration: async tests, the backend matrix, and the CI guard that every
backend really ran."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.backends import BACKENDS, Backend, make_backend, require_postgres

_ran: Counter[str] = Counter()


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop (no plugin needed)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {n: pyfuncitem.funcargs[n] for n in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name: str = request.param
    if name == "postgresql":
        require_postgres("the contract")
    _ran[name] += 1
    return make_backend(name, tmp_path)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every backend: memory, SQLite, PostgreSQL, JSONL."""
    return _backend(request, tmp_path)


@pytest.fixture(params=[b for b in BACKENDS if b != "memory"])
def stored_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Backends whose session outlives its handle and can be opened by a second handle
    (a reopen, a read-only follower): SQLite, PostgreSQL, JSONL."""
    return _backend(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Backends with real database transactions that a reader can observe from outside."""
    return _backend(request, tmp_path)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("PICO_REQUIRE_ALL_BACKENDS") and session.testscollected:
        missing = [b for b in BACKENDS if _ran[b] == 0]
        if missing:
            print(f"\nERROR: no test ran against backend(s): {', '.join(missing)}")
            session.exitstatus = 1
        else:
            counts = ", ".join(f"{b}={_ran[b]}" for b in BACKENDS)
            print(f"\nbackend fixtures set up: {counts}")


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    for item in items:
        if "postgresql" in item.name:
            item.add_marker(pytest.mark.postgres)
