"""Commit benchmark (issue: core): a loop of commands, each appending one entry and selecting
it into context, on each backend; the plain-sqlite3 floor writing the same rows in the same
number of transactions with the same durability; per-command cost against history size; and
reopening a large session to read its last transcript page.

    python -m benchmarks.commit_bench                       # everything (PostgreSQL if
                                                            # PICO_TEST_POSTGRES_URL is set)
    python -m benchmarks.commit_bench --commands 2000 --growth 0 --reopen 0   # quick

Prints a Markdown report (also written to benchmarks/results/commit.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import pico
from pico.infrastructure.sql.store import SqlDatabase

TEXT = "x" * 120  # a short chat message


def _fresh(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def pico_loop(url: str, n: int, durability: str) -> tuple[float, list[float]]:
    """Returns commands/s and the per-command wall times (seconds)."""
    h = await pico.Harness.open(url, session=f"bench-{time.time_ns()}", durability=durability)
    c = await h.root()
    times: list[float] = []
    clock = time.perf_counter
    start = clock()
    for i in range(n):
        t0 = clock()
        await c.append("user", f"{i} {TEXT}")
        times.append(clock() - t0)
    total = clock() - start
    await h.close()
    return n / total, times


def sqlite_floor(path: Path, n: int, synchronous: str) -> float:
    """Plain sqlite3: the same tables and indexes (pico's schema), the same rows and
    statements per command (3 event rows, entry, context element after reading the last
    position, context edit, commit boundary, session head), one transaction each."""
    _fresh(path)
    SqlDatabase(f"sqlite:///{path}").close()  # create pico's schema, nothing else
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    cur = conn.cursor()
    sid = "floor"
    cur.execute("INSERT INTO pico_sessions (session_id, head, main_head) VALUES (?, 0, 0)", (sid,))
    cur.execute(
        "INSERT INTO pico_conversations (session_id, id, created_seq, inherit_state, "
        "prefix_revision) VALUES (?, 1, 1, 0, 0)",
        (sid,),
    )
    # The session, two streams and three topics, numbered as pico numbers them (0008).
    cur.execute("INSERT INTO pico_session_numbers (session_id) VALUES (?)", (sid,))
    cur.executemany(
        "INSERT INTO pico_streams (originator_id) VALUES (?)", [("c" * 32,), ("s" * 32,)]
    )
    cur.executemany(
        "INSERT INTO pico_topics (topic) VALUES (?)",
        [
            (f"pico.domain.{name}",)
            for name in (
                "conversation:Conversation.EntryAppended",
                "conversation:Conversation.ContextAppended",
                "session:Session.Committed",
            )
        ],
    )
    blob = json.dumps(
        {
            "conversation_id": 1,
            "seq": 0,
            "kind": "user",
            "content": TEXT,
            "metadata": None,
            "key": None,
            "by_task_id": None,
            "timestamp": "2026-11-30T00:00:00+00:00",
        }
    ).encode()
    start = time.perf_counter()
    seq = 1
    for i in range(n):
        entry, edit, last = seq + 1, seq + 2, seq + 2
        cur.execute("BEGIN IMMEDIATE")
        cur.executemany(
            "INSERT INTO pico_events (session_number, stream_id, originator_version, topic_id, "
            "state) VALUES ((SELECT id FROM pico_session_numbers WHERE session_id = ?), "
            "(SELECT id FROM pico_streams WHERE originator_id = ?), ?, "
            "(SELECT id FROM pico_topics WHERE topic = ?), ?)",
            [
                (
                    sid,
                    "c" * 32,
                    2 * i + 1,
                    "pico.domain.conversation:Conversation.EntryAppended",
                    blob,
                ),
                (
                    sid,
                    "c" * 32,
                    2 * i + 2,
                    "pico.domain.conversation:Conversation.ContextAppended",
                    blob[:120],
                ),
                (sid, "s" * 32, i + 1, "pico.domain.session:Session.Committed", blob[:100]),
            ],
        )
        cur.execute(
            "INSERT INTO pico_entries (session_id, id, conversation_id, kind, key, content, "
            "metadata, by_task_id, commit_end) VALUES (?, ?, 1, 'user', NULL, ?, NULL, NULL, ?)",
            (sid, entry, json.dumps(f"{i} {TEXT}"), last),
        )
        cur.execute(
            "SELECT max(position) FROM pico_context_elements WHERE session_id = ? "
            "AND conversation_id = 1",
            (sid,),
        )
        pos = cur.fetchone()[0]
        cur.execute(
            "INSERT INTO pico_context_elements (session_id, conversation_id, position, "
            "entry_id) VALUES (?, 1, ?, ?)",
            (sid, 0 if pos is None else pos + 1, entry),
        )
        cur.execute(
            "INSERT INTO pico_context_edits (session_id, conversation_id, seq, op, base, "
            "ids, removed, revision) VALUES (?, 1, ?, 'append', 0, ?, 0, 0)",
            (sid, edit, json.dumps([entry])),
        )
        cur.execute(
            "INSERT INTO pico_commits (session_id, last, first, scope) VALUES (?, ?, ?, 'main')",
            (sid, last, entry),
        )
        cur.execute(
            "UPDATE pico_sessions SET head = ?, main_head = ? WHERE session_id = ?",
            (last, last, sid),
        )
        cur.execute("COMMIT")
        seq = last
    total = time.perf_counter() - start
    conn.close()
    return n / total


#: The smallest growth run whose two windows (commands 1,000-1,500, the last 500) are apart.
GROWTH_MIN = 2000


def window_ms(times: list[float], at: int, width: int = 500) -> float:
    return statistics.median(times[at : at + width]) * 1000


async def reopen_ms(url: str, session: str, runs: int = 7) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        h = await pico.Harness.open(url, session=session)
        c = await h.root()
        page = await c.entries(order="desc", limit=50)
        samples.append((time.perf_counter() - t0) * 1000)
        assert len(page.items) == 50
        await h.close()
    return statistics.median(samples)


async def grow(url: str, n: int, session: str) -> list[float]:
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    times = []
    clock = time.perf_counter
    for i in range(n):
        t0 = clock()
        await c.append("user", f"{i} {TEXT}")
        times.append(clock() - t0)
    await h.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=5000)
    ap.add_argument("--growth", type=int, default=50000, help="0 to skip the growth run")
    ap.add_argument("--reopen", type=int, default=1, help="0 to skip the reopen timing")
    args = ap.parse_args()
    if args.commands < 1:
        ap.error("--commands must be at least 1")
    if args.growth and args.growth < GROWTH_MIN:
        # The growth run compares commands 1,000-1,500 with its last 500.
        ap.error(
            f"--growth must be 0 (no growth run) or at least {GROWTH_MIN:,}: it compares the "
            "median of commands 1,000-1,500 with that of the last 500"
        )
    n = args.commands
    tmp = Path(tempfile.mkdtemp(prefix="pico-bench-"))
    lines = [
        f"commands per run: {n}; one entry appended and selected per command",
        "",
        "| backend | durability | pico commands/s | plain sqlite3 commands/s | ratio |",
        "|---|---|---|---|---|",
    ]
    rate, _ = asyncio.run(pico_loop("memory://", n, "process"))
    lines.append(f"| memory | - | {rate:,.0f} | - | - |")
    for durability, sync in (("process", "NORMAL"), ("fsync", "FULL")):
        db = tmp / f"pico-{durability}.db"
        _fresh(db)
        rate, _ = asyncio.run(pico_loop(f"sqlite:///{db}", n, durability))
        floor = sqlite_floor(tmp / f"floor-{durability}.db", n, sync)
        lines.append(
            f"| sqlite | {durability} (synchronous={sync}) | {rate:,.0f} | "
            f"{floor:,.0f} | {floor / rate:.2f}x |"
        )
    pg = os.environ.get("PICO_TEST_POSTGRES_URL")
    if pg:
        rate, _ = asyncio.run(pico_loop(pg, n, "process"))
        lines.append(f"| postgresql | server default (fsync on) | {rate:,.0f} | - | - |")
    if args.growth:
        db = tmp / "growth.db"
        _fresh(db)
        times = asyncio.run(grow(f"sqlite:///{db}", args.growth, "growth"))
        early, late = window_ms(times, 1000), window_ms(times, args.growth - 500)
        lines += [
            "",
            "Per-command cost as history grows (SQLite, process durability, "
            "median of 500 commands):",
            "",
            "| at command | ms/command |",
            "|---|---|",
            f"| 1,000 | {early:.3f} |",
            f"| {args.growth:,} | {late:.3f} |",
            "",
            f"ratio late/early: {late / early:.2f}",
        ]
        if args.reopen:
            ms = asyncio.run(reopen_ms(f"sqlite:///{db}", "growth"))
            size = sum(
                Path(f"{db}{s}").stat().st_size for s in ("", "-wal") if Path(f"{db}{s}").exists()
            )
            lines += [
                "",
                f"Reopen a {args.growth:,}-entry SQLite session (claim included) and "
                f"read its last transcript page of 50: median {ms:.1f} ms over 7 runs; "
                f"database + WAL {size / 2**20:.1f} MiB.",
            ]
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "commit.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
