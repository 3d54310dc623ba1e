"""The fixed cost of one command (issue 18): N commands that each set one session value,
nothing else, on one backend. An agent turn is ten commands; what the smallest command
costs is the part of a turn's cost every command pays (the command line, its events, their
encoding, the chain link, the projection, the save), whatever its flow does.

    python -m benchmarks.command_loop                          # 5,000 on memory://
    python -m benchmarks.command_loop --backend sqlite --commands 3000

Prints the wall time of a command (µs, after 200 warm-up commands). Counted in instructions
by ``python -m benchmarks.instructions --only command`` (memory backend). Never asserted:
it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import pico
from benchmarks import turns_bench
from pico import session_value

#: The one value every command sets (a session value: no conversation is touched).
VALUE = session_value("bench.command", int, key="k")
WARM_UP = 200


async def run(url: str, commands: int, *, warm_up: int = WARM_UP) -> float:
    """Seconds for ``commands`` commands after ``warm_up`` (each sets ``VALUE`` to its
    index); the session holds the last index when it returns."""
    h = await pico.Harness.open(url, session="commands")
    try:
        for i in range(warm_up):
            await h.set_value(VALUE, i)
        t0 = time.perf_counter()
        for i in range(commands):
            await h.set_value(VALUE, i)
        return time.perf_counter() - t0
    finally:
        await h.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=5000)
    ap.add_argument("--backend", choices=("memory", "sqlite"), default="memory")
    args = ap.parse_args()
    if args.commands < 1:
        raise SystemExit("--commands must be at least 1")
    with tempfile.TemporaryDirectory(prefix="pico-commands-") as tmp:
        url = turns_bench.backend_url(args.backend, Path(tmp))
        seconds = asyncio.run(run(url, args.commands))
    print(
        f"{args.commands} commands on {args.backend}: "
        f"{seconds * 1e6 / args.commands:.1f} µs a command"
    )


if __name__ == "__main__":
    main()
