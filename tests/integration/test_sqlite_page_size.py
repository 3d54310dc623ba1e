"""A SQLite file pico creates has 2 KiB pages (``store.SQLITE_PAGE_SIZE``): each commit
writes the pages it changed whole into the WAL, and a turn's commits change a few small rows
in many tables (docs/benchmarks.md, eighth pass). A file that already exists keeps its own
page size, whatever it is, and opens, reads and writes as before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pico
from pico.infrastructure.sql.store import SQLITE_PAGE_SIZE


def _page_size(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int(size)
    finally:
        conn.close()


async def test_a_new_database_has_pico_s_page_size_and_stays_in_wal_mode(
    tmp_path: Path,
) -> None:
    path = tmp_path / "new.db"
    h = await pico.Harness.open(f"sqlite:///{path}", session="s")
    await h.set_value(pico.session_value("app", str, key="k"), "v")
    await h.close()
    assert SQLITE_PAGE_SIZE == 2048 and _page_size(path) == 2048
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


async def test_an_existing_database_keeps_its_page_size_and_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    h = await pico.Harness.open(url, session="s")
    address = pico.session_value("app", str, key="k")
    await h.set_value(address, "before")
    await h.close()
    # Rebuilt with SQLite's default 4 KiB pages, as a file from before this change has.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("PRAGMA page_size=4096")
    conn.execute("VACUUM")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    assert _page_size(path) == 4096
    again = await pico.Harness.open(url, session="s")
    assert await again.get_value(address) == "before"
    await again.set_value(address, "after")
    await again.close()
    assert _page_size(path) == 4096
    report = await pico.check(url, session="s")
    assert report.ok, report
    reader = await pico.Harness.open(url, session="s", read_only=True)
    assert await reader.get_value(address) == "after"
    await reader.close()
