"""The floor comparison's closing line (issue 18): each ratio's median, range and the rounds
that met its target, and nothing for a ratio no round measured."""

from __future__ import annotations

from benchmarks.floor_bench import TARGETS, summary


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
