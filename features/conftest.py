"""BDD wiring: every feature runs against every backend through the public API."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from features.steps.library import *  # noqa: F403  (pytest-bdd finds steps as fixtures)
from features.steps.library import World
from tests.backends import BACKENDS, make_backend, postgres_url


@pytest.fixture(params=BACKENDS, autouse=True)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    name: str = request.param
    if name == "postgresql" and postgres_url() is None:
        if os.environ.get("PICO_REQUIRE_ALL_BACKENDS"):
            pytest.fail("PICO_TEST_POSTGRES_URL is not set but every backend is required")
        pytest.skip("set PICO_TEST_POSTGRES_URL to run the features on PostgreSQL")
    with asyncio.Runner() as runner:
        w = World(make_backend(name, tmp_path), runner)
        yield w
        for h in [*w.others, *([w.harness] if w.harness else [])]:
            runner.run(h.close())
