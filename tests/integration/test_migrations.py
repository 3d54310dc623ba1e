"""Schema migrations: a database written by an older release upgrades in place."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

import pico
from pico.infrastructure.sql import schema
from tests.backends import require_postgres
from tests.taskdefs import definitions


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    base = require_postgres("the upgrade")
    name = f"pico_upgrade_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield base.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _versions(url: str) -> list[int]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        found = [r[0] for r in conn.execute(sa.text("SELECT version FROM pico_schema ORDER BY 1"))]
    engine.dispose()
    return found


async def test_a_version_1_database_upgrades_in_place(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written by a release that only knew migration 1.
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        h = await pico.Harness.open(fresh_url, session="old")
        c = await h.root()
        first = await c.append("user", "written by the old release")
        await h.close()
    assert _versions(fresh_url) == [1]
    # Check: the current release applies migrations 2 and 3, in order, keeping the data.
    h = await pico.Harness.open(fresh_url, session="old", definitions=definitions())
    assert _versions(fresh_url) == [m[0] for m in schema.MIGRATIONS]
    c = await h.root()
    assert [e.content for e in (await c.entries()).items] == ["written by the old release"]
    plan = pico.conversation_value("plugin.plan", bool)
    await c.set_value(plan, True)
    tid = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
    assert await c.get_value(plan) is True and (await h.task(tid)) is not None
    assert await c.append("user", "after the upgrade") > first
    await h.close()
