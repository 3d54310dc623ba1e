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


def _old_v3_layout(url: str) -> None:
    """Turn a fresh v3 database into what release v3 wrote: role-carrying task indexes
    and, on SQLite, a rowid commit table."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX pico_tasks_by_conversation"))
        conn.execute(sa.text("CREATE INDEX pico_tasks_role ON pico_tasks (session_id, role, id)"))
        conn.execute(
            sa.text(
                "CREATE INDEX pico_tasks_conversation "
                "ON pico_tasks (session_id, conversation_id, role, id)"
            )
        )
        if engine.dialect.name == "sqlite":
            conn.execute(sa.text("ALTER TABLE pico_commits RENAME TO c_old"))
            conn.execute(
                sa.text(
                    "CREATE TABLE pico_commits (session_id VARCHAR(200) NOT NULL, "
                    "last BIGINT NOT NULL, first BIGINT NOT NULL, scope VARCHAR(200) NOT NULL, "
                    "PRIMARY KEY (session_id, last))"
                )
            )
            conn.execute(sa.text("INSERT INTO pico_commits SELECT * FROM c_old"))
            conn.execute(sa.text("DROP TABLE c_old"))
    engine.dispose()


def _layout(url: str) -> tuple[set[str], bool]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    indexes = {i["name"] for i in sa.inspect(engine).get_indexes("pico_tasks")}
    keyed = True
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            ddl = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE name = 'pico_commits'")
            ).scalar_one()
        keyed = "WITHOUT ROWID" in ddl.upper()
    engine.dispose()
    return {str(i) for i in indexes}, keyed


async def test_a_version_3_database_gets_the_v4_layout_and_keeps_its_tasks_and_commits(
    fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:3])
        h = await pico.Harness.open(fresh_url, session="v3", definitions=definitions())
        c = await h.root()
        done = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
        first = h.main_head()
        await h.command(lambda tx: tx.patch_task(done, status="killed"))
        live = await h.command(lambda tx: tx.create_task(c.id, "note", state=None))
        boundary = h.main_head()
        await h.close()
    _old_v3_layout(fresh_url)
    assert _layout(fresh_url) == (
        {
            "pico_tasks_role",
            "pico_tasks_conversation",
            "pico_tasks_live",
            "pico_tasks_live_conversation",
        },
        fresh_url.startswith("postgresql"),
    )
    h = await pico.Harness.open(fresh_url, session="v3", definitions=definitions())
    assert _versions(fresh_url) == [m[0] for m in schema.MIGRATIONS]
    assert _layout(fresh_url) == (
        {"pico_tasks_by_conversation", "pico_tasks_live", "pico_tasks_live_conversation"},
        True,
    )
    # The commit boundaries survived the rebuild; a position inside no commit is none.
    assert h.reads.is_main_boundary(first) and h.reads.is_main_boundary(boundary)
    assert first < boundary and not h.reads.is_main_boundary(boundary + 1)
    assert [t.id for t in (await h.tasks(role="terminal")).items] == [done]
    assert [t.id for t in (await h.tasks(role="ready")).items] == [live]
    assert [t.id for t in (await h.tasks(conversation_ids=[c.id])).items] == [done, live]
    await h.command(lambda tx: tx.patch_task(live, status="killed"))
    assert [t.id for t in (await h.tasks(role="terminal")).items] == [done, live]
    await h.close()
