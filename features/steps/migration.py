"""Steps for migrating a session (``pico.migrate``) and replaying and rebuilding its read
model (``pico.replay``, ``pico.rebuild``). Damage to the read model is done with SQL
behind pico's back (as in the check steps); everything else goes through the public API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import parsers, then, when

import pico
from features.steps.check import _sql
from features.steps.library import World
from pico.infrastructure.migrate import migrate
from pico.infrastructure.replay import rebuild, replay
from tests.backends import require_postgres


class _Interrupted(Exception):
    pass


@pytest.fixture
def migration(tmp_path: Path) -> dict[str, Any]:
    """Where this scenario's copies go, and what each migration and replay reported."""
    return {"dir": tmp_path / "copies", "reports": [], "replays": [], "error": None}


def _target(world: World, migration: dict[str, Any], storage: str) -> tuple[str, str]:
    """The target URL for ``storage`` and the copy's session name (another name only when
    the target is the very storage the session lives in: one test server)."""
    directory: Path = migration["dir"]
    directory.mkdir(exist_ok=True)
    urls = {
        "SQLite": f"sqlite:///{directory / 'copy.db'}",
        "JSONL": f"jsonl:///{directory / 'copy'}",
    }
    url = urls.get(storage) or require_postgres("migrations to PostgreSQL")
    name = world.backend.session
    return url, (name + "-copy" if url == world.backend.url else name)


def _source(world: World) -> tuple[str, str]:
    """The session's storage, its owner closed first (a copy is of a session at rest)."""
    # @persistent: a memory session lives only in its process, there is nothing to migrate.
    assert world.backend.name != "memory"
    if world.harness is not None:
        world.run(world.harness.close())
        world.harness = None
    return world.backend.url, world.backend.session


@when(parsers.parse("the session is migrated to {storage} again"))
@when(parsers.parse("the session is migrated to {storage}"))
def migrated(world: World, migration: dict[str, Any], storage: str) -> None:
    url, session = _source(world)
    target, name = _target(world, migration, storage)
    migration["target"] = (target, name)
    try:
        report = world.run(migrate(url, target, session=session, as_name=name))
    except pico.PicoError as exc:
        migration["error"] = exc
        return
    migration["reports"].append(report)


@when(parsers.parse("the session's migration to {storage} is interrupted after {n:d} batches"))
def interrupted(world: World, migration: dict[str, Any], storage: str, n: int) -> None:
    url, session = _source(world)
    target, name = _target(world, migration, storage)
    batches: list[int] = []

    def stop(done: int, total: int) -> None:
        batches.append(done)
        if len(batches) == n:
            raise _Interrupted

    with pytest.raises(_Interrupted):
        world.run(migrate(url, target, session=session, as_name=name, progress=stop))


def _last(migration: dict[str, Any]) -> pico.MigrationReport:
    reports: list[pico.MigrationReport] = migration["reports"]
    assert reports, f"no migration went through ({migration['error']})"
    return reports[-1]


@then("the migration proves the copy equal")
def proves_equal(migration: dict[str, Any]) -> None:
    report = _last(migration)
    assert report.ok, "\n".join(report.lines())
    assert report.bodies is None and report.chain_ok and not report.read_model


@then("the migration resumed after the interrupted copy and proves the copy equal")
def resumed(migration: dict[str, Any]) -> None:
    report = _last(migration)
    assert report.resumed_after > 0 and report.events > report.resumed_after
    assert report.ok, "\n".join(report.lines())


@then("the migration is refused because the target already holds the session")
def refused(migration: dict[str, Any]) -> None:
    error = migration["error"]
    assert isinstance(error, pico.ConfigurationError), error
    assert "already holds session" in str(error)


@when("the copy is opened in place of the session")
def open_copy(world: World, migration: dict[str, Any]) -> None:
    url, name = migration["target"]
    world.harness = world.run(pico.Harness.open(url, session=name, definitions=[world.work]))


@when(parsers.parse('entries "{names}" are lost from the read model outside pico'))
def entries_lost(world: World, names: str) -> None:
    for entry in world.ids(names):
        _sql(world, "DELETE FROM pico_entries WHERE session_id = :sid AND id = :id", id=entry)


@when("the read model is replayed from the history")
def replayed(world: World, migration: dict[str, Any]) -> None:
    migration["replays"].append(world.run(replay(world.backend.url, session=world.backend.session)))


@then(
    parsers.parse('the replay lists entry "{name}" as differing and entries "{names}" as missing')
)
def replay_lists(world: World, migration: dict[str, Any], name: str, names: str) -> None:
    report: pico.ReplayReport = migration["replays"][-1]
    rows = [row for diff in report.differences for row in diff.rows]
    entries = {(row.key["id"], row.kind) for row in rows if row.table == "pico_entries"}
    expected = {(world.id(name), "differs"), *((i, "missing") for i in world.ids(names))}
    assert entries == expected, [str(r) for r in rows]


@when("the read model is rebuilt from the history")
def rebuilt(world: World, migration: dict[str, Any]) -> None:
    world.run(rebuild(world.backend.url, session=world.backend.session))


@then("the replay finds the read model equal to its history")
def replay_equal(world: World) -> None:
    report = world.run(replay(world.backend.url, session=world.backend.session))
    assert report.equal, "\n".join(report.lines())
