"""Issue 18's comparison in instructions: what an agent turn costs pico and the plain-sqlite3
floor, counted by callgrind (valgrind) instead of timed. Wall time on this VM drifts by a
quarter within the hour; an instruction count is the same twice for the same code and input,
whatever else the machine does, so it shows a change's effect that timing cannot.

For each program it counts the instructions of a run of LOW turns and of HIGH turns (each
in its own process under ``valgrind --tool=callgrind``) and prints
``(I(HIGH) - I(LOW)) / (HIGH - LOW)``: the instructions of one turn, start-up and set-up
cancelled out. The programs are the floor (``../shared/bench/floor_turns.py TURNS NORMAL``)
and ``benchmarks.turns_bench`` on SQLite and on the memory backend; ``floor_copy`` and
``floor_plus`` (not run unless named) are ``benchmarks.floor_plus``'s copy of the floor
without and with pico's stored form (compressed bodies, the hash chain, an asyncio task a
commit).

    python -m benchmarks.instructions                      # floor, SQLite, memory
    python -m benchmarks.instructions --only memory --low 20 --high 120
    python -m benchmarks.instructions --only command --low 1000 --high 3000
    python -m benchmarks.instructions --only floor --only floor_copy --only floor_plus

``command`` is not a turn but one command that sets one session value
(``benchmarks.command_loop``, memory backend): the fixed cost every command pays; its LOW
and HIGH count commands.

Every program runs with ``PYTHONHASHSEED=0``: with a random seed the same code's count
moves by about ±0.5% from run to run (dict and set probes), as much as a change measures.

What it does not count: time in the kernel (the floor's writes and fsyncs are most of its
wall time) and waiting. The issue's targets are wall-time ratios (``benchmarks.floor_bench``);
this is the yardstick for a change's cost on the CPU. Never asserted: it reports.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.floor_bench import FLOOR

_COLLECTED = re.compile(r"Collected : (\d+)")
#: Every program runs with one fixed string-hash seed: with Python's random one, dict and
#: set probes differ run to run, and the same code counted 10.715-10.813 M a memory turn
#: (three runs, ±0.5%), as large as the changes this measures.
HASH_SEEDED = {**os.environ, "PYTHONHASHSEED": "0"}

PROGRAMS: dict[str, Callable[[int], list[str]]] = {
    "floor": lambda turns: [sys.executable, str(FLOOR), str(turns), "NORMAL"],
    "sqlite": lambda turns: [sys.executable, "-m", "benchmarks.turns_bench", "--turns", str(turns)],
    "memory": lambda turns: [
        sys.executable,
        *("-m", "benchmarks.turns_bench", "--memory", "--turns", str(turns)),
    ],
    # The floor's copy in ``benchmarks.floor_plus`` (the same commits as the floor), and
    # that copy with pico's stored form (compressed bodies, the chain, a task a commit):
    # what the stored form alone costs a turn before any harness logic runs.
    "floor_copy": lambda turns: [
        sys.executable,
        *("-m", "benchmarks.floor_plus", "--rounds", "1", "--only", "plain"),
        *("--turns", str(turns)),
    ],
    "floor_plus": lambda turns: [
        sys.executable,
        *("-m", "benchmarks.floor_plus", "--rounds", "1", "--only", "all"),
        *("--turns", str(turns)),
    ],
    # Not a turn: one command that sets one value (memory backend), the fixed cost every
    # command of a turn pays; LOW and HIGH count commands.
    "command": lambda commands: [
        sys.executable,
        *("-m", "benchmarks.command_loop", "--commands", str(commands)),
    ],
}


#: Counted only when ``--only`` names them.
ON_REQUEST = frozenset({"floor_copy", "floor_plus"})


def instructions(command: list[str]) -> int:
    """The instructions callgrind counts for ``command`` (its output file thrown away)."""
    with tempfile.TemporaryDirectory(prefix="pico-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        try:
            run = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
                capture_output=True,
                text=True,
                env=HASH_SEEDED,
            )
        except FileNotFoundError:
            raise SystemExit(
                "valgrind is not installed (Debian: apt-get install valgrind)"
            ) from None
    found = _COLLECTED.search(run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(command)} under callgrind failed:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def per_turn(program: str, low: int, high: int) -> float:
    make = PROGRAMS[program]
    return (instructions(make(high)) - instructions(make(low))) / (high - low)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--low", type=int, default=20, help="turns of the shorter run")
    ap.add_argument("--high", type=int, default=120, help="turns of the longer run")
    ap.add_argument("--only", choices=tuple(PROGRAMS), action="append")
    args = ap.parse_args()
    if args.high <= args.low:
        raise SystemExit("--high must be more turns than --low")
    chosen = args.only or [p for p in PROGRAMS if p not in ON_REQUEST]
    counts = {p: per_turn(p, args.low, args.high) for p in chosen}
    print(f"Instructions per turn (callgrind, turns {args.low}-{args.high}):\n")
    print("| program | M instructions a turn (a command for `command`) | against the floor |")
    print("|---|---|---|")
    base = counts.get("floor")
    for program, count in counts.items():
        ratio = "-" if base is None else f"{count / base:.2f}x"
        print(f"| {program} | {count / 1e6:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
