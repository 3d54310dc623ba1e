"""Pages written per command in one agent turn (the 2,000-turn workload's turn), by table;
what a COMMIT costs per page; the SQL statements a turn runs.

Wall time on a shared VM varies 10-30% run to run; the number of database pages a command
writes to the SQLite WAL does not. This runs ``--turns`` turns of the benchmark workload with
the automatic checkpoint off, then reads the WAL frames each command of the LAST turn appended
and names the table or index owning each page (SQLite's ``dbstat``).

Over every turn after the first tenth it also times each COMMIT of a group-committed batch
(``RawWriter.flush``: the COMMIT statement alone) against the pages it appended, and fits
``µs = fixed + per page * pages`` (least squares; checkpoints are off, so none is inside);
and it counts the statements SQLite ran (its trace callback: every statement of every
connection, reads, BEGIN and COMMIT included), by shape (literals and numbers elided).

    python -m benchmarks.turn_pages                 # 300 turns, report the last
    python -m benchmarks.turn_pages --turns 2000

A diagnostic: it wraps the command line and the SQL writer of this one process. The fit's
times are wall times (noisy here); pages and statement counts are deterministic.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import statistics
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
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


#: A statement's shape: its text with quoted strings, blobs and numbers elided.
_LITERALS = re.compile(r"x'[0-9a-fA-F]*'|'(?:[^']|'')*'|\b\d+(?:\.\d+)?\b")


def shape(statement: str) -> str:
    """``statement`` (as SQLite's trace callback gives it: values bound) with every
    literal replaced by ``?``, whitespace collapsed: one shape a statement kind."""
    return " ".join(_LITERALS.sub("?", statement).split())


@dataclass
class Measured:
    """What ``measure`` saw: the last turn's commits (command names, page owners); the
    timed group-commit COMMITs (pages appended, seconds) and the statements by shape over
    ``counted`` turns."""

    commits: list[tuple[str, list[str]]]
    counted: int = 0
    flushes: list[tuple[int, float]] = field(default_factory=list)
    statements: Counter[str] = field(default_factory=Counter)

    def fit(self) -> tuple[float, float]:
        """Least squares ``seconds = fixed + per_page * pages`` over the timed COMMITs:
        (fixed, per_page), in seconds."""
        if len(self.flushes) < 2:
            raise ValueError("fewer than two timed COMMITs: run more turns")
        pages = [p for p, _ in self.flushes]
        seconds = [t for _, t in self.flushes]
        if len(set(pages)) == 1:  # every COMMIT the same size: no slope to fit
            return statistics.fmean(seconds), 0.0
        slope, intercept = statistics.linear_regression(pages, seconds)
        return intercept, slope


def _frame_pages(data: bytes, page_size: int) -> list[int]:
    step = FRAME_HEADER + page_size
    return [struct.unpack(">I", data[i : i + 4])[0] for i in range(0, len(data), step)]


async def measure(db: Path, turns: int) -> Measured:
    wal = Path(f"{db}-wal")
    recording = False
    counting = False
    measured = Measured([])
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

            def traced(statement: str) -> None:
                if counting:
                    measured.statements[shape(statement)] += 1

            dbapi_conn.set_trace_callback(traced)

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
        pending = self.pending
        started = time.perf_counter()
        real_flush(self)
        seconds = time.perf_counter() - started
        if counting and pending:
            after = wal.stat().st_size if wal.exists() else 0
            measured.flushes.append(((after - before) // (FRAME_HEADER + page_size[0]), seconds))
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
        first_counted = turns // 10
        for i in range(turns):
            recording = i == turns - 1
            counting = i >= first_counted
            await c.prompt(f"question {i}")
        counting = False
        measured.counted = turns - first_counted
        owners = _owners(db)
        await h.close()
    finally:
        store._sqlite_pragmas = real_pragmas
        CommandLine.run = real_run  # type: ignore[method-assign]
        writer.RawWriter.transaction = real_tx  # type: ignore[method-assign]
        writer.RawWriter.flush = real_flush  # type: ignore[method-assign]
    measured.commits = [
        (name, [owners.get(p, "(page added since)") for p in pages]) for name, pages in commits
    ]
    return measured


def _owners(db: Path) -> dict[int, str]:
    with sqlite3.connect(db) as conn:
        return {int(p): str(n) for n, p in conn.execute("SELECT name, pageno FROM dbstat")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--top", type=int, default=25, help="statement shapes listed")
    args = ap.parse_args()
    if args.turns < 20:
        ap.error("--turns must be at least 20 (the first tenth is not counted)")
    db = Path(tempfile.mkdtemp(prefix="pico-pages-")) / "pages.db"
    measured = asyncio.run(measure(db, args.turns))
    total = 0
    print(f"pages written per command, turn {args.turns} of {args.turns}\n")
    print("| command | pages | by table or index |\n|---|---|---|")
    for name, owners in measured.commits:
        total += len(owners)
        top = ", ".join(f"{o} {n}" for o, n in Counter(owners).most_common())
        print(f"| {name} | {len(owners)} | {top} |")
    print(f"\n{len(measured.commits)} commits, {total} pages in the turn")
    print("(a row naming several commands is one group commit: deferred settlements joined")
    print(" by the next durable command or flush)")
    n, turns = len(measured.flushes), measured.counted
    fixed, per_page = measured.fit()
    pages = sum(p for p, _ in measured.flushes) / n
    mean = sum(t for _, t in measured.flushes) / n
    print(
        f"\ngroup-commit COMMITs over the last {turns} turns: {n / turns:.2f} a turn, "
        f"{pages:.1f} pages and {mean * 1e6:.0f} µs each; fit: {fixed * 1e6:.0f} µs "
        f"+ {per_page * 1e6:.2f} µs a page"
    )
    count = sum(measured.statements.values())
    print(f"\nSQL statements a turn: {count / turns:.1f}\n")
    print("| a turn | statement |\n|---|---|")
    for text, k in measured.statements.most_common(args.top):
        print(f"| {k / turns:.2f} | `{text[:110]}` |")


if __name__ == "__main__":
    main()
