"""The JSONL benchmarks measure what their reports say (issue 12 "Performance"): the
open-time store holds exactly the batches asked for, a reopen reads the newest of them,
and the turns workload runs on JSONL in either durability."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import jsonl_bench, turns_bench


def test_built_store_holds_exactly_the_batches_asked_for_and_reopens_at_its_head(
    tmp_path: Path,
) -> None:
    wall, batches = asyncio.run(jsonl_bench.build(tmp_path, 40, "process"))
    assert batches == 40 == jsonl_bench.count_batches(tmp_path)
    assert wall > 0
    reopened = asyncio.run(jsonl_bench.reopen(tmp_path))
    assert reopened["open_s"] > 0
    # Each one-entry batch after the session's own first ones adds an entry and a context
    # edit: the newest entry is the journal's last batch, read back after the reopen.
    assert reopened["last_entry"] == reopened["head"] - 1
    # Building again into a full store appends no entry (its open only journals a claim).
    asyncio.run(jsonl_bench.build(tmp_path, 40, "process"))
    assert asyncio.run(jsonl_bench.reopen(tmp_path))["last_entry"] == reopened["last_entry"]


@pytest.mark.parametrize("durability", ["process", "fsync"])
def test_turns_workload_runs_on_jsonl_and_journals_every_turn(
    tmp_path: Path, durability: str
) -> None:
    per_turn, wall, _ = asyncio.run(
        turns_bench.run(f"jsonl:///{tmp_path}", 3, 16, tmp_path / "turns.jsonl", durability)
    )
    assert len(per_turn) == 3 and wall >= sum(per_turn)
    journal = (tmp_path / "turns.jsonl").read_text().splitlines()
    assert sum('"question 2"' in line.replace("\\", "") for line in journal) == 1
