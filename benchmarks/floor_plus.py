"""The floor plus what pico's storage adds to every event, and nothing else (issue 18): how
much of the 2.5x target pico's stored form uses up before any harness logic runs.

The plain-sqlite3 floor (``../shared/bench/floor_turns.py``) writes each turn's ten commits
of events and read-model rows as JSON and nothing more. Pico's stored form also needs, on
every commit, what this program adds to the same statements, each extra on its own and
then all together:

- ``compress``: every event body compressed with pico's dictionaries and every entry's
  content and task's state in the read model deflated (``sql/bodies.py``, the functions
  pico's recorder calls), which the bytes target (1.5x the floor's database) needs;
- ``chain``: the batch's SHA-256 link over the previous link and each event's framed body,
  written into its boundary (``infrastructure/chain.py``'s ``seal_boundary``, on the
  batch as stored events), which the durability contract needs (seed 000: a verifiable
  journal);
- ``loop``: each commit made by its own asyncio task, awaited (the least an asyncio harness
  that runs each task's effects as coroutines does).

    python -m benchmarks.floor_plus                    # 2,000 turns, synchronous=NORMAL
    python -m benchmarks.floor_plus --turns 500 --rounds 3
    python -m benchmarks.floor_plus --only plain --only all   # two of the variants

Each variant runs in this process, one after the other, a fresh database each, rounds
alternating; the table gives each one's median wall time and CPU time (the process's,
``time.process_time``: the kernel's part of the writes included, the waits for the disk
not) and their ratios to the plain copy of the floor in the same rounds.
``benchmarks.instructions`` counts the plain copy and all three extras in instructions
(``--only floor_copy --only floor_plus``). Never asserted: it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from pico.infrastructure.chain import PLACEHOLDER, seal_boundary
from pico.infrastructure.codec import stored_event
from pico.infrastructure.sql import bodies

#: The pico topics of the floor's event names (their dictionaries are pico's).
TOPICS = {
    "EntryAppended": "pico.domain.conversation:Conversation.EntryAppended",
    "ContextAppended": "pico.domain.conversation:Conversation.ContextAppended",
    "ValueSet": "pico.domain.session:Session.ValueSet",
    "Created": "pico.domain.task:Task.Created",
    "Patched": "pico.domain.task:Task.Patched",
    "Committed": "pico.domain.session:Session.Committed",
}
VARIANTS: dict[str, frozenset[str]] = {
    "floor (this program's copy)": frozenset(),
    "+ compress": frozenset({"compress"}),
    "+ chain": frozenset({"chain"}),
    "+ loop": frozenset({"loop"}),
    "+ all three": frozenset({"compress", "chain", "loop"}),
}
#: Each variant's name for ``--only``, in the order of ``VARIANTS``.
SHORT: dict[str, str] = dict(
    zip(("plain", "compress", "chain", "loop", "all"), VARIANTS, strict=True)
)
PLAIN = "floor (this program's copy)"
_SCHEMA = """
create table events(rowid integer primary key, originator text, version int, topic text,
  state blob, unique(originator, version));
create table entries(id int primary key, conv int, kind text, content blob, commit_end int);
create table context(conv int, pos int, entry int, primary key(conv, pos));
create table tasks(id int primary key, conv int, kind text, status text, role text, state blob);
create index live on tasks(id) where role != 'terminal';
create table vals(scope text, ns text, key text, seq int, value text,
  primary key(scope, ns, key, seq));
