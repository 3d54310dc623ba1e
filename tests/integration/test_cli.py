"""The README's main job and the command line, run as real processes: it never harms a
file, never truncates silently, and every error is one line."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import pico
from pico.infrastructure.cli import app
from pico.infrastructure.cli.audit import AUDIT_PAGE, audit

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pico", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_the_demo_runs_an_agent_session_and_the_audit_reads_it(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    demo = _run("demo", "--db", str(db))
    assert demo.returncode == 0, demo.stderr
    out = demo.stdout
    assert "-> read(" in out and "grep(" in out  # a tool turn
    assert out.count("status='done'") == 4 and "status='cancelled'" in out  # the abort
    assert "steer result: InputResult(status='done'" in out  # steered during the tools
    assert "(after reopening)" in out
    audit = _run("audit", "--url", f"sqlite:///{db}", "--limit", "100000")
    assert audit.returncode == 0, audit.stderr
    records = [json.loads(line) for line in audit.stdout.splitlines()]
    events = {r["event"] for r in records}
    assert {
        "Session.Claimed",
        "Task.Created",
        "Task.AbortRequested",
        "Conversation.EntryAppended",
    } <= events
    assert [r["position"] for r in records] == sorted(r["position"] for r in records)
    show = _run("show", "--url", f"sqlite:///{db}")
    assert show.returncode == 0 and "conversation 1" in show.stdout


def test_cli_errors_are_clear_and_exit_non_zero(tmp_path: Path) -> None:
    missing = _run("audit", "--url", f"sqlite:///{tmp_path / 'nope.db'}")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


# ------------------------------------------------------------- the CLI never harms a file


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_demo_refuses_an_existing_file_and_leaves_its_bytes_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "precious.db"
    db.write_bytes(b"someone's data, not a demo")
    before = _sha(db)
    done = _run("demo", "--db", str(db))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and "--force" in done.stderr
    assert "Traceback" not in done.stderr
    assert _sha(db) == before


def test_demo_refuses_a_leftover_wal_file_too(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    wal = tmp_path / "demo.db-wal"
    wal.write_bytes(b"uncheckpointed pages")
    done = _run("demo", "--db", str(db))
    assert done.returncode == 2 and wal.read_bytes() == b"uncheckpointed pages"
    assert not db.exists()


def test_demo_with_force_replaces_the_file(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    db.write_bytes(b"to be replaced")
    done = _run("demo", "--db", str(db), "--force")
    assert done.returncode == 0, done.stderr
    assert db.read_bytes()[:16] == b"SQLite format 3\x00"


def test_the_default_demo_runs_twice_without_touching_the_first_run(tmp_path: Path) -> None:
    first = subprocess.run(
        [sys.executable, "-m", "pico", "demo"], capture_output=True, text=True, cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    assert "pico-demo.db" in first.stdout
    before = _sha(tmp_path / "pico-demo.db")
    second = subprocess.run(
        [sys.executable, "-m", "pico", "demo"], capture_output=True, text=True, cwd=tmp_path
    )
    assert second.returncode == 0, second.stderr
    assert "pico-demo-2.db" in second.stdout
    assert _sha(tmp_path / "pico-demo.db") == before


# ------------------------------------------------------------------- audit streams all

# More events than one internal page of the audit (1,000): one command of 1,100 entries.
MANY = 1100


@pytest.fixture(scope="module")
def big_session(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A SQLite URL whose session holds more events than one audit page, and the count."""
    url = f"sqlite:///{tmp_path_factory.mktemp('audit') / 'big.db'}"

    async def build() -> int:
        async with await pico.Harness.open(url, session="main") as h:
            cid = (await h.root()).id

            def many(tx: pico.Command) -> None:
                ids = [tx.append_entry(cid, "user", f"line {i} " + "x" * 100) for i in range(MANY)]
                tx.append_context(cid, ids)

            await h.command(many)
            total, after = 0, 0
            while page := h.audit(after=after, limit=500):
                total += len(page)
                after = page[-1].position
            return total

    return url, asyncio.run(build())


def test_audit_streams_every_event_by_default(big_session: tuple[str, int]) -> None:
    url, total = big_session
    assert total > AUDIT_PAGE
    done = _run("audit", "--url", url)
    assert done.returncode == 0 and done.stderr == ""
    positions = [json.loads(line)["position"] for line in done.stdout.splitlines()]
    assert len(positions) == total
    assert positions == sorted(set(positions))


