"""Issue 18's comparison: the seed's 2,000-turn workload, pico against the plain-sqlite3 floor,
interleaved in one process tree so both see the same machine (this VM's speed drifts 30-40%
within an hour: only ratios from the same round compare).

Each round runs, one after the other, each in its own process:

1. the floor at ``synchronous=NORMAL`` (``../shared/bench/floor_turns.py TURNS NORMAL``);
2. pico on SQLite, process durability (``benchmarks.turns_bench``);
3. pico on the memory backend (``benchmarks.turns_bench --memory``);
4. the floor at ``synchronous=FULL``;
5. pico on SQLite with ``durability="fsync"``.

and prints one Markdown row per round: wall seconds of each, the three ratios the issue
sets targets for (SQLite / floor NORMAL <= 2.5x, memory / floor NORMAL <= 1.5x, fsync /
floor FULL <= 2.5x), each run's last-100 / first-100 turns (<= 1.1x), and the bytes
(pico's database + WAL after close against the floor's database, <= 1.5x).

    python -m benchmarks.floor_bench                    # 2 rounds of 2,000 turns
    python -m benchmarks.floor_bench --rounds 3 --turns 500
    python -m benchmarks.floor_bench --only sqlite      # floor NORMAL + SQLite only

Never asserted: a benchmark reports (docs/benchmarks.md records the numbers).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

FLOOR = Path(__file__).resolve().parents[2] / "shared" / "bench" / "floor_turns.py"

#: The row turns_bench prints: wall, CPU, RSS, MiB, first, last, last/first.
_ROW = re.compile(
    r"^\| ([\d.]+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", re.M
)


def floor(turns: int, sync: str) -> dict[str, float]:
    if not FLOOR.exists():
        raise SystemExit(f"the floor is not at {FLOOR} (the shared/ folder beside the checkout)")
    out = subprocess.run(
        [sys.executable, str(FLOOR), str(turns), sync], capture_output=True, text=True, check=True
    ).stdout
    data = json.loads(out)
    return {
        "wall": float(data["wall_s"]),
        "ratio": float(data["last100_over_first100"]),
        "mib": float(data["db_mb"]) * 1e6 / 2**20,
    }


def pico(turns: int, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.turns_bench", "--turns", str(turns), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    m = _ROW.search(out)
    if m is None:
        raise SystemExit(f"turns_bench printed no result row:\n{out}")
    wall, cpu, _rss, mib, _first, _last, ratio = (float(g) for g in m.groups())
    return {"wall": wall, "cpu": cpu, "mib": mib, "ratio": ratio}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=("sqlite", "memory", "fsync"), default=None)
    args = ap.parse_args()
    want = {args.only} if args.only else {"sqlite", "memory", "fsync"}
    print(
        f"{args.turns:,} turns, two tools each; every column is seconds of wall time unless "
        "it says otherwise; ratios against the floor of the same round\n"
    )
    print(
        "| round | floor NORMAL | SQLite (CPU) | memory | floor FULL | SQLite fsync (CPU) | "
        "SQLite / floor | memory / floor | fsync / FULL | last/first 100: floor, SQLite, "
        "memory, fsync | MiB: pico, floor, ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"SQLite": [], "memory": [], "fsync": []}
    for r in range(1, args.rounds + 1):
        normal = floor(args.turns, "NORMAL")
        sq = pico(args.turns) if "sqlite" in want else None
        mem = pico(args.turns, "--memory") if "memory" in want else None
        full = floor(args.turns, "FULL") if "fsync" in want else None
        fs = pico(args.turns, "--durability", "fsync") if "fsync" in want else None

        def cell(run: dict[str, float] | None, cpu: bool = False) -> str:
            if run is None:
                return "-"
            return f"{run['wall']:.2f} ({run['cpu']:.1f})" if cpu else f"{run['wall']:.2f}"

        def ratio(run: dict[str, float] | None, base: dict[str, float] | None) -> str:
            return "-" if run is None or base is None else f"{run['wall'] / base['wall']:.2f}x"

        for name, run, base in (
            ("SQLite", sq, normal),
            ("memory", mem, normal),
            ("fsync", fs, full),
        ):
            if run is not None and base is not None:
                ratios[name].append(run["wall"] / base["wall"])
        lasts = ", ".join("-" if x is None else f"{x['ratio']:.2f}" for x in (normal, sq, mem, fs))
        size = (
            f"{sq['mib']:.1f}, {normal['mib']:.1f}, {sq['mib'] / normal['mib']:.2f}x"
            if sq is not None
            else "-"
        )
        print(
            f"| {r} | {normal['wall']:.2f} | {cell(sq, True)} | {cell(mem)} | {cell(full)} | "
            f"{cell(fs, True)} | {ratio(sq, normal)} | {ratio(mem, normal)} | "
            f"{ratio(fs, full)} | {lasts} | {size} |",
            flush=True,
        )
    print()
    print(summary(ratios))


#: The issue's targets: each ratio's ceiling.
TARGETS = {"SQLite": 2.5, "memory": 1.5, "fsync": 2.5}


def summary(ratios: dict[str, list[float]]) -> str:
    """One line over the rounds: each measured ratio's median and range against its
    target, and in how many rounds it was met (one round says little on a VM whose speed
    drifts; the median of several says more)."""
    parts = []
    for name, values in ratios.items():
        if not values:
            continue
        met = sum(v <= TARGETS[name] for v in values)
        parts.append(
            f"{name} / floor median {statistics.median(values):.2f}x "
            f"(range {min(values):.2f}-{max(values):.2f}x; target {TARGETS[name]}x, "
            f"met in {met} of {len(values)})"
        )
    return "; ".join(parts) if parts else "no ratio measured"


if __name__ == "__main__":
    main()
