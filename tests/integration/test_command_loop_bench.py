"""The command benchmark runs what it says (issue 18): each of its commands is one saved
batch that sets the one value, warm-up included, and nothing else. Shape, not speed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pico
from benchmarks import command_loop


def test_each_command_sets_the_value_in_a_batch_of_its_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    seconds = asyncio.run(command_loop.run(url, 7, warm_up=3))
    assert seconds > 0

    async def read() -> tuple[int | None, list[str]]:
        h = await pico.Harness.open(url, session="commands", read_only=True)
        try:
            value = await h.get_value(command_loop.VALUE)
            return value, [r.event for r in h.audit()]
        finally:
            await h.close()

    value, events = asyncio.run(read())
    assert value == 6  # the last of the 7 timed commands (0-6), after the 3 warm-up ones
    sets = [i for i, e in enumerate(events) if e == "Session.ValueSet"]
    assert len(sets) == 10
    # Each set is its own batch: the event right after it is its command's boundary.
    assert all(events[i + 1] == "Session.Committed" for i in sets)
