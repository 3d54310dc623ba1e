"""The §10.3 workload benchmarks measure what their reports say (issue 18): each runs its
workload through the public API at two history sizes, measures every operation it names,
and (on SQLite) counts the rows each operation read. Shape, not speed: nothing here times
anything against a limit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import workloads_bench as wb


@pytest.mark.parametrize("workload", wb.WORKLOADS)
def test_each_workload_measures_its_operations_at_both_sizes(workload: str, tmp_path: Path) -> None:
    target = wb._target("sqlite", workload, tmp_path)
    # Small sizes; compaction's window holds a collapse (every 5th turn) at both sizes.
    n, window = {"streaming": (2, 2), "compaction": (5, 5)}.get(workload, (6, 4))
    runs = {
        "turns": lambda: wb.turns(target, n, window),
        "forks": lambda: wb.forks(target, n, window),
        "subagents": lambda: wb.subagents(target, n, window),
        "background": lambda: wb.background(target, n, window),
        "compaction": lambda: wb.compaction(target, n, window),
        "approvals": lambda: wb.approvals(target, n, window),
        "streaming": lambda: wb.streaming(target, n, window, 4),
        "queue": lambda: wb.queue(target, n, window),
    }
    assert target.counter is not None
    with target.counter.installed():
        report = asyncio.run(runs[workload]())
    first, grown = report.sizes
    # Check the history really grew tenfold between the two windows.
    assert (first.history, grown.history) == (n, 10 * n)
    assert grown.head > first.head > 0
    for size in report.sizes:
        for name in report.primary:
            op = size.ops[name]
            assert op.wall_ms and all(ms > 0 for ms in op.wall_ms), (workload, name)
        # SQLite: the counter saw the operations' reads (a background pass and its
        # commands, and a short turn with its result, read nothing: the owner's mirrors
        # answer them).
        reads = sum(size.ops[name].queries for name in report.primary)
        assert reads == 0 if workload in ("background", "turns") else reads > 0
        assert size.disk is not None and size.disk.total > 0
        assert size.rss_mib > 0
    text = wb.render(report, "sqlite")
    for name in report.primary:
        assert name in text
