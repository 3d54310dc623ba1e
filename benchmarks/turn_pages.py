"""Pages written per command in one agent turn (the 2,000-turn workload's turn), by table.

Wall time on a shared VM varies 10-30% run to run; the number of database pages a command
writes to the SQLite WAL does not, and on this kind of machine each page costs ~10 µs of
COMMIT (docs/benchmarks.md). This runs ``--turns`` turns of the benchmark workload with the
automatic checkpoint off, then reads the WAL frames each command of the LAST turn appended
and names the table or index owning each page (SQLite's ``dbstat``).

    python -m benchmarks.turn_pages                 # 300 turns, report the last
    python -m benchmarks.turn_pages --turns 2000

A diagnostic: it wraps the command line and the SQL writer of this one process.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import struct
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event as sa_event

import pico
from benchmarks.turns_bench import SCHEMA, _script
from pico.application.line import CommandLine
from pico.domain.json import JsonObject
from pico.infrastructure.sql import store, writer

FRAME_HEADER = 24
WAL_HEADER = 32


def _frame_pages(data: bytes, page_size: int) -> list[int]:
    step = FRAME_HEADER + page_size
    return [struct.unpack(">I", data[i : i + 4])[0] for i in range(0, len(data), step)]


async def measure(db: Path, turns: int) -> list[tuple[str, list[str]]]:
    wal = Path(f"{db}-wal")
    recording = False
    current = ["?"]
    page_size = [4096]
    commits: list[tuple[str, list[int]]] = []
    real_run = CommandLine.run
    real_tx = writer.RawWriter.transaction
    real_flush = writer.RawWriter.flush
    real_pragmas = store._sqlite_pragmas

    def pragmas(engine: Any, synchronous: str, *, begin: str) -> None:
        real_pragmas(engine, synchronous, begin=begin)

        @sa_event.listens_for(engine, "connect")
        def _off(dbapi_conn: Any, _rec: Any) -> None:
            dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")  # keep every frame

    async def run(self: CommandLine, build: Callable[[Any], Any], **kw: Any) -> Any:
        name = getattr(build, "__qualname__", repr(build)).replace(".<locals>", "")

        def named(tx: Any) -> Any:
            current[0] = name
            return build(tx)

        return await real_run(self, named, **kw)

    batch: list[str] = []  # commands in the open (group-committed) transaction

    def record(before: int) -> None:
        after = wal.stat().st_size if wal.exists() else 0
        if recording and after > before:
            data = wal.read_bytes()[max(before, WAL_HEADER) :]
            commits.append((" + ".join(batch), _frame_pages(data, page_size[0])))
        if after > before:
            batch.clear()

    def transaction(self: writer.RawWriter, work: Callable[[Any], None], **kw: Any) -> None:
        before = wal.stat().st_size if wal.exists() else 0
        batch.append(current[0])
        real_tx(self, work, **kw)
        record(before)

    def flush(self: writer.RawWriter) -> None:
        before = wal.stat().st_size if wal.exists() else 0
        real_flush(self)
        record(before)

    async def tool(args: JsonObject, ctx: pico.ToolContext) -> str:
        return f"contents of {args['path']}"

    store._sqlite_pragmas = pragmas
    CommandLine.run = run  # type: ignore[method-assign]
    writer.RawWriter.transaction = transaction  # type: ignore[method-assign]
    writer.RawWriter.flush = flush  # type: ignore[method-assign]
    try:
        provider = pico.FauxProvider(_script(turns), keep_requests=False)
        tools = [pico.Tool("read", "Read", SCHEMA, tool), pico.Tool("grep", "Grep", SCHEMA, tool)]
        h = await pico.Harness.open(
            f"sqlite:///{db}", session="pages", provider=provider, tools=tools
        )
        c = await h.root()
        with sqlite3.connect(db) as conn:
            page_size[0] = int(conn.execute("PRAGMA page_size").fetchone()[0])
        for i in range(turns):
            recording = i == turns - 1
            await c.prompt(f"question {i}")
        owners = _owners(db)
        await h.close()
    finally:
        store._sqlite_pragmas = real_pragmas
        CommandLine.run = real_run  # type: ignore[method-assign]
        writer.RawWriter.transaction = real_tx  # type: ignore[method-assign]
        writer.RawWriter.flush = real_flush  # type: ignore[method-assign]
    return [(name, [owners.get(p, "(page added since)") for p in pages]) for name, pages in commits]


def _owners(db: Path) -> dict[int, str]:
    with sqlite3.connect(db) as conn:
        return {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=300)
    args = ap.parse_args()
    db = Path(tempfile.mkdtemp(prefix="pico-pages-")) / "pages.db"
    commits = asyncio.run(measure(db, args.turns))
    total = 0
    print(f"pages written per command, turn {args.turns} of {args.turns}\n")
    print("| command | pages | by table or index |\n|---|---|---|")
    for name, owners in commits:
        total += len(owners)
        top = ", ".join(f"{o} {n}" for o, n in Counter(owners).most_common())
        print(f"| {name} | {len(owners)} | {top} |")
    print(f"\n{len(commits)} commits, {total} pages in the turn")
    print("(a row naming several commands is one group commit: deferred settlements joined")
    print(" by the next durable command or flush)")


if __name__ == "__main__":
    main()
