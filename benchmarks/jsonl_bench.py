"""Opening a long JSONL session (issue 12 "Performance"): build a session journal of N
batches through the public API — one plain command each (``Conversation.append``, one
entry per batch) — then reopen it several times, each reopen in a fresh interpreter so
no heap or cache of the previous one helps, and time ``Harness.open`` alone.

    python -m benchmarks.jsonl_bench                          # 100,000 batches, 5 reopens
    python -m benchmarks.jsonl_bench --batches 5000 --reopens 3   # quick
    python -m benchmarks.jsonl_bench --profile                # + cProfile of one reopen
    python -m benchmarks.jsonl_bench --dir D                  # reuse (or build into) D
    python -m benchmarks.jsonl_bench --dir D --reopens 0      # build only

Prints Markdown (also benchmarks/results/jsonl-open.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pico

SESSION = "long"


async def build(directory: Path, batches: int, durability: str) -> tuple[float, int]:
    h = await pico.Harness.open(f"jsonl:///{directory}", session=SESSION, durability=durability)
    root = await h.root()
    t0 = time.perf_counter()
    # Harness.open and root() commit the session's own first batches; fill up to N.
    for i in range(count_batches(directory), batches):
        await root.append("user", f"entry {i}: a short user message of about sixty bytes")
    wall = time.perf_counter() - t0
    await h.close()
    return wall, count_batches(directory)


def count_batches(directory: Path) -> int:
    """Committed batches: the main journal's lines after its header."""
    with open(directory / f"{SESSION}.jsonl", "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) - 1


async def reopen(directory: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    h = await pico.Harness.open(f"jsonl:///{directory}", session=SESSION)
    opened = time.perf_counter() - t0
    root = await h.root()
    rooted = time.perf_counter() - t0
    last = (await root.entries(order="desc", limit=1)).items[0]  # the newest entry reads
    head = h.main_head()
    await h.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"open_s": opened, "root_s": rooted, "head": head, "last_entry": last.id, "rss": peak}


def profile(directory: Path, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(reopen(directory))
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=100_000)
    ap.add_argument("--reopens", type=int, default=5)
    ap.add_argument("--durability", choices=("process", "fsync"), default="process")
    ap.add_argument("--dir", type=Path, help="an existing store to reopen, or where to build")
    ap.add_argument("--profile", action="store_true", help="cProfile one reopen")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one reopen, in this fresh interpreter
        print(json.dumps(asyncio.run(reopen(args.dir))))
        return
    directory: Path = args.dir or Path(tempfile.mkdtemp(prefix="pico-jsonl-"))
    main_file = directory / f"{SESSION}.jsonl"
    built = ""
    if not main_file.exists():
        wall, head = asyncio.run(build(directory, args.batches, args.durability))
        built = (
            f"built {head:,} batches in {wall:.1f} s ({wall / head * 1e6:.0f} µs per batch, "
            f"{args.durability} durability)"
        )
    if args.reopens == 0:  # build only
        print(built or f"{main_file} exists")
        return
    runs = []
    for _ in range(args.reopens):
        cmd = [sys.executable, "-m", "benchmarks.jsonl_bench", "--child", "--dir", str(directory)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 2**20
    opens = [r["open_s"] for r in runs]
    lines = [
        f"JSONL store at {directory}: {count_batches(directory):,} batches (main head "
        f"{runs[0]['head']:,.0f}), newest entry {runs[0]['last_entry']:,.0f}, "
        f"{size:.1f} MiB on disk" + (f"; {built}" if built else ""),
        "",
        "| reopens | open s (median) | open s (min-max) | open + root() s (median) | "
        "peak RSS MiB |",
        "|---|---|---|---|---|",
        f"| {len(runs)} | {statistics.median(opens):.2f} | {min(opens):.2f}-{max(opens):.2f} | "
        f"{statistics.median(r['root_s'] for r in runs):.2f} | "
        f"{max(r['rss'] for r in runs):.0f} |",
    ]
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "jsonl-open.md").write_text(report + "\n")
    print(report)
    if args.profile:
        print(profile(directory, args.top))


if __name__ == "__main__":
    main()
