"""How a write transaction's statements travel to PostgreSQL, and what that costs the
client (issue 16/18): the same transaction — BEGIN, ten single-row INSERTs shaped like a
command's rows, COMMIT — sent

- ``pipeline``: psycopg pipeline mode, server-side parameters (what the writer does now:
  one round trip, one Sync), and
- ``simple``: ONE simple-query string with the parameters bound on the client
  (``ClientCursor.mogrify``), also one round trip.

Prints transactions/s and client CPU per transaction. The writer's CPU per command is the
bound on this 2-core machine (docs/benchmarks.md "Workers on PostgreSQL"), so this is the
measurement behind the next step there.

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        python -m benchmarks.pg_statement_shape_bench --transactions 2000
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import ClientCursor

STATEMENT = "INSERT INTO bench_shape (a, b, c) VALUES (%s, %s, %s)"


def _rows() -> list[tuple[Any, ...]]:
    return [(i, "x" * 120, b"\x00\x01" * 40) for i in range(10)]


def pipeline(conn: psycopg.Connection[Any], n: int) -> None:
    cur = conn.cursor()
    rows = _rows()
    for _ in range(n):
        with conn.pipeline():
            cur.execute("BEGIN")
            for row in rows:
                cur.execute(STATEMENT, row)
            cur.execute("COMMIT")


def simple(conn: psycopg.Connection[Any], n: int) -> None:
    cur = ClientCursor(conn)
    rows = _rows()
    for _ in range(n):
        body = "".join(cur.mogrify(STATEMENT, row) + ";" for row in rows)
        cur.execute(f"BEGIN;{body}COMMIT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("PICO_TEST_POSTGRES_URL") or os.environ["PICO_BENCH_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE bench_shape (a bigint, b text, c bytea)")
        shapes: list[tuple[str, Callable[[psycopg.Connection[Any], int], None]]] = [
            ("pipeline", pipeline),
            ("simple", simple),
        ]
        print("| shape | transactions/s | client CPU ms per transaction |")
        print("|---|---|---|")
        for _ in range(args.runs):
            for name, run in shapes:
                wall, cpu = time.perf_counter(), time.process_time()
                run(conn, args.transactions)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                print(
                    f"| {name} | {args.transactions / wall:.0f} | "
                    f"{cpu / args.transactions * 1000:.3f} |"
                )


if __name__ == "__main__":
    main()
