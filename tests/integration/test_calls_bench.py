"""The call-count benchmark counts what it says (issue 18): the turns' Python frames, by
function and caller, with its profile hook gone afterwards. Shape, not speed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from benchmarks import calls, turns_bench


def _line_runs(counted: dict[tuple[str, str], int]) -> int:
    return sum(
        n
        for (where, _), n in counted.items()
        if "application/line.py:" in where and where.endswith("(run)")
    )


def test_a_turn_enters_the_command_line_for_each_of_its_commands() -> None:
    one = asyncio.run(calls.count("memory://", 1))
    three = asyncio.run(calls.count("memory://", 3))
    assert sys.getprofile() is None
    # A turn of the workload is ten commands (and the prompt's own admission).
    assert 10 <= _line_runs(one) <= 15
    assert 30 <= _line_runs(three) <= 45
    # Callers are named: the scheduler's executions run most of a turn's commands.
    assert any(caller == "command" for (where, caller) in three if "line.py" in where)


def test_the_hook_is_removed_when_the_workload_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the workload failed")

    monkeypatch.setattr(turns_bench, "run", broken)
    with pytest.raises(RuntimeError, match="the workload failed"):
        asyncio.run(calls.count("memory://", 1))
    assert sys.getprofile() is None
