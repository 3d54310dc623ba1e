"""BDD wiring: every feature runs against every backend through the public API."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from features.steps.approvals import *  # noqa: F403
from features.steps.bad_input import *  # noqa: F403
from features.steps.check import *  # noqa: F403
from features.steps.collapse_recovery import *  # noqa: F403
from features.steps.initialization import *  # noqa: F403
from features.steps.interrupted import *  # noqa: F403
from features.steps.library import *  # noqa: F403  (pytest-bdd finds steps as fixtures)
from features.steps.library import World
from features.steps.opening import *  # noqa: F403
from features.steps.rewind import *  # noqa: F403
from features.steps.shutdown import *  # noqa: F403
from features.steps.subagents import *  # noqa: F403
from features.steps.tools import *  # noqa: F403
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
