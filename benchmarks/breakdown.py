"""Issue 18's gap, taken apart: where an agent turn's time goes, pico on SQLite against the
plain-sqlite3 floor, statement by statement.

Each program runs twice, each time in its own process: once plain (its wall time), once
with every ``sqlite3`` statement timed (a cursor subclass around ``execute`` and
``executemany``, installed by wrapping ``sqlite3.connect``: the statements SQLAlchemy's and
pico's own connections run alike). The timed run says how many statements of each kind a
turn runs and how long SQLite took over them (the timing's own overhead falls outside:
the timed run's wall time is longer); the plain run's wall time less that SQL time is the
program's own work, its Python. The two runs are separate processes on a VM whose speed
drifts, so a difference within ~10% is noise (the floor's own work is about that). Rows
are grouped by statement text with literals and whitespace folded; an ``executemany``
counts as one call.

    python -m benchmarks.breakdown                  # 1,000 turns each
    python -m benchmarks.breakdown --turns 300 --top 12

What it says (docs/benchmarks.md, "eighth pass"): how the gap splits between SQL the
floor also runs, SQL it does not, and the harness's own Python. Never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import re
import runpy
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.floor_bench import FLOOR

_LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+\b")
_SPACE = re.compile(r"\s+")


def _kind(statement: str) -> str:
    return _SPACE.sub(" ", _LITERALS.sub("?", statement)).strip()[:72]


class _Timed:
    """Seconds and calls per statement kind (``executemany`` counted once per call)."""

    def __init__(self, record: bool = False) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: Counter[str] = Counter()
        #: With ``record``: every connection opened (its arguments) and every statement
        #: run, in order, for ``_replay``: (connection, isolation level, how: "one",
        #: "many", "script", "commit" or "rollback", SQL, parameters, whether it raised).
        self.connections: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.log: list[tuple[int, Any, str, str, Any, bool]] | None = [] if record else None

    def add(self, how: str, sql: str, elapsed: float) -> None:
        """Count one statement of its kind and the seconds it took."""
        key = ("many: " if how == "many" else "") + _kind(sql)
        self.seconds[key] = self.seconds.get(key, 0.0) + elapsed
        self.calls[key] += 1

    def kinds(self) -> dict[str, list[float]]:
        """Each kind's [calls, seconds], as the JSON line carries them."""
        return {k: [self.calls[k], self.seconds[k]] for k in self.calls}

    def install(self) -> None:
        timed = self
        clock = time.perf_counter

        def note(cur: Any, how: str, sql: str, params: Any, t0: float, failed: bool) -> None:
            timed.add(how, sql, clock() - t0)  # timed before the kind is worked out
            if timed.log is not None:
                conn = cur.connection
                timed.log.append((conn.number, conn.isolation_level, how, sql, params, failed))

        class Cursor(sqlite3.Cursor):
            def execute(self, sql: str, *args: Any) -> Any:
                t0, failed = clock(), True
                try:
                    result = super().execute(sql, *args)
                    failed = False
                    return result
                finally:
                    note(self, "one", sql, args[0] if args else (), t0, failed)

            def executemany(self, sql: str, rows: Any) -> Any:
                rows = list(rows) if timed.log is not None else rows
                t0, failed = clock(), True
                try:
                    result = super().executemany(sql, rows)
                    failed = False
                    return result
                finally:
                    note(self, "many", sql, rows, t0, failed)

        class Connection(sqlite3.Connection):
            number = -1

            def cursor(self, factory: Any = Cursor) -> Any:
                return super().cursor(factory)

            def execute(self, sql: str, *args: Any) -> Any:
                return self.cursor().execute(sql, *args)

            def executemany(self, sql: str, rows: Any) -> Any:
                return self.cursor().executemany(sql, rows)

            def commit(self) -> None:  # the DBAPI's, as SQLAlchemy ends a transaction
                t0 = clock()
                super().commit()
                note(self.cursor(), "commit", "commit()", (), t0, False)

            def rollback(self) -> None:
                t0 = clock()
                super().rollback()
                note(self.cursor(), "rollback", "rollback()", (), t0, False)

            def executescript(self, script: str) -> Any:  # the floor's schema
                t0 = clock()
                result = super().executescript(script)
                note(self.cursor(), "script", script, (), t0, False)
                return result

        connect = sqlite3.connect

        def timed_connect(*args: Any, **kwargs: Any) -> Any:
            kwargs["factory"] = Connection
            conn = connect(*args, **kwargs)
            conn.number = len(timed.connections)
            timed.connections.append((args, {k: v for k, v in kwargs.items() if k != "factory"}))
            return conn

        sqlite3.connect = timed_connect
        sqlite3.dbapi2.connect = timed_connect


