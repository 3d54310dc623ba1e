"""``replay`` and ``rebuild`` (issue 13): the read model is derived, the events are the
truth. Damage is done with raw SQL behind pico's back (deleted, changed and extra rows, a
dropped table); replay lists each row, rebuild brings the read model back identical, and
the session answers the same queries as before the damage."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

import pico
from pico.infrastructure import replay as replay_module
from pico.infrastructure.cli.migration import register
from pico.infrastructure.replay import rebuild, replay
from tests.backends import Backend
from tests.contract.test_migrate_contract import build_rich_session, views
from tests.taskdefs import definitions


def _engine(backend: Backend) -> sa.Engine:
    url = backend.url
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def _execute(backend: Backend, *statements: str) -> None:
    engine = _engine(backend)
    try:
        with engine.begin() as conn:
            for statement in statements:
                result = conn.execute(sa.text(statement), {"sid": backend.session})
                assert statement.startswith("DROP") or result.rowcount > 0, statement
    finally:
        engine.dispose()


DAMAGE = (
    # two entries gone, a task's status changed, a row no event produces, the root lost
    "DELETE FROM pico_entries WHERE session_id = :sid AND id IN "
    "(SELECT id FROM pico_entries WHERE session_id = :sid ORDER BY id LIMIT 2)",
    "UPDATE pico_tasks SET status = 'bogus' WHERE session_id = :sid AND id = "
    "(SELECT min(id) FROM pico_tasks WHERE session_id = :sid)",
    "INSERT INTO pico_context_elements (session_id, conversation_id, position, entry_id) "
    "VALUES (:sid, 1, 999999, 1)",
    "UPDATE pico_sessions SET root_id = NULL WHERE session_id = :sid",
)


async def test_a_clean_session_replays_equal_on_every_backend(backend: Backend) -> None:
    await build_rich_session(backend.url, backend.session)
    report = await replay(backend.url, session=backend.session)
    assert report.equal, "\n".join(report.lines())
    assert report.events > 100 and "equals the replay" in report.lines()[-1]


async def test_replay_lists_each_damaged_row_and_rebuild_brings_the_read_model_back(
    sql_backend: Backend,
) -> None:
    await build_rich_session(sql_backend.url, sql_backend.session)
    before = await views(sql_backend.url, sql_backend.session)
    _execute(sql_backend, *DAMAGE)
    report = await replay(sql_backend.url, session=sql_backend.session)
    # Check: every damaged row is listed, with its kind, and counted per table.
    rows = {(d.table, d.kind) for diff in report.differences for d in diff.rows}
    assert rows == {
        ("pico_entries", "missing"),
        ("pico_tasks", "differs"),
        ("pico_context_elements", "extra"),
        ("pico_sessions", "differs"),
    }
    counts = {d.table: d.differing for d in report.differences}
    assert counts == {
        "pico_entries": 2,
        "pico_tasks": 1,
        "pico_context_elements": 1,
        "pico_sessions": 1,
    }
    task = next(d for diff in report.differences for d in diff.rows if d.table == "pico_tasks")
    assert task.columns == ("status",) and task.live is not None
    assert task.live["status"] == "bogus"
    assert "status (live 'bogus', rebuilt" in str(task)
    # Check: replay read only; the damage is still there.
    assert (await replay(sql_backend.url, session=sql_backend.session)).differing == 5
    rebuilt = await rebuild(sql_backend.url, session=sql_backend.session)
    assert rebuilt.repaired == 5 and rebuilt.replaced["pico_entries"][1] > 0
    assert (await replay(sql_backend.url, session=sql_backend.session)).equal
    # Check: the session answers the same queries as before the damage, and takes work.
    assert await views(sql_backend.url, sql_backend.session) == before
    h = await sql_backend.open(definitions=definitions())
    await (await h.root()).append("user", "after the rebuild")
    await h.close()
    assert (await replay(sql_backend.url, session=sql_backend.session)).equal


async def test_a_dropped_table_is_recreated_by_rebuild(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pico.db'}"
    backend = Backend("sqlite", url)
    await build_rich_session(url, backend.session)
    before = await views(url, backend.session)
    _execute(backend, "DROP TABLE pico_list_clears")
    report = await replay(url, session=backend.session)
    assert "table pico_list_clears is missing" in report.warnings
    assert [d.table for d in report.differences] == ["pico_list_clears"]
    rebuilt = await rebuild(url, session=backend.session)
    assert rebuilt.created == ("pico_list_clears",)
    assert (await replay(url, session=backend.session)).equal
    assert await views(url, backend.session) == before


async def test_a_rebuild_that_fails_midway_leaves_the_old_read_model(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    await build_rich_session(sql_backend.url, sql_backend.session)
    _execute(sql_backend, *DAMAGE)
    damaged = await replay(sql_backend.url, session=sql_backend.session)

    def crash() -> None:  # after the old rows are deleted, before the new ones are in
        raise RuntimeError("power cut")

    monkeypatch.setattr(replay_module, "_between", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        await rebuild(sql_backend.url, session=sql_backend.session)
    # Check: the transaction rolled back: exactly the same differences as before.
    assert await replay(sql_backend.url, session=sql_backend.session) == damaged


async def test_rebuild_keeps_working_scope_rows(sql_backend: Backend) -> None:
    h = await sql_backend.open()
    await (await h.root()).append("user", "x")
    work = pico.working_scope("task-7")
    frames = pico.working_list("pi.pending.frames", str, scope=work)
    await h.command(work, lambda tx: tx.append_list(frames, "frame 1"))
    await h.close()
    _execute(sql_backend, "DELETE FROM pico_commits WHERE session_id = :sid")
    assert not (await replay(sql_backend.url, session=sql_backend.session)).equal
    await rebuild(sql_backend.url, session=sql_backend.session)
    assert (await replay(sql_backend.url, session=sql_backend.session)).equal
    # Check: the working scope's rows (not events) are still there.
    h = await sql_backend.open(read_only=True)
    assert [e.value for e in (await h.read_list(frames)).items] == ["frame 1"]
    await h.close()


async def test_rebuild_waits_for_the_sqlite_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "pico.db"
    backend = Backend("sqlite", f"sqlite:///{path}")
    h = await backend.open()
    await (await h.root()).append("user", "x")
    await h.close()
    _execute(backend, "DELETE FROM pico_entries WHERE session_id = :sid")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    done = threading.Event()
    task = asyncio.ensure_future(rebuild(backend.url, session=backend.session))
    task.add_done_callback(lambda _: done.set())
    await asyncio.sleep(0.5)
    # Check: while the other writer holds the lock, the rebuild has not committed.
    assert not done.is_set()
    writer.execute("ROLLBACK")
    writer.close()
    report = await task
    assert report.repaired == 1
    assert (await replay(backend.url, session=backend.session)).equal


async def test_replay_reads_only(tmp_path: Path) -> None:
    path = tmp_path / "pico.db"
    backend = Backend("sqlite", f"sqlite:///{path}")
    await build_rich_session(backend.url, backend.session)
    _execute(backend, *DAMAGE)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    await replay(backend.url, session=backend.session)
    # Check: the file is byte-identical (SQLite may drop an empty -wal as the last
    # connection closes; the database itself is not written).
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


async def test_an_event_that_does_not_decode_is_storage_corrupt_and_nothing_is_rebuilt(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pico.db"
    backend = Backend("sqlite", f"sqlite:///{path}")
    await build_rich_session(backend.url, backend.session)
    _execute(
        backend,
        "DELETE FROM pico_entries WHERE session_id = :sid AND id = 2",
        "UPDATE pico_events SET state = X'7B7D' WHERE id = 5",
    )
    with pytest.raises(pico.StorageCorruptError, match="position 5"):
        await replay(backend.url, session=backend.session)
    with pytest.raises(pico.StorageCorruptError, match="position 5"):
        await rebuild(backend.url, session=backend.session)
    with sqlite3.connect(path) as conn:  # Check: the damaged read model was not replaced
        assert conn.execute("SELECT count(*) FROM pico_entries WHERE id = 2").fetchone() == (0,)


async def test_jsonl_keeps_no_read_model_rebuild_only_verifies(tmp_path: Path) -> None:
    url = f"jsonl:///{tmp_path / 'j'}"
    backend = Backend("jsonl", url)
    await build_rich_session(url, backend.session)
    journal = next((tmp_path / "j").glob("*.jsonl"))
    before = journal.read_bytes()
    report = await rebuild(url, session=backend.session)
    assert report.replaced == {} and "no read model on disk" in report.note
    assert report.events > 100 and journal.read_bytes() == before
    assert (await replay(url, session=backend.session)).equal


async def test_a_jsonl_journal_changed_behind_its_owner_is_a_difference(tmp_path: Path) -> None:
    url = f"jsonl:///{tmp_path / 'j'}"
    h = await pico.Harness.open(url, session="s")
    c = await h.root()
    await c.append("user", "original")
    journal = tmp_path / "j" / "s.jsonl"
    journal.write_bytes(journal.read_bytes().replace(b"original", b"tampered"))
    report = await replay(url, session="s")
    assert not report.equal and "tampered" not in str(report.differences[0].rows[0].live)
    with pytest.raises(pico.StorageCorruptError, match="journal"):
        await rebuild(url, session="s")
    await h.close()


async def test_unknown_sessions_and_memory_rebuild_are_typed_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pico.db'}"
    h = await pico.Harness.open(url, session="a")
    await h.close()
    with pytest.raises(pico.UnknownSessionError):
        await replay(url, session="nobody")
    with pytest.raises(pico.UnknownSessionError):
        await rebuild(url, session="nobody")
    with pytest.raises(pico.StorageUnavailableError):
        await rebuild(f"sqlite:///{tmp_path / 'missing.db'}", session="a")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(pico.ConfigurationError):
        await rebuild("memory://x", session="a")


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_the_cli_replay_exits_one_on_differences_and_rebuild_repairs(tmp_path: Path) -> None:
    path = tmp_path / "pico.db"
    backend = Backend("sqlite", f"sqlite:///{path}")
    asyncio.run(build_rich_session(backend.url, backend.session))
    runner = CliRunner()
    args: list[Any] = [backend.url, "--session", backend.session]
    assert runner.invoke(_app(), ["replay", *args]).exit_code == 0
    _execute(backend, *DAMAGE)
    result = runner.invoke(_app(), ["replay", *args])
    assert result.exit_code == 1 and "pico_entries row (id=" in result.stdout
    assert "5 row(s) differ" in result.stdout
    result = runner.invoke(_app(), ["rebuild", *args])
    assert result.exit_code == 0 and "5 row(s) differed and were repaired" in result.stdout
    assert runner.invoke(_app(), ["replay", *args]).exit_code == 0
    bad = runner.invoke(_app(), ["replay", backend.url, "--session", "nobody"])
    assert bad.exit_code == 2 and bad.stderr.startswith("pico: ")
