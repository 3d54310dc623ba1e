"""Migration's refusals and interruptions (issue 13): an existing target session is never
overwritten, a session with live working rows is refused before anything is written, and
a copy interrupted after K batches resumes on the next run and proves equal. The CLI
command is driven through typer's runner."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import pico
from pico.infrastructure.cli.migration import register
from pico.infrastructure.migrate import migrate
from tests.backends import Backend
from tests.bodies import edit_bodies
from tests.contract.test_event_versions import write_legacy
from tests.contract.test_migrate_contract import (
    backend_in,
    build_rich_session,
    drive,
    stored_rows,
    views,
)


class Interrupted(Exception):
    pass


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_an_existing_target_session_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    dst = backend_in("sqlite", tmp_path, "target", "s")
    dst.session = src.session
    await build_rich_session(src.url, src.session)
    h = await pico.Harness.open(dst.url, session=dst.session)
    await (await h.root()).append("user", "mine")
    await h.close()
    target_file = tmp_path / "target" / "pico.db"
    before = _sha(target_file)
    with pytest.raises(pico.ConfigurationError, match=r"already holds session .*--as NAME"):
        await migrate(src.url, dst.url, session=src.session)
    # Check: nothing written (same bytes), no migration note left behind.
    assert _sha(target_file) == before
    assert not list((tmp_path / "target").glob("*.migrating-*"))
    # Check: under another name the copy goes ahead.
    report = await migrate(src.url, dst.url, session=src.session, as_name="other")
    assert report.ok


async def test_the_same_place_and_name_is_refused(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    await build_rich_session(src.url, src.session)
    with pytest.raises(pico.ConfigurationError, match="same storage"):
        await migrate(src.url, src.url, session=src.session)


async def test_a_memory_side_or_a_missing_session_is_refused(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    await build_rich_session(src.url, src.session)
    with pytest.raises(pico.ConfigurationError, match="persistent"):
        await migrate(src.url, "memory://x", session=src.session)
    with pytest.raises(pico.UnknownSessionError):
        await migrate(src.url, f"sqlite:///{tmp_path / 'new.db'}", session="nobody")


async def test_a_live_working_scope_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    h = await pico.Harness.open(src.url, session=src.session)
    work = pico.working_scope("task-7")
    frames = pico.working_list("pi.pending.frames", str, scope=work)
    await h.command(work, lambda tx: tx.append_list(frames, "frame 1"))
    await h.close()
    target = tmp_path / "target.db"
    with pytest.raises(pico.LiveWorkError, match="working/task-7"):
        await migrate(src.url, f"sqlite:///{target}", session=src.session)
    # Check: the target session was not created.
    h = await pico.Harness.open(f"sqlite:///{target}", session="probe")
    await h.close()
    with pytest.raises(pico.UnknownSessionError):
        await pico.Harness.open(f"sqlite:///{target}", session=src.session, read_only=True)


@pytest.mark.parametrize("target", ["sqlite", "postgresql", "jsonl"])
async def test_an_interrupted_migration_resumes_and_proves_equal(
    target: str, tmp_path: Path
) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    dst = backend_in(target, tmp_path, "target", "s")
    dst.session = src.session
    await build_rich_session(src.url, src.session)
    calls: list[int] = []

    def stop_at_batch_7(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 7:
            raise Interrupted  # a real interruption: the copy stops after batch 7

    with pytest.raises(Interrupted):
        await migrate(src.url, dst.url, session=src.session, progress=stop_at_batch_7)
    # Check: the target holds exactly the source's first 7 batches (each one atomic).
    partial = await stored_rows(dst.url, dst.session)
    source_rows = await stored_rows(src.url, src.session)
    assert len(partial) == calls[-1] and partial == source_rows[: len(partial)]
    report = await migrate(src.url, dst.url, session=src.session)
    assert report.ok, "\n".join(report.lines())
    assert report.resumed_after == len(partial) and report.events == len(source_rows)
    assert await stored_rows(dst.url, dst.session) == source_rows
    assert await views(dst.url, dst.session) == await views(src.url, src.session)
    # Check: once proved, the note is gone: a third run is refused as an existing session.
    with pytest.raises(pico.ConfigurationError, match="already holds"):
        await migrate(src.url, dst.url, session=src.session)
    await drive(dst.url, dst.session)


async def test_a_partial_copy_of_another_source_is_refused(tmp_path: Path) -> None:
    one = backend_in("sqlite", tmp_path, "one", "s")
    two = backend_in("sqlite", tmp_path, "two", "s")
    two.session = one.session
    await build_rich_session(one.url, one.session)
    await build_rich_session(two.url, two.session)
    target = f"sqlite:///{tmp_path / 'target.db'}"

    def stop(done: int, total: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        await migrate(one.url, target, session=one.session, progress=stop)
    with pytest.raises(pico.ConfigurationError, match="partial copy of another source"):
        await migrate(two.url, target, session=one.session)
    # Check: its own source still resumes it.
    assert (await migrate(one.url, target, session=one.session)).ok


async def test_a_partial_copy_that_diverged_is_refused(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    await build_rich_session(src.url, src.session)
    path = tmp_path / "target.db"
    target = f"sqlite:///{path}"

    def stop(done: int, total: int) -> None:
        if done > 20:
            raise Interrupted

    with pytest.raises(Interrupted):
        await migrate(src.url, target, session=src.session, progress=stop)
    with sqlite3.connect(path) as conn:  # the partial copy edited behind migrate's back
        assert edit_bodies(conn, lambda body: body.replace(b"text", b"TEXT")) > 0
    with pytest.raises(pico.ConfigurationError, match="differs from the source"):
        await migrate(src.url, target, session=src.session)


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_the_cli_migrates_and_reports_the_proof(tmp_path: Path) -> None:
    src = backend_in("sqlite", tmp_path, "source", "s")
    asyncio.run(build_rich_session(src.url, src.session))
    target = f"jsonl:///{tmp_path / 'j'}"
    runner = CliRunner()
    args = ["migrate", "--from", src.url, "--to", target, "--session", src.session, "--quiet"]
    result = runner.invoke(_app(), args)
    assert result.exit_code == 0, result.output
    assert "proved equal" in result.stdout and "byte-identical" in result.stdout
    # Check: a second run is refused as one line on stderr, exit code 2.
    again = runner.invoke(_app(), args)
    assert again.exit_code == 2
    assert again.stderr.startswith("pico: ") and again.stderr.count("\n") == 1
    asyncio.run(drive(target, src.session))


async def test_an_anchored_session_is_not_copied_under_another_name(tmp_path: Path) -> None:
    source = Backend("sqlite", f"sqlite:///{tmp_path / 'old.db'}")
    write_legacy(source)
    async with await source.open() as h:
        await h.start_chain()
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    with pytest.raises(pico.ConfigurationError, match="anchor"):
        await pico.migrate(source.url, target, session=source.session, as_name="copy")
    assert not (tmp_path / "copy.db").exists()
    # Under its own name it copies and proves equal, the anchor included.
    report = await pico.migrate(source.url, target, session=source.session)
    assert report.ok, report.lines()
