"""A read snapshot always ends (issue 18, fourteenth pass: snapshots became a class):
even when the builder's exception cannot be described, so translating it fails, the
snapshot's transaction is closed and the next command and read see the present."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import pico
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


async def test_a_sqlite_snapshot_takes_its_connection_with_its_first_query(
    tmp_path: Path,
) -> None:
    """Most snapshots read nothing the line does not hold: on SQLite one opens nothing
    until its first query, which begins its read transaction, and ends what it began."""
    h = await pico.Harness.open(f"sqlite:///{tmp_path / 's.db'}", session="lazy")
    c = await h.root()
    await c.append("user", "x")
    store: Any = h._line.storage._read_store  # type: ignore[attr-defined]
    with store.read():
        assert store._local.conn is not None  # inside a snapshot: reads nest in it
        with store.read():
            pass
        # Nothing opened yet: no connection taken, no cursor.
        assert not isinstance(store._local.conn, sqlite3.Connection)
        assert getattr(store._local, "cur", None) is None
    assert store._local.conn is None
    with store.read():
        meta = store.meta()  # the first query: a connection and (off the writer) BEGIN
        conn: Any = store._local.conn
        assert meta is not None and meta.head >= 1
        assert isinstance(conn, sqlite3.Connection) and conn.in_transaction
    assert store._local.conn is None and not conn.in_transaction  # its ROLLBACK ran
    await h.close()
