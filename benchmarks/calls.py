"""Python-level calls an agent turn makes (issue 18, fourteenth pass): the seed's turn
workload (``benchmarks.turns_bench``) under ``sys.setprofile``, every Python frame entered
counted by function and caller, divided by the turns.

Once the profile was flat, the count of calls was the lead that paid: a call Python makes
on C's behalf (a ``UUID.__hash__`` for a dict lookup, a property, a sort's key function,
a generator context manager) costs ~1,000-2,500 instructions against ~100-200 for a call
the interpreter inlines, and ``cProfile`` either hides them or lists them apart from what
caused them. ``--match`` keeps the functions whose ``file:line(name)`` holds the text.

    python -m benchmarks.calls                            # memory backend, 300 turns
    python -m benchmarks.calls --backend sqlite --match infrastructure
    python -m benchmarks.calls --turns 100 --top 80

Counts, never times: the profile hook makes the run several times slower. Never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks import turns_bench

_ROOTS = (str(Path(__file__).resolve().parents[1]) + "/", sys.prefix + "/", sys.base_prefix + "/")


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for root in _ROOTS:
        path = path.replace(root, "")
    return f"{path}:{code.co_firstlineno}({code.co_name})"


async def count(url: str, turns: int) -> Counter[tuple[str, str]]:
    """(function, its caller's name) -> frames entered, over ``turns`` turns on ``url``."""
    calls: Counter[tuple[str, str]] = Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            back = frame.f_back
            calls[(_where(frame), back.f_code.co_name if back is not None else "?")] += 1

    sys.setprofile(hook)
    try:
        await turns_bench.run(url, turns, 16)
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("memory", "sqlite"), default="memory")
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--match", default="", help="only functions whose place holds this")
    ap.add_argument("--top", type=int, default=50)
    args = ap.parse_args()
    if args.turns < 1:
        raise SystemExit("--turns must be at least 1")
    with tempfile.TemporaryDirectory(prefix="pico-calls-") as tmp:
        url = turns_bench.backend_url(args.backend, Path(tmp))
        calls = asyncio.run(count(url, args.turns))
    total = sum(calls.values())
    print(f"{total / args.turns:.1f} Python calls a turn ({args.backend}, {args.turns} turns)")
    shown = [(k, v) for k, v in calls.most_common() if args.match in k[0]][: args.top]
    for (where, caller), n in shown:
        print(f"{n / args.turns:8.1f}  {where}  <- {caller}")


if __name__ == "__main__":
    main()
