"""Every documented benchmark command still runs (docs/benchmarks.md): each benchmark
without a test of its own runs as a user runs it (``python -m benchmarks.NAME``) on a tiny
workload, exits 0 and prints its Markdown table. Shape, not speed: a benchmark that rots
(an argument it no longer takes, a window past its data) fails here, not in a reader's
shell.

Each runs from a copy of the package in a temporary directory, so what a benchmark writes
to its ``results/`` folder never replaces a developer's real results."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import floor_plus
from pico.infrastructure.sql import bodies

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

#: (module, arguments, text its output must hold): the benchmarks no other test runs.
RUNS = [
    ("bytes_bench", ["--turns", "20"], "pico_entries"),
    ("chain_bench", ["cost", "--turns", "5"], "| boundaries sealed |"),
    ("chain_bench", ["verify", "--events", "100"], "| events | verify s |"),
    ("commit_bench", ["--commands", "20", "--growth", "2000", "--reopen", "0"], "ratio late/early"),
    ("migrate_bench", ["--events", "200"], "| SQLite |"),
    ("provider_bench", ["--turns", "2"], "| anthropic |"),
    ("state_bench", ["--unrelated", "50", "--reads", "20"], "| sqlite |"),
    ("subagent_bench", ["--children", "3", "--runs", "1"], "| sqlite | 3 |"),
    ("task_bench", ["--terminal", "50", "--trivial", "10"], "| sqlite | 10 |"),
    ("telemetry_bench", ["--turns", "5", "--runs", "1"], "| sdk |"),
    ("turns_bench", ["--turns", "30"], "| last/first |"),
    ("turns_bench", ["--turns", "30", "--backend", "jsonl"], "| last/first |"),
    ("watch_bench", ["--turns", "5", "--rounds", "1"], "| in process (owner's hub) |"),
    ("body_dictionaries", ["--turns", "5"], "task states"),
    ("floor_plus", ["--turns", "20", "--rounds", "1"], "| + all three |"),
]


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench")
    shutil.copytree(BENCHMARKS, root / "benchmarks", ignore=shutil.ignore_patterns("results"))
    return root


def run(root: Path, module: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    # The copy first; the checkout after it for what benchmarks borrow from the tests (the
    # provider adapters' stub server).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(root), str(REPO)))}
    env.pop("PICO_TEST_POSTGRES_URL", None)  # the local backends only: no server needed
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(("module", "args", "shows"), RUNS, ids=lambda v: str(v))
def test_a_documented_benchmark_runs_and_prints_its_table(
    copy: Path, module: str, args: list[str], shows: str
) -> None:
    done = run(copy, module, args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shows in done.stdout, done.stdout[-2000:]
    assert "|---|" in done.stdout or module == "body_dictionaries"


def test_the_copy_is_the_one_that_ran(copy: Path) -> None:
    # What a run writes lands in the copy's results/, never in the checkout's.
    mine = BENCHMARKS / "results" / "turns.md"
    before = mine.read_bytes() if mine.exists() else None
    done = run(copy, "turns_bench", ["--turns", "20"])
    assert done.returncode == 0, done.stderr[-2000:]
    written = (copy / "benchmarks" / "results" / "turns.md").read_text()
    assert "| last/first |" in written
    assert (mine.read_bytes() if mine.exists() else None) == before


def test_a_growth_run_too_short_to_compare_is_refused_with_what_to_pass(copy: Path) -> None:
    done = run(copy, "commit_bench", ["--commands", "5", "--growth", "200"])
    assert done.returncode == 2
    assert "--growth must be 0 (no growth run) or at least 2,000" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_floor_plus_writes_what_the_floor_writes_and_its_extras_change_only_bodies(
    tmp_path: Path,
) -> None:
    # The copy of the floor writes the floor's rows; each extra changes how bodies and texts
    # are stored (compressed, chained), never how many rows a turn writes.
    counts: dict[str, list[int]] = {}
    for name, extras in floor_plus.VARIANTS.items():
        directory = tmp_path / str(len(counts))
        directory.mkdir()
        floor_plus.run(3, "NORMAL", extras, directory)
        (db,) = directory.glob("*.db")
        with sqlite3.connect(db) as conn:
            counts[name] = [
                conn.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("events", "entries", "context", "tasks", "vals", "commits")
            ]
            if "compress" in extras:
                body = conn.execute(
                    "select state from events where topic = 'EntryAppended' limit 1"
                ).fetchone()[0]
                assert b'"content"' in bodies.decode(body) and body[:1] != b"{"
            if "chain" in extras:
                last = conn.execute(
                    "select state from events where topic = 'Committed' order by rowid desc"
                ).fetchone()[0]
                assert b'"link":"sha256:' in last and b"0" * 64 not in last
    # Three turns: 36 events, 5 entries, 5 context rows, 5 tasks, 2 values, 10 commits each.
    assert counts["floor (this program's copy)"] == [108, 15, 15, 15, 6, 30]
    assert all(c == counts["floor (this program's copy)"] for c in counts.values())


def test_the_floor_plus_runs_only_the_variants_named_and_compares_with_the_plain_copy(
    copy: Path,
) -> None:
    # What `benchmarks.instructions` counts: one variant a process. With the plain copy
    # beside it, a variant's wall and CPU ratios are against it; alone, there is nothing
    # to compare with.
    both = run(
        copy, "floor_plus", ["--turns", "5", "--rounds", "1", "--only", "plain", "--only", "all"]
    )
    assert both.returncode == 0, both.stderr[-2000:]
    rows = [
        line for line in both.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert [r.split(" | ")[0] for r in rows] == [
        "| variant",
        "| floor (this program's copy)",
        "| + all three",
    ]
    assert rows[1].count("| 1.00x |") == 2  # the copy against itself, by both clocks
    alone = run(copy, "floor_plus", ["--turns", "5", "--rounds", "1", "--only", "chain"])
    assert alone.returncode == 0, alone.stderr[-2000:]
    (row,) = [line for line in alone.stdout.splitlines() if line.startswith("| + chain |")]
    assert row.endswith("| - |") and row.count("| - |") == 2
