"""BDD wiring: every feature runs against every backend through the public API."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from features.steps.anthropic import *  # noqa: F403
from features.steps.approvals import *  # noqa: F403
from features.steps.audit_export import *  # noqa: F403
from features.steps.bad_input import *  # noqa: F403
from features.steps.check import *  # noqa: F403
from features.steps.collapse_recovery import *  # noqa: F403
from features.steps.initialization import *  # noqa: F403
from features.steps.interrupted import *  # noqa: F403
from features.steps.jobs import *  # noqa: F403
from features.steps.journal import *  # noqa: F403
from features.steps.library import *  # noqa: F403  (pytest-bdd finds steps as fixtures)
from features.steps.library import World
from features.steps.migration import *  # noqa: F403
from features.steps.opening import *  # noqa: F403
from features.steps.providers import *  # noqa: F403
from features.steps.recurrence import *  # noqa: F403
from features.steps.resume_gate import *  # noqa: F403
from features.steps.rewind import *  # noqa: F403
from features.steps.schema_upgrades import *  # noqa: F403
from features.steps.shutdown import *  # noqa: F403
from features.steps.subagents import *  # noqa: F403
from features.steps.tamper import *  # noqa: F403
from features.steps.telemetry import *  # noqa: F403
from features.steps.testing_support import *  # noqa: F403
from features.steps.tools import *  # noqa: F403
from features.steps.watch import *  # noqa: F403
from features.steps.workers import *  # noqa: F403
from tests.backends import BACKENDS, make_backend, require_postgres


@pytest.fixture(params=BACKENDS, autouse=True)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    name: str = request.param
    if name == "postgresql":
        require_postgres("the features")
    with asyncio.Runner() as runner:
        w = World(make_backend(name, tmp_path), runner)
        yield w
        for h in [*w.others, *([w.harness] if w.harness else [])]:
            runner.run(h.close())


#: Backends whose one writer holds a lock while it is open: a second writer is refused
#: instead of taking the session over (``@takeover`` scenarios describe the takeover; the
#: ``@exclusive`` ones describe the refusal).
EXCLUSIVE = {"jsonl"}
#: Backends with a SQL schema (``@sql`` scenarios: schema revisions and upgrades).
SQL = {"sqlite", "postgresql"}
#: Backends whose sessions outlive the process (``@persistent`` scenarios: migration).
PERSISTENT = {"sqlite", "postgresql", "jsonl"}
#: Backends that share sessions between processes (``@postgres`` scenarios: workers, inboxes).
POSTGRES = {"postgresql"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sql: a scenario about the SQL schema (SQLite, PostgreSQL)")
    config.addinivalue_line(
        "markers", "persistent: a scenario about stored sessions (not the memory backend)"
    )
    config.addinivalue_line("markers", "workers: a scenario about workers and inboxes (PostgreSQL)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each tagged scenario runs on the backends it describes; the others are deselected,
    not skipped."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("world") if callspec is not None else None
        marks = {m.name for m in item.iter_markers()}
        if name is not None and (
            ("takeover" in marks and name in EXCLUSIVE)
            or ("exclusive" in marks and name not in EXCLUSIVE)
            or ("sql" in marks and name not in SQL)
            or ("persistent" in marks and name not in PERSISTENT)
            or ("postgres" in marks and name not in POSTGRES)
        ):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
