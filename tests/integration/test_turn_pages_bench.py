"""The pages diagnostic measures what it says (issue 18): statement shapes elide every
literal, the COMMIT fit recovers a known line, and a short run counts the same statements
every turn and times group-commit COMMITs that appended pages. Shape, not speed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import turn_pages


def test_a_shape_elides_strings_blobs_and_numbers() -> None:
    statement = (
        "INSERT INTO pico_events (session_number, stream_id, state)  VALUES (12, 3.5, x'0aFF')"
        " -- 'it''s', 'b'"
    )
    assert turn_pages.shape(statement) == (
        "INSERT INTO pico_events (session_number, stream_id, state) VALUES (?, ?, ?) -- ?, ?"
    )
    # A number inside a name is part of the name.
    assert turn_pages.shape("SELECT t2.id FROM t2") == "SELECT t2.id FROM t2"


def test_the_fit_recovers_a_line_and_refuses_too_few_points() -> None:
    m = turn_pages.Measured([], flushes=[(p, 10e-6 + 4e-6 * p) for p in (5, 20, 31, 40)])
    fixed, per_page = m.fit()
    assert fixed == pytest.approx(10e-6)
    assert per_page == pytest.approx(4e-6)
    # Every COMMIT the same size: the mean, and no slope.
    fixed, per_page = turn_pages.Measured([], flushes=[(3, 1e-5), (3, 3e-5)]).fit()
    assert fixed == pytest.approx(2e-5) and per_page == 0.0
    with pytest.raises(ValueError, match="fewer than two"):
        turn_pages.Measured([], flushes=[(3, 1e-5)]).fit()


def test_a_short_run_counts_each_turn_alike(tmp_path: Path) -> None:
    measured = asyncio.run(turn_pages.measure(tmp_path / "p.db", 20))
    assert measured.counted == 18  # the first tenth is not counted
    assert measured.commits and all(pages for _, pages in measured.commits)
    assert measured.flushes and all(pages > 0 for pages, _ in measured.flushes)
    inserts = [
        k for text, k in measured.statements.items() if text.startswith("INSERT INTO pico_events")
    ]
    # Every turn of the workload writes the same events: a whole number of them a turn.
    assert len(inserts) == 1 and inserts[0] % measured.counted == 0 and inserts[0] > 0
    assert measured.statements["COMMIT"] >= len(measured.flushes)