create table commits(first int, last int);
"""


class Floor:
    """The floor's turn (the same ten commits, statements and bodies), with ``extras``."""

    def __init__(self, path: Path, sync: str, extras: frozenset[str]) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={sync}")
        self.db.executescript(_SCHEMA)
        self.compress = "compress" in extras
        self.chain = "chain" in extras
        self.seq = 0
        self.pos = 0
        self.ver: dict[str, int] = {}
        self.link = PLACEHOLDER
        self._streams: dict[str, UUID] = {}

    def stream(self, name: str) -> UUID:
        """The floor's stream name as a stream id (the chain frames UUIDs), made once."""
        found = self._streams.get(name)
        if found is None:
            found = self._streams[name] = uuid5(NAMESPACE_URL, name)
        return found

    def version(self, orig: str) -> int:
        """The next version of stream ``orig``."""
        v = self.ver[orig] = self.ver.get(orig, 0) + 1
        return v

    def ev(self, orig: str, name: str, state: dict[str, Any]) -> tuple[Any, ...]:
        return (orig, self.version(orig), name, json.dumps(state).encode())

    def text(self, topic: str, text: str) -> Any:
        return bodies.encode_text(topic, text) if self.compress else text

    def commit(
        self,
        evs: list[tuple[Any, ...]],
        entries: tuple[tuple[Any, ...], ...] = (),
        ctx: tuple[tuple[Any, ...], ...] = (),
        tasks: tuple[tuple[Any, ...], ...] = (),
        patches: tuple[tuple[Any, ...], ...] = (),
        vals: tuple[tuple[Any, ...], ...] = (),
    ) -> None:
        first = self.seq + 1
        self.seq += max(1, len(evs))
        last = self.seq
        boundary: dict[str, Any] = {"first": first, "last": last}
        if self.chain:
            # pico's own sealing (``chain.seal_boundary``): the boundary encoded with the
            # placeholder link, the batch's link over the previous one and each event's
            # framed body, then written into the boundary's body.
            boundary["link"] = PLACEHOLDER
            body = json.dumps(boundary, separators=(",", ":")).encode()
            rows = [*evs, ("session", self.version("session"), "Committed", body)]
            batch = [stored_event(self.stream(o), v, TOPICS[n], b) for o, v, n, b in rows]
            self.link = seal_boundary(self.link, batch)
            rows[-1] = (*rows[-1][:3], batch[-1].state)
        else:
            rows = [*evs, self.ev("session", "Committed", boundary)]
        if self.compress:  # boundaries stay JSON, as pico stores them
            rows = [
                (o, v, n, b if n == "Committed" else bodies.encode(TOPICS[n], b))
                for o, v, n, b in rows
            ]
        db = self.db
        db.execute("begin")
        db.executemany("insert into events(originator,version,topic,state) values(?,?,?,?)", rows)
        db.executemany(
            "insert into entries values(?,?,?,?,?)",
            [(e[0], 1, e[1], self.text(bodies.ENTRY_CONTENT, e[2]), last) for e in entries],
        )
        db.executemany("insert into context values(?,?,?)", ctx)
        db.executemany(
            "insert into tasks values(?,?,?,?,?,?)",
            [(*t[:5], self.text(bodies.TASK_STATE, t[5])) for t in tasks],
        )
        db.executemany("update tasks set status=?, role=? where id=?", patches)
        db.executemany("insert into vals values(?,?,?,?,?)", vals)
        db.execute("insert into commits values(?,?)", (first, last))
        db.execute("commit")

    def turn(self) -> list[Callable[[], None]]:
        """The floor's ten commits of one turn, in order, each a call."""
        msg = "x" * 120
        steps: list[Callable[[], None]] = []
        state: dict[str, int] = {}

        def accept() -> None:
            u = state["u"] = self.seq + 1
            g = state["g"] = self.seq + 4
            self.commit(
                [
                    self.ev("conv1", "EntryAppended", {"id": u, "content": msg}),
                    self.ev("conv1", "ContextAppended", {"ids": [u]}),
                    self.ev("sess", "ValueSet", {"k": u}),
                    self.ev(f"t{g}", "Created", {"kind": "generation"}),
                ],
                entries=((u, "user", msg),),
                ctx=((1, self.pos, u),),
                tasks=((g, 1, "generation", "pending", "ready", "{}"),),
                vals=(("s", "result", str(u), u + 2, '"running"'),),
            )
            self.pos += 1

        def intent(key: str) -> Callable[[], None]:
            def run() -> None:
                t = state[key]
                status = "streaming" if key in ("g", "g2") else "running"
                self.commit(
                    [self.ev(f"t{t}", "Patched", {"status": status})],
                    patches=((status, "inflight", t),),
                )

            return run

        def settle_generation() -> None:
            a = self.seq + 1
            ta, tb, p = a + 2, a + 3, a + 4
            state.update(ta=ta, tb=tb, p=p)
            g = state["g"]
            self.commit(
                [
                    self.ev("conv1", "EntryAppended", {"id": a, "content": msg}),
                    self.ev("conv1", "ContextAppended", {"ids": [a]}),
                    self.ev(f"t{ta}", "Created", {}),
                    self.ev(f"t{tb}", "Created", {}),
                    self.ev(f"t{p}", "Created", {}),
                    self.ev(f"t{g}", "Patched", {"status": "done"}),
                ],
                entries=((a, "assistant", msg),),
                ctx=((1, self.pos, a),),
                tasks=(
                    (ta, 1, "tool", "pending", "ready", "{}"),
                    (tb, 1, "tool", "pending", "ready", "{}"),
                    (p, 1, "post_tools", "pending", "ready", "{}"),
                ),
                patches=(("done", "terminal", g),),
            )
            self.pos += 1

        def settle_tool(key: str) -> Callable[[], None]:
            def run() -> None:
                tk = state[key]
                r = self.seq + 1
                self.commit(
                    [
                        self.ev("conv1", "EntryAppended", {"id": r, "content": msg}),
                        self.ev("conv1", "ContextAppended", {"ids": [r]}),
                        self.ev(f"t{tk}", "Patched", {"status": "done"}),
                    ],
                    entries=((r, "tool_result", msg),),
                    ctx=((1, self.pos, r),),
                    patches=(("done", "terminal", tk),),
                )
                self.pos += 1

            return run

        def join() -> None:
            g2 = state["g2"] = self.seq + 1
            p = state["p"]
            self.commit(
                [self.ev(f"t{g2}", "Created", {}), self.ev(f"t{p}", "Patched", {"status": "done"})],
                tasks=((g2, 1, "generation", "pending", "ready", "{}"),),
                patches=(("done", "terminal", p),),
            )

        def answer() -> None:
            f = self.seq + 1
            g2, u = state["g2"], state["u"]
            self.commit(
                [
                    self.ev("conv1", "EntryAppended", {"id": f, "content": msg}),
                    self.ev("conv1", "ContextAppended", {"ids": [f]}),
                    self.ev("sess", "ValueSet", {}),
                    self.ev(f"t{g2}", "Patched", {"status": "done"}),
                ],
                entries=((f, "assistant", msg),),
                ctx=((1, self.pos, f),),
                patches=(("done", "terminal", g2),),
                vals=(("s", "result", str(u), f + 2, '"done"'),),
            )
            self.pos += 1

        steps += [accept, intent("g"), settle_generation]
        steps += [intent("ta"), settle_tool("ta"), intent("tb"), settle_tool("tb")]
        steps += [join, intent("g2"), answer]
        return steps


