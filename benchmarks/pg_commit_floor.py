"""The PostgreSQL floor for one session's commits (issue 16): a plain psycopg loop of
one-row ``BEGIN; INSERT; COMMIT`` strings on one connection, with the commit waiting for
its WAL flush (``synchronous_commit = on``) and not (``off``, what pico's default
``durability="process"`` uses). Run it beside pico's benchmarks: it tells a slow disk or a
busy machine from a slow pico.

    PICO_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:25432/pico_test \\
        python -m benchmarks.pg_commit_floor --commits 2000
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=2000)
    args = parser.parse_args()
    url = os.environ.get("PICO_TEST_POSTGRES_URL") or os.environ["PICO_BENCH_URL"]
    table = f"pico_floor_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (a bigint, b text)")
        try:
            print("| synchronous_commit | commits/s | ms per commit |\n|---|---|---|")
            for mode in ("on", "off"):
                conn.execute(f"SET synchronous_commit = {mode}")
                start = time.perf_counter()
                for i in range(args.commits):
                    conn.execute(f"BEGIN; INSERT INTO {table} VALUES ({i}, 'x'); COMMIT")
                took = time.perf_counter() - start
                print(f"| {mode} | {args.commits / took:,.0f} | {took / args.commits * 1000:.3f} |")
        finally:
            conn.execute(f"DROP TABLE {table}")


if __name__ == "__main__":
    main()