def _child(program: str, turns: int, timed: bool, record: str | None) -> None:
    """Run one program (in this process) and print one JSON line: wall seconds and, timed,
    the statements by kind (with ``record``, pico's statements pickled to that file)."""
    probe = _Timed(record=record is not None)
    if timed:
        probe.install()
    folder = Path(tempfile.mkdtemp(prefix="pico-breakdown-"))
    from benchmarks.turns_bench import run  # pico imported before the clock starts

    t0 = time.perf_counter()
    if program == "floor":
        sys.argv = [str(FLOOR), str(turns), "NORMAL"]
        runpy.run_path(str(FLOOR), run_name="__main__")  # prints its own JSON line first
    else:
        # The harness's open and close are counted, as the floor's connect and schema are.
        asyncio.run(run(f"sqlite:///{folder / 'turns.db'}", turns, 16))
    wall = time.perf_counter() - t0
    if record is not None:
        with open(record, "wb") as f:
            pickle.dump((probe.connections, probe.log), f)
    print(json.dumps({"wall": wall, "kinds": probe.kinds()}))


def _replay(record: str) -> None:
    """Run a recorded program's statements again, in order, on fresh connections to fresh
    files (each recorded database file moved to a new folder), with nothing else between
    them: what SQLite alone takes for them. Prints one JSON line: wall seconds."""
    with open(record, "rb") as f:
        connections, log = pickle.load(f)
    fresh = Path(tempfile.mkdtemp(prefix="pico-replay-"))
    moved: dict[str, str] = {}  # a recorded file's path -> its fresh path

    def move(target: str) -> str:
        path = target[len("file:") :].split("?")[0] if target.startswith("file:") else target
        new = moved.setdefault(path, str(fresh / f"{len(moved)}-{Path(path).name}"))
        return target.replace(path, new)

    opened: dict[int, sqlite3.Connection] = {}
    cursors: dict[int, sqlite3.Cursor] = {}
    tally = _Timed()
    clock = time.perf_counter
    t0 = clock()
    for number, isolation, how, sql, params, failed in log:
        conn = opened.get(number)
        if conn is None:
            args, kwargs = connections[number]
            conn = opened[number] = sqlite3.connect(move(str(args[0])), *args[1:], **kwargs)
            cursors[number] = conn.cursor()
        if conn.isolation_level != isolation:
            conn.isolation_level = isolation
        cur = cursors[number]
        began = clock()
        try:
            if how == "many":
                cur.executemany(sql, params)
            elif how == "commit":
                conn.commit()
            elif how == "rollback":
                conn.rollback()
            elif how == "script":
                conn.executescript(sql)
            else:
                cur.execute(sql, params)
                cur.fetchall()
        except sqlite3.Error:
            if not failed:
                raise
        tally.add(how, sql, clock() - began)
    wall = clock() - t0
    for conn in opened.values():
        conn.close()
    print(json.dumps({"wall": wall, "kinds": tally.kinds()}))


def _run(program: str, turns: int, timed: bool, record: str | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.breakdown", "--child", program]
    command += ["--turns", str(turns)] + (["--timed"] if timed else [])
    command += [] if record is None else ["--record", record]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--top", type=int, default=16, help="statement kinds listed per program")
    ap.add_argument("--child", choices=("floor", "pico", "replay"), help=argparse.SUPPRESS)
    ap.add_argument("--timed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--record", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "replay":
        _replay(args.record)
        return
    if args.child:
        _child(args.child, args.turns, args.timed, args.record)
        return
    n = args.turns
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pico-breakdown-") as tmp:
        for program in ("floor", "pico"):
            record = str(Path(tmp) / f"{program}.pickle")
            plain = _run(program, n, timed=False)
            timed = _run(program, n, timed=True, record=record)
            replayed = _run("replay", n, timed=False, record=record)
            kinds = replayed["kinds"]
            replay = sum(s for _, s in kinds.values())
            commit = sum(s for k, (_, s) in kinds.items() if k.lower() == "commit")
            statements = sum(c for c, _ in kinds.values())
            inline = sum(s for _, s in timed["kinds"].values())
            wall, inline_ms, replay_ms = (x * 1000 / n for x in (plain["wall"], inline, replay))
            summary.append(
                f"| {program} | {wall:.2f} | {statements / n:.1f} | {inline_ms:.2f} | "
                f"{replay_ms:.2f} | {commit * 1000 / n:.2f} | {max(wall - replay_ms, 0.0):.2f} |"
            )
            print(f"\n{program}: statements a turn, by kind (replayed alone, {n:,} turns)\n")
            print("| calls a turn | us a turn | statement |")
            print("|---|---|---|")
            ranked = sorted(kinds.items(), key=lambda kv: -kv[1][1])
            for kind, (calls, seconds) in ranked[: args.top]:
                print(f"| {calls / n:.2f} | {seconds * 1e6 / n:.0f} | `{kind}` |")
    print(f"\nPer turn ({n:,} turns):\n")
    print(
        "| program | wall ms | statement calls | SQL ms inside the run | SQL ms replayed alone | "
        "of which COMMIT ms | wall - replayed (own work) ms |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