def test_audit_with_a_limit_says_how_many_remain_and_how_to_page_on(
    big_session: tuple[str, int],
) -> None:
    url, total = big_session
    done = _run("audit", "--url", url, "--limit", "7")
    assert done.returncode == 0
    first = [json.loads(line)["position"] for line in done.stdout.splitlines()]
    assert len(first) == 7
    assert len(done.stderr.splitlines()) == 1
    hint = re.search(r"(\d+) more events remain: continue with --after (\d+)", done.stderr)
    assert hint is not None, done.stderr
    assert int(hint.group(1)) == total - 7 and int(hint.group(2)) == first[-1]
    rest = _run("audit", "--url", url, "--after", hint.group(2))
    positions = [json.loads(line)["position"] for line in rest.stdout.splitlines()]
    assert len(positions) == total - 7 and positions[0] > first[-1]
    # Check: a limit that covers everything gives no hint.
    everything = _run("audit", "--url", url, "--limit", str(total))
    assert everything.stderr == "" and len(everything.stdout.splitlines()) == total


def test_the_audit_streams_in_pages_in_process(big_session: tuple[str, int]) -> None:
    url, total = big_session
    out, err = io.StringIO(), io.StringIO()
    printed = asyncio.run(audit(url, "main", out=out, err=err, page=100))
    assert printed == total == len(out.getvalue().splitlines()) and err.getvalue() == ""


def test_a_closed_pipe_ends_the_audit_quietly(big_session: tuple[str, int], tmp_path: Path) -> None:
    url, _ = big_session
    err = tmp_path / "stderr.txt"
    command = (
        f"{shlex.quote(sys.executable)} -m pico audit --url {shlex.quote(url)} "
        f"2>{shlex.quote(str(err))} | head -1"
    )
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 1 and json.loads(done.stdout)["position"] >= 1
    assert err.read_text() == ""


def test_every_reading_command_takes_the_url_as_argument_or_option(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    assert _run("demo", "--db", str(db)).returncode == 0
    url = f"sqlite:///{db}"
    for command in ("show", "audit", "check"):
        positional, option = _run(command, url), _run(command, "--url", url)
        # Check: both spellings read the same session the same way.
        assert positional.returncode == option.returncode == 0, positional.stderr
        assert positional.stdout == option.stdout and positional.stdout


# --------------------------------------------------------------- errors, help, version


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--url", "bogus://x"],
        ["audit", "--url", "sqlite://"],
        ["show", "--url", "postgresql://u:secret@127.0.0.1:1/nowhere"],
        ["audit", "--url", "memory://", "--limit", "0"],
        ["audit", "--url", "memory://", "--after", "soon"],
        ["check", "sqlite:///definitely/not/here.db"],
        ["frobnicate"],
        ["audit"],
        ["show", "sqlite:///a.db", "--url", "sqlite:///b.db"],
        ["audit", "memory://", "--frobnicate"],
        [],
    ],
    ids=[
        "scheme",
        "no-path",
        "unreachable",
        "limit",
        "after",
        "missing",
        "command",
        "no-url",
        "two-urls",
        "unknown-option",
        "no-command",
    ],
)
def test_every_cli_error_is_one_line_on_stderr(args: list[str]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("pico: ") and "│" not in done.stderr  # no rich box
    assert "Traceback" not in done.stderr and "secret" not in done.stderr


def test_an_unknown_session_is_one_line(big_session: tuple[str, int]) -> None:
    url, _ = big_session
    done = _run("audit", "--url", url, "--session", "nobody")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "nobody" in done.stderr and "Traceback" not in done.stderr


def test_help_is_plain_text_and_every_option_has_help() -> None:
    root = typer.main.get_command(app)
    commands = getattr(root, "commands", {})
    assert {"demo", "show", "audit", "check"} <= set(commands)
    for command in [root, *commands.values()]:
        for param in command.params:
            assert getattr(param, "help", None), f"{command.name} {param.name} has no help"
    for args in ([], ["demo"], ["show"], ["audit"], ["check"]):
        done = _run(*args, "--help")
        assert done.returncode == 0 and "``" not in done.stdout and "Usage" in done.stdout


def test_version_is_the_package_metadata_version() -> None:
    done = _run("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"pico {pico.__version__}"
    assert pico.__version__ == importlib.metadata.version("pico-harness")
