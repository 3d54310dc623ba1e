"""``pico inspect``: a session's live work by role, read-only (issue 13, "The CLI is one
coherent tool")."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

import pico
from pico.infrastructure.cli.app import app, run


async def _accepted_not_driven(url: str) -> int:
    async with await pico.Harness.open(url, provider=pico.FauxProvider(["later"])) as h:
        c = await h.root()
        await c.accept("answer me later")
        (generation,) = (await h.inspect())["ready"]
        return generation.id


def test_inspect_lists_live_tasks_by_role_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "live.db"
    task = asyncio.run(_accepted_not_driven(f"sqlite:///{db}"))
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert run(app, ["inspect", f"sqlite:///{db}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("session 'main': head ")
    assert lines[1] == "ready (1):"
    assert lines[2].startswith(f"  task {task} | conversation 1 | generation | ")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_inspect_of_an_idle_session_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def idle() -> None:
        async with await pico.Harness.open(f"sqlite:///{tmp_path / 'idle.db'}") as h:
            await (await h.root()).append("user", "hello")

    asyncio.run(idle())
    assert run(app, ["inspect", f"sqlite:///{tmp_path / 'idle.db'}"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["no live work"]


def test_inspect_of_a_missing_file_is_one_line_and_exit_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(app, ["inspect", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pico: ") and err.count("\n") == 1
    assert not (tmp_path / "none.db").exists()
