"""Migration benchmark (issue 13): copy one session of N events from SQLite to PostgreSQL
(and, for comparison, to another SQLite file and to JSONL) with ``pico.migrate``, and
report events/s for the copy (batch by batch, each batch with its projection rows in one
target transaction) and for the whole run including the proof (both logs streamed and
compared, the target's chain verified, both read models compared row by row).

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        python -m benchmarks.migrate_bench --events 100000

The session is a conversation of one-entry appends (about 4 events per command), built
once per run in a scratch directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import pico
from pico.infrastructure.migrate import migrate

TEXT = "x" * 120  # a short chat message


async def build(url: str, session: str, events: int) -> int:
    """Append until the session holds at least ``events`` events; returns the count."""
    h = await pico.Harness.open(url, session=session)
    c = await h.root()
    i = 0
    while h.audit_count() < events:
        for _ in range(500):
            await c.append("user", f"{i} {TEXT}")
            i += 1
    count = h.audit_count()
    await h.close()
    return count


async def run(source: str, target: str, session: str, name: str) -> tuple[int, float, float]:
    """(events, copy seconds, total seconds)."""
    start = time.perf_counter()
    copied = [start]

    def progress(done: int, total: int) -> None:
        if done == total:
            copied[0] = time.perf_counter()

    report = await migrate(source, target, session=session, as_name=name, progress=progress)
    total = time.perf_counter() - start
    assert report.ok, "\n".join(report.lines())
    return report.events, copied[0] - start, total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events in the session")
    args = parser.parse_args()
    postgres = os.environ.get("PICO_TEST_POSTGRES_URL")
    with tempfile.TemporaryDirectory() as tmp:
        source = f"sqlite:///{Path(tmp) / 'source.db'}"
        session = f"bench-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        n = await build(source, session, args.events)
        print(f"built a session of {n} events on SQLite in {time.perf_counter() - t0:.1f} s")
        targets = [("SQLite", f"sqlite:///{Path(tmp) / 'target.db'}")]
        targets.append(("JSONL", f"jsonl:///{Path(tmp) / 'jsonl'}"))
        if postgres:
            targets.insert(0, ("PostgreSQL", postgres))
        else:
            print("PICO_TEST_POSTGRES_URL is not set: PostgreSQL skipped")
        print()
        print("| target | events | copy s | copy events/s | with proof s | with proof events/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, url in targets:
            name = f"{session}-{label.lower()}"
            events, copy, total = await run(source, url, session, name)
            print(
                f"| {label} | {events:,} | {copy:.2f} | {events / copy:,.0f} | {total:.2f} | "
                f"{events / total:,.0f} |"
            )


if __name__ == "__main__":
    asyncio.run(main())
