"""Historical state reads through a fork chain (issue: scoped state).

10,000 reads of a rewindable value (and of a rewindable list) at a past position, through a
fork chain of depth 10, over a session holding N unrelated values; then the same with 10x
unrelated values. Reads/s must not depend on N: every lookup is an indexed version/range
query per fork level.

    python -m benchmarks.state_bench                    # N = 100,000 and 1,000,000
    python -m benchmarks.state_bench --unrelated 20000 --reads 2000   # quick

Prints Markdown (also benchmarks/results/state.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pico

PLAN = pico.conversation_value("plugin.plan", int)
MOVES = pico.conversation_list("game.moves", int)
BATCH = 2000  # unrelated values per command while loading


async def build(url: str, session: str, unrelated: int) -> tuple[pico.Harness, int, int]:
    h = await pico.Harness.open(url, session=session)
    root = await h.root()
    # Unrelated history: other namespaces in the chain's root, and other conversations.
    others = [await h.command(lambda tx: tx.create_conversation()) for _ in range(10)]

    def load(start: int, count: int) -> Callable[[pico.Command], None]:
        def fill(tx: pico.Command) -> None:
            for i in range(start, start + count):
                target = root.id if i % 2 == 0 else others[i % len(others)]
                address = pico.conversation_value(f"noise.{i % 50}", int, key=f"k{i}")
                tx.set_value(address, i, conversation_id=target)

        return fill

    done = 0
    while done < unrelated:
        count = min(BATCH, unrelated - done)
        await h.command(load(done, count))
        done += count
    await root.set_value(PLAN, 1)
    for i in range(5):
        await root.append_list(MOVES, i)
    chain = root
    for level in range(10):
        marker = await chain.append("user", f"level {level}")
        await chain.set_value(PLAN, 100 + level)  # after the fork boundary: must not leak
        await chain.append_list(MOVES, 100 + level)
        chain = await chain.fork(at_entry=marker)
    position = h.main_head()
    return h, chain.id, position


async def measure(url: str, unrelated: int, reads: int) -> tuple[float, float]:
    h, leaf, position = await build(url, f"state-{unrelated}-{time.time_ns()}", unrelated)
    leaf_handle = await h.conversation(leaf)
    assert leaf_handle is not None
    assert await leaf_handle.get_value(PLAN, as_of=position) == 1
    assert [e.value for e in (await leaf_handle.read_list(MOVES, as_of=position)).items] == [
        0,
        1,
        2,
        3,
        4,
    ]
    t0 = time.perf_counter()
    for _ in range(reads):
        await leaf_handle.get_value(PLAN, as_of=position)
    value_rate = reads / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(reads):
        await leaf_handle.read_list(MOVES, as_of=position, limit=10)
    list_rate = reads / (time.perf_counter() - t0)
    await h.close()
    return value_rate, list_rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unrelated", type=int, default=100_000)
    ap.add_argument("--reads", type=int, default=10_000)
    ap.add_argument("--backends", default="memory,sqlite,postgresql")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pico-state-"))
    urls = {"memory": "memory://", "sqlite": f"sqlite:///{tmp / 'state.db'}"}
    if os.environ.get("PICO_TEST_POSTGRES_URL"):
        urls["postgresql"] = os.environ["PICO_TEST_POSTGRES_URL"]
    lines = [
        f"{args.reads:,} historical reads at a past position through a fork chain of depth 10",
        "",
        "| backend | unrelated values | value reads/s | list page reads/s |",
        "|---|---|---|---|",
    ]
    for name in args.backends.split(","):
        if name not in urls:
            continue
        for n in (args.unrelated, args.unrelated * 10):
            t0 = time.perf_counter()
            value_rate, list_rate = asyncio.run(measure(urls[name], n, args.reads))
            lines.append(f"| {name} | {n:,} | {value_rate:,.0f} | {list_rate:,.0f} |")
            print(f"{name} {n}: done in {time.perf_counter() - t0:.0f}s", flush=True)
    report = "\n".join(lines)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "state.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
