"""The floor comparison's closing line (issue 18): each ratio's median, range and the rounds
that met its target, and nothing for a ratio no round measured."""

from __future__ import annotations

import pytest

from benchmarks.floor_bench import TARGETS, parse_floor, summary


def test_the_summary_gives_each_measured_ratio_its_median_range_and_rounds_met() -> None:
    line = summary({"SQLite": [3.1, 2.4, 3.9, 2.5], "memory": [1.6], "fsync": []})
    assert line == (
        "SQLite / floor median 2.80x (range 2.40-3.90x; target 2.5x, met in 2 of 4); "
        "memory / floor median 1.60x (range 1.60-1.60x; target 1.5x, met in 0 of 1)"
    )
    assert "fsync" not in line  # no round ran it (--only)


def test_the_targets_are_the_issues() -> None:
    assert TARGETS == {"SQLite": 2.5, "memory": 1.5, "fsync": 2.5}
    assert summary({"SQLite": [], "memory": [], "fsync": []}) == "no ratio measured"


def test_a_floor_run_reads_its_own_line_and_the_cpu_line_after_it() -> None:
    out = (
        '{"turns": 10, "synchronous": "NORMAL", "wall_s": 6.17, "commits": 100, '
        '"last100_over_first100": 1.01, "db_mb": 9.1}\n{"cpu_s": 3.75}\n'
    )
    run = parse_floor(out)
    assert run["wall"] == 6.17 and run["cpu"] == 3.75 and run["ratio"] == 1.01
    assert abs(run["mib"] - 9.1e6 / 2**20) < 1e-9


def test_a_floor_run_without_its_cpu_line_is_refused() -> None:
    with pytest.raises(SystemExit, match="printed 1 lines"):
        parse_floor('{"wall_s": 1.0, "last100_over_first100": 1.0, "db_mb": 1.0}\n')
