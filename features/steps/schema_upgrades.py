"""Steps of features/schema.feature: a database left by an older (or newer) pico, the
operator's ``pico db upgrade`` and ``pico db sql``, and the embedder's opt-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from pytest_bdd import given, parsers, then, when
from typer.testing import CliRunner

import pico
from features.steps.library import World, _names
from pico.infrastructure.cli.db import register
from pico.infrastructure.sql import schema
from tests.integration.test_migrations import (
    _fingerprint,
    _release1_database,
    _stamp,
    run_script,
    scratch_postgres,
)


class SchemaDatabase:
    """A database of the scenario's own (never the shared test database): its schema is
    what the scenario changes."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.before: bytes | None = None

    @property
    def dialect(self) -> str:
        return "sqlite" if self.url.startswith("sqlite") else "postgresql"


@pytest.fixture
def schema_database(world: World, tmp_path: Path) -> Iterator[SchemaDatabase]:
    if world.backend.name == "sqlite":
        yield SchemaDatabase(f"sqlite:///{tmp_path / 'schema.db'}", tmp_path)
        return
    with scratch_postgres("the schema features") as url:
        yield SchemaDatabase(url, tmp_path)


def _cli(*args: str) -> str:
    app = typer.Typer()
    register(app)
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.stderr
    return done.stdout


def _open(world: World, db: SchemaDatabase, monkeypatch: pytest.MonkeyPatch, allow: bool) -> None:
    world.error = None
    with monkeypatch.context() as m:
        if allow:
            m.setenv("PICO_UPGRADE_SCHEMA", "1")
        else:
            m.delenv("PICO_UPGRADE_SCHEMA", raising=False)
        try:
            world.others.append(world.run(pico.Harness.open(db.url, session="old")))
        except pico.PicoError as exc:
            world.error = exc


# ------------------------------------------------------------------ Given


@given(parsers.parse('a database left by pico\'s first release with the messages "{names}"'))
def first_release_database(world: World, schema_database: SchemaDatabase, names: str) -> None:
    db = schema_database
    world.run(_release1_database(db.url, db.tmp_path, tuple(_names(names))))
    db.before = _fingerprint(db.url)


@given("a new database")
def new_database(schema_database: SchemaDatabase) -> None:
    pass


@given("a database changed by a newer pico")
def newer_database(world: World, schema_database: SchemaDatabase) -> None:
    db = schema_database
    _cli("db", "upgrade", db.url)
    run_script(db.url, f"UPDATE {schema.VERSION_TABLE} SET version_num = '9999';")
    db.before = _fingerprint(db.url)


# ------------------------------------------------------------------ When


@when("the session is opened")
def session_opened(
    world: World, schema_database: SchemaDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    _open(world, schema_database, monkeypatch, allow=False)


@when("the session is opened with schema upgrades allowed")
def session_opened_allowing(
    world: World, schema_database: SchemaDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    _open(world, schema_database, monkeypatch, allow=True)


@when("the operator upgrades the database")
def operator_upgrades(schema_database: SchemaDatabase) -> None:
    _cli("db", "upgrade", schema_database.url)


@when(parsers.parse('a DBA applies the SQL that "pico db sql" writes'))
def dba_applies(schema_database: SchemaDatabase) -> None:
    db = schema_database
    run_script(db.url, _cli("db", "sql", "--dialect", db.dialect))


# ------------------------------------------------------------------ Then


@then(
    parsers.parse('the refusal names the database\'s revision, the revision needed and "{command}"')
)
def refusal_names(world: World, command: str) -> None:
    assert isinstance(world.error, pico.SchemaOutdatedError), repr(world.error)
    message = str(world.error)
    assert f"revision {world.error.current}" in message
    assert f"revision {schema.head_revision()}" in message and command in message


@then("the database is unchanged")
def database_unchanged(schema_database: SchemaDatabase) -> None:
    assert schema_database.before is not None
    assert _fingerprint(schema_database.url) == schema_database.before


@then("the database is at the newest revision")
def at_newest(schema_database: SchemaDatabase) -> None:
    assert _stamp(schema_database.url) == schema.head_revision()


@then(parsers.parse('the session opens and reads "{names}"'))
def session_reads(world: World, schema_database: SchemaDatabase, names: str) -> None:
    async def read() -> list[str]:
        async with await pico.Harness.open(schema_database.url, session="old") as h:
            page = await (await h.root()).entries(limit=1000)
            await (await h.root()).append("user", "after the upgrade")
            return [str(e.content) for e in page.items]

    for h in world.others:  # an opt-in open above already holds the session
        world.run(h.close())
    world.others.clear()
    expected = [] if names == "nothing" else _names(names)
    assert world.run(read()) == expected