def run(turns: int, sync: str, extras: frozenset[str], directory: Path) -> tuple[float, float]:
    """Wall and CPU seconds for ``turns`` turns of the floor with ``extras`` on a fresh
    database."""
    floor = Floor(directory / f"floor-{'-'.join(sorted(extras)) or 'plain'}.db", sync, extras)
    try:
        if "loop" not in extras:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(turns):
                for step in floor.turn():
                    step()
            return time.perf_counter() - start, time.process_time() - cpu

        async def commit(step: Callable[[], None]) -> None:
            step()

        async def turns_in_loop() -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(turns):
                for step in floor.turn():
                    await asyncio.create_task(commit(step))
            return time.perf_counter() - start, time.process_time() - cpu

        return asyncio.run(turns_in_loop())
    finally:
        floor.db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sync", choices=("NORMAL", "FULL"), default="NORMAL")
    ap.add_argument("--only", choices=tuple(SHORT), action="append", help="variants to run")
    args = ap.parse_args()
    if args.turns < 1 or args.rounds < 1:
        ap.error("--turns and --rounds must be at least 1")
    chosen = [SHORT[v] for v in SHORT if args.only is None or v in args.only]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name in chosen:
            with tempfile.TemporaryDirectory(prefix="pico-floor-plus-") as tmp:
                times[name].append(run(args.turns, args.sync, VARIANTS[name], Path(tmp)))

    def median(name: str, clock: int) -> float:
        return statistics.median(t[clock] for t in times[name])

    print(
        f"{args.turns:,} turns, synchronous={args.sync}, median of {args.rounds} "
        "alternating rounds\n"
    )
    print(
        "| variant | wall s (median) | against the floor | CPU s (median) | against the floor |"
        "\n|---|---|---|---|---|"
    )
    for name in chosen:
        wall, cpu = median(name, 0), median(name, 1)
        if PLAIN in times:
            ratios = f"{wall / median(PLAIN, 0):.2f}x", f"{cpu / median(PLAIN, 1):.2f}x"
        else:  # the plain copy not run: nothing to compare with
            ratios = "-", "-"
        print(f"| {name} | {wall:.2f} | {ratios[0]} | {cpu:.2f} | {ratios[1]} |")


if __name__ == "__main__":
    main()
