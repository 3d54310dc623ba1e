"""A read snapshot always ends (issue 18, fourteenth pass: snapshots became a class):
even when the builder's exception cannot be described, so translating it fails, the
snapshot's transaction is closed and the next command and read see the present."""

from __future__ import annotations

import pytest

from pico import Command
from tests.backends import Backend


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("this error has no text")


async def test_a_snapshot_ends_when_its_error_cannot_be_translated(sql_backend: Backend) -> None:
    h = await sql_backend.open()
    c = await h.root()

    def build(tx: Command) -> None:
        tx.scan_tasks(live=True, limit=1)  # a read: the snapshot's transaction begins
        raise _Unprintable()

    with pytest.raises(ValueError, match="this error has no text"):
        await h.command(build)
    # The snapshot ended: the next command commits and a read sees it.
    await c.append("user", "after")
    assert [e.content for e in (await c.entries()).items] == ["after"]
    assert h.scheduler.line.faulted is None
    await h.close()
