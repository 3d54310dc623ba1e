"""The many-live-background-tasks benchmark measures what its report says (issue 14
"Performance"): a drive pass reads exactly the live set, the completed history really grew
between the two measurements (counted, not assumed), every job ran and was killed at the
end, and no process outlives the run. Shape, not speed."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from benchmarks import background_bench


def test_background_bench_reads_only_live_rows_and_kills_every_job_it_started(
    tmp_path: Path,
) -> None:
    run = asyncio.run(
        background_bench.bench(
            tmp_path, schedules=3, jobs=2, history=2, growth=6, passes=4, log=lambda _: None
        )
    )
    first, grown = run.passes
    # Check both measurements saw the same live set; the owner's pass read nothing (its
    # live-task mirror holds the set), and with the mirror dropped it read exactly the set
    # and the session row.
    assert first.live == grown.live == 3 + 2
    for p in (first, grown):
        assert len(p.wall_ms) == len(p.cpu_ms) == 4
        assert (dict(p.rows), p.queries) == ({}, 0)
        # Loading the mirror reads the live set and the session row (its head) only.
        assert dict(p.cold_rows) == {"pico_tasks": 5, "pico_sessions": 1}
        assert p.cold_queries == 2
    assert (first.terminal, grown.terminal) == (2, 6)
    # Check the jobs were launched, observed, and stopped through the harness.
    assert len(run.launch_ms) == 2 and all(ms > 0 for ms in run.launch_ms)
    assert run.observers == 2
    assert run.killed == 2
    assert run.wrappers_rss_kib > 0 and run.peak_rss_kib >= run.rss_after_kib > 0
    # Check no wrapper of the run is still alive (its pid would carry its launch token).
    assert len(run.pids) == 2
    for pid, token in run.pids.items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert token.encode() not in cmdline, f"job wrapper {pid} outlived the benchmark"
    text = background_bench.report(run)
    table = [line for line in text.splitlines() if re.match(r"\| [\d,]+ \| 5 \|", line)]
    assert [row.split("|")[1].strip() for row in table] == ["2", "6"]
    assert "2 of 2 recorded killed" in text
    assert "Ratio 6 / 2 terminal tasks" in text
