"""The README's main job and the audit CLI, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
