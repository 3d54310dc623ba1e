"""Tamper evidence costs (issue 13, "Performance").

    python -m benchmarks.chain_bench cost [--turns 2000]    # the chain's share of a turn
    python -m benchmarks.chain_bench ab [--turns 2000] [--rounds 3]   # with vs without it
    python -m benchmarks.chain_bench verify [--events 1000000] [--backend sqlite]

``cost`` runs the seed's 2,000-turn workload (benchmarks/turns_bench.py) on SQLite and
times ``seal_boundary`` in place (the digest over the batch's stored bodies and the link
written into the boundary) against the same run's CPU time. ``ab`` runs the same workload,
alternating rounds with the chain and with ``seal_boundary`` replaced by a stub that writes the
placeholder and hashes nothing (everything else identical), and reports wall and CPU time
of each. ``verify`` builds a session of about N stored events (commands
of 100 appended entries: ~1 event per entry) and measures ``pico.verify`` (every event read,
decoded, schema-checked and hashed) in events per second.

Prints Markdown (also benchmarks/results/chain-*.md).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import pico
from benchmarks import turns_bench
from pico.infrastructure import storage
from pico.infrastructure.chain import PLACEHOLDER, seal_boundary

PER_COMMAND = 100


def cost(turns: int) -> str:
    """The workload with ``seal_boundary`` timed in place (two clock reads around each
    call; a profiler's per-call overhead would inflate this many-small-calls path)."""
    tmp = Path(tempfile.mkdtemp(prefix="pico-chain-"))
    url = f"sqlite:///{tmp / 'turns.db'}"
    spent = [0.0, 0]

    def timed(previous: str, batch: list[Any]) -> str:
        t0 = time.perf_counter()
        try:
            return seal_boundary(previous, batch)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    setattr(storage, "seal_boundary", timed)  # noqa: B010
    try:
        _, wall, cpu = asyncio.run(turns_bench.run(url, turns, 16))
    finally:
        setattr(storage, "seal_boundary", seal_boundary)  # noqa: B010
    sealed, calls = spent[0], int(spent[1])
    return "\n".join(
        [
            f"{turns:,} faux turns, two tools per turn, SQLite (process durability); "
            "sealing timed in place",
            "",
            "| boundaries sealed | sealing s | us per seal | run wall s | run CPU s | "
            "share of CPU |",
            "|---|---|---|---|---|---|",
            f"| {calls:,} | {sealed:.3f} | {1e6 * sealed / max(calls, 1):.1f} | {wall:.1f} | "
            f"{cpu:.1f} | {100 * sealed / cpu:.2f}% |",
        ]
    )


def _no_chain(previous: str, batch: list[Any]) -> str:
    return PLACEHOLDER


def ab(turns: int, rounds: int) -> str:
    results: dict[str, list[tuple[float, float]]] = {"chain": [], "no chain": []}
    real = seal_boundary
    for _ in range(rounds):
        for label in ("chain", "no chain"):
            # The module global storage.save calls: every other line of the run is the same.
            setattr(storage, "seal_boundary", real if label == "chain" else _no_chain)  # noqa: B010
            tmp = Path(tempfile.mkdtemp(prefix="pico-chain-ab-"))
            _, wall, cpu = asyncio.run(turns_bench.run(f"sqlite:///{tmp / 't.db'}", turns, 16))
            results[label].append((wall, cpu))
    setattr(storage, "seal_boundary", real)  # noqa: B010
    rows = []
    for label, runs in results.items():
        walls = sorted(w for w, _ in runs)
        cpus = sorted(c for _, c in runs)
        rows.append(f"| {label} | {walls[len(walls) // 2]:.2f} | {cpus[len(cpus) // 2]:.2f} |")
    chain_cpu = sorted(c for _, c in results["chain"])[rounds // 2]
    bare_cpu = sorted(c for _, c in results["no chain"])[rounds // 2]
    return "\n".join(
        [
            f"{turns:,} faux turns, two tools per turn, SQLite (process durability); median of "
            f"{rounds} alternating rounds",
            "",
            "| run | wall s | CPU s |",
            "|---|---|---|",
            *rows,
            "",
            f"chain share of CPU time: {100 * (chain_cpu - bare_cpu) / chain_cpu:.1f}%",
        ]
    )


async def _build(url: str, events: int) -> int:
    async with await pico.Harness.open(url, session="audit") as h:
        c = await h.root()
        cid = c.id
        while h.head() < events:

            def build(tx: pico.Command) -> None:
                ids = [
                    tx.append_entry(cid, "user", f"message {i} of a long session")
                    for i in range(PER_COMMAND)
                ]
                tx.append_context(cid, ids)

            await h.command(build)
        return await asyncio.to_thread(lambda: h.audit_count(after=0))


def verify(events: int, backend: str) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="pico-verify-"))
    url = {"sqlite": f"sqlite:///{tmp / 'audit.db'}", "jsonl": f"jsonl:///{tmp}"}[backend]
    t0 = time.perf_counter()
    stored = asyncio.run(_build(url, events))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = asyncio.run(pico.verify(url, session="audit"))
    took = time.perf_counter() - t0
    assert report.ok and report.events == stored, report.summary()
    return "\n".join(
        [
            f"`pico.verify` of one session, {backend}: {stored:,} stored events "
            f"({PER_COMMAND} entries per command; built in {built:.0f} s)",
            "",
            "| events | verify s | events/s |",
            "|---|---|---|",
            f"| {stored:,} | {took:.1f} | {stored / took:,.0f} |",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--turns", type=int, default=2000)
    a = sub.add_parser("ab")
    a.add_argument("--turns", type=int, default=2000)
    a.add_argument("--rounds", type=int, default=3)
    v = sub.add_parser("verify")
    v.add_argument("--events", type=int, default=1_000_000)
    v.add_argument("--backend", choices=("sqlite", "jsonl"), default="sqlite")
    args = ap.parse_args()
    if args.what == "cost":
        report = cost(args.turns)
    elif args.what == "ab":
        report = ab(args.turns, args.rounds)
    else:
        report = verify(args.events, args.backend)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"chain-{args.what}.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
