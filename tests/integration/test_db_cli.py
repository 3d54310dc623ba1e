"""``pico db``: upgrade, current, sql and history, through typer's CliRunner on real SQLite
files and a real PostgreSQL database."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import pico
from pico.infrastructure.cli.db import register
from pico.infrastructure.sql import schema
from tests.integration.test_migrations import (
    _at,
    _drift,
    _release1_database,
    _stamp,
    run_script,
    scratch_postgres,
)

HEAD = schema.head_revision()


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def pg_url() -> Iterator[str]:
    with scratch_postgres("pico db") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


def invoke(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(app, list(args))
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception
    return done.exit_code, done.stdout, done.stderr


async def _opens(url: str) -> None:
    h = await pico.Harness.open(url, session="s")
    c = await h.root()
    await c.append("user", "hello")
    assert [e.content for e in (await c.entries()).items][-1] == "hello"
    await h.close()


async def test_db_upgrade_brings_a_release_1_database_to_head_and_current_says_so(
    app: typer.Typer, url: str, tmp_path: Path
) -> None:
    await _release1_database(url, tmp_path)
    code, out, _ = invoke(app, "db", "current", url)
    assert code == 1 and "0001" in out and "pre-Alembic" in out and HEAD in out
    code, out, err = invoke(app, "db", "upgrade", url)
    assert (code, err) == (0, "") and f"to revision {HEAD}" in out
    code, out, _ = invoke(app, "db", "current", url)
    assert (code, out.strip()) == (0, f"{HEAD} (head)")
    # Again: nothing to do, and the session opens without any opt-in.
    code, out, _ = invoke(app, "db", "upgrade", url)
    assert code == 0 and "nothing to do" in out
    await _opens(url)


async def test_db_upgrade_to_a_revision_stops_there(app: typer.Typer, url: str) -> None:
    code, out, _ = invoke(app, "db", "upgrade", url, "--revision", "0002")
    assert code == 0 and "to revision 0002" in out
    assert _stamp(url) == "0002"
    code, out, _ = invoke(app, "db", "current", "--url", url)
    assert code == 1 and out.startswith("0002;")
    # Check: going back is bad input (exit 2, one line on stderr), and changes nothing.
    code, out, err = invoke(app, "db", "upgrade", url, "--revision", "0001")
    assert (code, out) == (2, "") and err.startswith("pico: ") and "only move forward" in err
    assert err.count("\n") == 1 and _stamp(url) == "0002"
    code, _, err = invoke(app, "db", "upgrade", url, "--revision", "0042")
    assert code == 2 and "'0042' is not a pico schema revision" in err
    assert _stamp(url) == "0002"


def test_db_current_on_a_missing_file_creates_nothing(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    code, out, _ = invoke(app, "db", "current", f"sqlite:///{path}")
    assert code == 1 and "no pico schema" in out
    assert list(tmp_path.iterdir()) == []


def test_db_commands_refuse_storage_without_a_schema_and_bad_urls(app: typer.Typer) -> None:
    for args in (
        ("db", "current", "memory://"),
        ("db", "upgrade", "jsonl:///somewhere"),
        ("db", "current", "mysql://x/y"),
        ("db", "current"),
    ):
        code, out, err = invoke(app, *args)
        assert (code, out) == (2, "") and err.startswith("pico: "), args


def test_db_current_on_a_foreign_sqlite_file_is_refused_and_the_file_unchanged(
    app: typer.Typer, tmp_path: Path
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    for command in ("current", "upgrade"):
        code, _, err = invoke(app, "db", command, f"sqlite:///{path}")
        assert code == 2 and "another application" in err
    assert path.read_bytes() == before


@pytest.mark.parametrize("start", [None, "0001", "0003"])
async def test_db_sql_applied_with_sqlite3_yields_a_database_pico_opens(
    app: typer.Typer, tmp_path: Path, start: str | None
) -> None:
    url = f"sqlite:///{tmp_path / 'dba.db'}"
    if start is not None:
        _at(url, start)
    args = ["db", "sql", "--dialect", "sqlite"] + (["--from", start] if start else [])
    code, sql, err = invoke(app, *args)
    assert (code, err) == (0, "") and sql.lstrip().startswith("BEGIN;")
    assert sql.rstrip().endswith("COMMIT;")
    assert sqlite3.complete_statement(sql)
    run_script(url, sql)  # the DBA applies it, pico never touches the file first
    assert _stamp(url) == HEAD and _drift(url) == []
    await _opens(url)


async def test_db_sql_applied_with_psycopg_yields_a_database_pico_opens(
    app: typer.Typer, pg_url: str, tmp_path: Path
) -> None:
    code, sql, _ = invoke(app, "db", "sql", "--dialect", "postgresql")
    assert code == 0 and "CREATE TABLE pico_events" in sql and "BIGSERIAL" in sql
    run_script(pg_url, sql)
    assert _stamp(pg_url) == HEAD and _drift(pg_url) == []
    await _opens(pg_url)


async def test_db_sql_from_a_release_1_database_upgrades_it_with_its_data(
    app: typer.Typer, url: str, tmp_path: Path
) -> None:
    """The DBA's path for a pre-Alembic database: stamp it (pico db upgrade --revision of
    its legacy version does that alone), then apply the reviewed SQL."""
    await _release1_database(url, tmp_path)
    assert invoke(app, "db", "upgrade", url, "--revision", "0001")[0] == 0
    assert _stamp(url) == "0001"
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    code, sql, _ = invoke(app, "db", "sql", "--from", "0001", "--dialect", dialect)
    assert code == 0 and "pico_tasks" in sql
    run_script(url, sql)
    assert _stamp(url) == HEAD and _drift(url) == []
    h = await pico.Harness.open(url, session="old")
    c = await h.root()
    assert [e.content for e in (await c.entries()).items] == [
        "written by the old release",
        "an answer",
    ]
    await h.close()


async def test_db_sql_legacy_stamps_a_release_1_database_and_upgrades_it_in_one_script(
    app: typer.Typer, url: str, tmp_path: Path
) -> None:
    """A DBA who lets nothing but their own tools write: the script adopts (stamps) the
    pre-Alembic database and upgrades it, in one transaction; pico opens the result."""
    await _release1_database(url, tmp_path)
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    code, sql, _ = invoke(app, "db", "sql", "--legacy", "--from", "0001", "--dialect", dialect)
    assert code == 0 and sql.startswith("BEGIN;") and sql.count("BEGIN;") == 1
    assert sql.index("INSERT INTO pico_alembic_version") < sql.index("Running upgrade 0001")
    run_script(url, sql)
    assert _stamp(url) == HEAD and _drift(url) == []
    h = await pico.Harness.open(url, session="old")
    assert [e.content for e in (await (await h.root()).entries()).items] == [
        "written by the old release",
        "an answer",
    ]
    await h.close()


def test_db_sql_legacy_from_the_last_legacy_version_only_stamps(app: typer.Typer) -> None:
    last = "0004"  # the last pre-Alembic version's revision (0005 and later came after Alembic)
    code, sql, _ = invoke(
        app, "db", "sql", "--legacy", "--from", last, "--to", last, "--dialect", "sqlite"
    )
    assert code == 0 and "CREATE TABLE pico_alembic_version" in sql
    assert f"VALUES ('{last}')" in sql and "Running upgrade" not in sql
    assert sql.strip().startswith("BEGIN;") and sql.strip().endswith("COMMIT;")


def test_db_sql_rejects_unknown_revisions_dialects_and_backwards_ranges(
    app: typer.Typer,
) -> None:
    for args, says in (
        (("--dialect", "oracle"), "unknown SQL dialect 'oracle'"),
        (("--from", "0099"), "'0099' is not a pico schema revision"),
        (("--from", "0003", "--to", "0002"), "older than the starting revision"),
        (("--legacy",), "--legacy needs --from"),
    ):
        code, out, err = invoke(app, "db", "sql", *args)
        assert (code, out) == (2, "") and says in err, args
    code, out, _ = invoke(app, "db", "sql", "--from", HEAD)
    assert (code, out) == (0, "")  # already at head: nothing to apply


def test_db_history_lists_every_revision_oldest_first_and_marks_head(app: typer.Typer) -> None:
    code, out, _ = invoke(app, "db", "history")
    assert code == 0
    revisions = [line.split()[0] for line in out.splitlines()[1:] if line[:1].isdigit()]
    assert revisions == [
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
        "0011",
    ]
    assert revisions[-1] == HEAD
    assert f"{HEAD} (head)" in out and "pre-Alembic" in out
