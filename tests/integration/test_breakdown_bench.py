"""The breakdown benchmark measures what its report says (issue 18): the timed run records
every statement of pico's run, SQLAlchemy's and pico's own connections alike, DBAPI
``commit()`` included, and the replay runs each of them again on a fresh file, so the two
count the same statements of the same kinds. Shape, not speed. (The floor's side needs
``../shared/bench/floor_turns.py``, which a clean clone does not have: it is exercised by
running the benchmark.)"""

from __future__ import annotations

from pathlib import Path

from benchmarks import breakdown

TURNS = 5


def test_the_replay_runs_every_statement_the_timed_run_recorded(tmp_path: Path) -> None:
    record = str(tmp_path / "statements.pickle")
    timed = breakdown._run("pico", TURNS, timed=True, record=record)
    replayed = breakdown._run("replay", TURNS, timed=False, record=record)
    calls = {kind: count for kind, (count, _) in timed["kinds"].items()}
    assert calls == {kind: count for kind, (count, _) in replayed["kinds"].items()}
    assert all(seconds >= 0 for _, seconds in replayed["kinds"].values())
    # The writer's explicit transactions (the open's claim may roll one back): a turn
    # commits before each of its two provider calls, once for its two tool calls' intents
    # (they share it) and at the drive's return; and one executemany of event rows per batch.
    assert calls["BEGIN IMMEDIATE"] >= calls["COMMIT"] >= 4 * TURNS
    inserts = [k for k in calls if k.startswith("many: INSERT INTO pico_events")]
    assert len(inserts) == 1 and calls[inserts[0]] >= 10 * TURNS
    assert replayed["wall"] > 0 and timed["wall"] > 0
