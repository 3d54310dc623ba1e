"""Workloads of seed 003 §10.3 (issue 18), on pico's public API.

- ``turns``: many short agent turns, alternately with two parallel tool calls and with
  none (a plain answer).
- ``forks``: historical reads through a fork chain of depth ``FORK_DEPTH`` (a rewindable
  value and a list page at a past position) and new forks of the deepest conversation,
  while unrelated state grows.
- ``subagents``: subagents spawned and driven to completion, a few live background tasks
  beside them; at each size the session is also closed and cold-reopened with its first
  drive pass.
- ``background``: ``LIVE_SCHEDULES`` live background schedules; drive passes and new
  schedules while completed subagents accumulate.
- ``compaction``: agent turns (one tool each) with a model-written collapse every
  ``COLLAPSE_EVERY`` turns; then the harness is closed and a fresh one cold-reopens the
  session and reads it (root, the projected context, the latest page of entries).
- ``approvals``: ``tool_execution="sequential"`` turns of three tools whose middle one a
  ``before_tool`` hook holds for approval; the approval is listed with
  ``pending_approvals`` and decided with ``decide_approval`` (every fifth one denied).
- ``streaming``: one long answer per turn (``--stream-kb`` of text in 64-character deltas,
  saved as ~512-character frames: the stream's checkpoints); then an interrupted stream
  (the harness closed mid-stream) and its recovery from the saved frames.
- ``queue``: an accepted input, four follow-ups queued behind it, two cancelled, the drive,
  then result lookups (this cycle's and old ones) and late cancels.

Each workload builds its history to N operations and measures a window of operations,
then grows the history to 10N and measures the same window again, reporting per size: wall
p50/p99 and CPU of each operation, SQL queries and rows read per operation (SQLite), peak
RSS, and bytes on disk by file kind sampled before close. It states the flat-cost property
the workload must keep and prints the 10N/N ratios: measured, never asserted.

    python -m benchmarks.workloads_bench all                    # every workload, SQLite
    python -m benchmarks.workloads_bench queue --backend jsonl  # one workload, JSONL
    python -m benchmarks.workloads_bench streaming --n 5 --window 5 --stream-kb 50  # quick

Prints Markdown (also benchmarks/results/workloads-<workload>[-<backend>].md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pico
from benchmarks.metrics import (
    CpuTimes,
    DiskUsage,
    cpu_times,
    disk_usage,
    markdown_table,
    peak_rss_mib,
    percentile,
)
from benchmarks.subagent_bench import RowCounter
from pico import JsonObject, ToolContext

T = TypeVar("T")

WORKLOADS = (
    "turns",
    "forks",
    "subagents",
    "background",
    "compaction",
    "approvals",
    "streaming",
    "queue",
)
BACKENDS = ("sqlite", "memory", "jsonl")
#: Default history N (operations before the first window) and window per workload.
DEFAULTS = {
    "turns": (200, 50),
    "forks": (20, 10),
    "subagents": (100, 20),
    "background": (100, 20),
    "compaction": (200, 50),
    "approvals": (200, 50),
    "streaming": (10, 10),
    "queue": (200, 50),
}
#: The verdict's tolerance on a noisy machine: a p50 ratio up to this is "flat".
FLAT = 1.5
#: ...and rows read per operation, which are deterministic, may grow this much.
FLAT_ROWS = 1.25

COLLAPSE_EVERY = 5  # compaction: a collapse after every 5th turn
REOPENS = 20  # compaction: cold reopens per size
QUEUED = 4  # queue: follow-ups queued behind each accepted input
DELTA_CHARS = 64  # streaming: characters per streamed delta
INTERRUPTS = 5  # streaming: interrupted streams (and recoveries) per size
FORK_DEPTH = 10  # forks: levels between the root and the conversation read
UNRELATED = 100  # forks: unrelated values written per cycle (the growing history)
READS = 5  # forks: reads of each kind per cycle
LIVE_BESIDE = 3  # subagents: live background schedules beside the completed children
LIVE_SCHEDULES = 200  # background: live schedules (every hour: none comes due)
PLAN = pico.conversation_value("bench.plan", int)
MOVES = pico.conversation_list("bench.moves", int)


@dataclass
class Op:
    """The measured calls of one operation kind at one history size."""

    wall_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    queries: int = 0
    rows: int = 0
    tables: Counter[str] = field(default_factory=Counter)  # rows by table


class Meter:
    """Times named operations while ``recording`` (wall, CPU and, with a ``RowCounter``,
    the SQL queries and rows each one read); outside a window it only awaits."""

    def __init__(self, counter: RowCounter | None) -> None:
        self.counter = counter
        self.ops: dict[str, Op] = {}
        self.recording = False

    async def run(self, name: str, step: Awaitable[T]) -> T:
        if not self.recording:
            return await step
        if self.counter is not None:
            self.counter.take()  # whatever ran between operations is not this one's
        cpu0, t0 = cpu_times(), time.perf_counter()
        out = await step
        wall, cpu = time.perf_counter() - t0, cpu_times() - cpu0
        op = self.ops.setdefault(name, Op())
        op.wall_ms.append(wall * 1000)
        op.cpu_s += cpu.total
        if self.counter is not None:
            rows, queries = self.counter.take()
            op.rows += sum(rows.values())
            op.queries += queries
            op.tables.update(rows)
        return out

    def total(self, name: str, parts: Sequence[str]) -> None:
        """Add ``name``: per call, the sum of the calls of ``parts`` (one each per call)."""
        ops = [self.ops[p] for p in parts]
        self.ops[name] = Op(
            [sum(walls) for walls in zip(*(o.wall_ms for o in ops), strict=True)],
            sum(o.cpu_s for o in ops),
            sum(o.queries for o in ops),
            sum(o.rows for o in ops),
            sum((o.tables for o in ops), Counter()),
        )


@dataclass
class Size:
    """One measured window: the history before it and what the window cost."""

    history: int  # operations completed before the window
    head: int = 0  # the session's allocator high-water mark after the window
    ops: dict[str, Op] = field(default_factory=dict)
    cpu: CpuTimes = field(default_factory=lambda: CpuTimes(0.0, 0.0))
    wall_s: float = 0.0
    rss_mib: float = 0.0
    disk: DiskUsage | None = None


@dataclass
class Target:
    """Where a workload runs: a storage URL, the path whose bytes count, the row counter."""

    backend: str
    url: str
    path: Path | None
    counter: RowCounter | None

    def disk(self) -> DiskUsage | None:
        return None if self.path is None else disk_usage(self.path)


@dataclass
class Report:
    workload: str
    setup: str
    claim: str  # the flat-cost property, one sentence
    primary: list[str]  # the operations the claim is about
    sizes: list[Size]
    unit: str = "turns"  # what the history counts


class Window:
    """Opens and closes a measured window on a ``Meter``."""

    def __init__(self, meter: Meter, target: Target, history: int) -> None:
        self.meter, self.target = meter, target
        self.size = Size(history)
        self._cpu = cpu_times()
        self._t0 = time.perf_counter()
        meter.ops = {}
        meter.recording = True

    def close(self, harness: pico.Harness) -> Size:
        """End the window; sample RSS and bytes on disk while ``harness`` is still open."""
        self.meter.recording = False
        size = self.size
        size.wall_s = time.perf_counter() - self._t0
        size.cpu = cpu_times() - self._cpu
        size.ops = self.meter.ops
        size.head = harness.head()
        size.rss_mib = peak_rss_mib()
        size.disk = self.target.disk()
        return size


def _phases(n: int, window: int) -> list[tuple[int, range]]:
    """For N and 10N: the history before the window, and the op indexes to run up to the
    window's end (the first phase starts at 0, the second where the first ended)."""
    return [(n, range(0, n + window)), (10 * n, range(n + window, 10 * n + window))]


async def _read(args: JsonObject, ctx: ToolContext) -> str:
    return f"contents of {args.get('path', '?')}"


def _tool(name: str) -> pico.Tool:
    return pico.Tool(name, name, {"type": "object"}, _read)


# ---------------------------------------------------------------------- short turns
async def turns(target: Target, n: int, window: int) -> Report:
    """Short turns in one conversation: even turns call two tools in parallel, odd turns
    answer at once."""
    provider = pico.FauxProvider([], keep_requests=False)
    h = await pico.Harness.open(
        target.url, session="turns", provider=provider, tools=[_tool("read"), _tool("grep")]
    )
    c = await h.root()
    meter = Meter(target.counter)
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for turn in ops:
            if turn == history:
                win = Window(meter, target, history)
            if turn % 2 == 0:
                name = "turn with two tools"
                calls: list[tuple[str, JsonObject]] = [
                    ("read", {"path": f"f{turn}.py"}),
                    ("grep", {"path": f"g{turn}"}),
                ]
                provider.script += [
                    pico.FauxResponse(text=f"Turn {turn}: let me look.", tool_calls=calls),
                    f"Turn {turn}: both files agree.",
                ]
            else:
                name = "turn without tools"
                provider.script.append(f"Turn {turn}: the answer is {turn}.")
            _, result = await meter.run(name, c.prompt(f"question {turn}"))
            assert result is not None and result.status == "done", result
        sizes.append(win.close(h))
    await h.close()
    return Report(
        "turns",
        "short agent turns in one conversation, alternately with two tool calls run in"
        " parallel (`read`, `grep`) and without tools (a plain answer)",
        "A turn, with tools or without, costs the same when the transcript grows 10x: each"
        " command writes its own rows and reads only the context tail it appends to.",
        ["turn with two tools", "turn without tools"],
        sizes,
    )


# ---------------------------------------------------------------------- forks
async def forks(target: Target, n: int, window: int) -> Report:
    """A fork chain of depth ``FORK_DEPTH``; cycles of ``UNRELATED`` unrelated values (the
    growing history), then, in the windows, historical reads and a new fork of the leaf."""
    h = await pico.Harness.open(target.url, session="forks")
    root = await h.root()
    other = await h.command(lambda tx: tx.create_conversation())
    await root.set_value(PLAN, 1)
    for i in range(5):
        await root.append_list(MOVES, i)
    chain = root
    for level in range(FORK_DEPTH):
        marker = await chain.append("user", f"level {level}")
        await chain.set_value(PLAN, 100 + level)  # after the fork boundary: must not leak
        await chain.append_list(MOVES, 100 + level)
        chain = await chain.fork(at_entry=marker)
    position = h.main_head()
    leaf = chain
    marker = await leaf.append("user", "the leaf's own entry")
    context = len(await leaf.messages())  # what a fork at the leaf's entry starts from
    meter = Meter(target.counter)
    sizes: list[Size] = []

    def unrelated(cycle: int) -> Callable[[pico.Command], None]:
        def fill(tx: pico.Command) -> None:
            for i in range(cycle * UNRELATED, (cycle + 1) * UNRELATED):
                address = pico.conversation_value(f"noise.{i % 50}", int, key=f"k{i}")
                tx.set_value(address, i, conversation_id=root.id if i % 2 else other)

        return fill

    for history, ops in _phases(n, window):
        for cycle in ops:
            if cycle == history:
                win = Window(meter, target, history)
            await h.command(unrelated(cycle))
            if not meter.recording:
                continue
            for _ in range(READS):
                read = leaf.get_value(PLAN, as_of=position)
                got = await meter.run("value read as of", read)
                assert got == 1, got
                page = await meter.run(
                    "list page as of", leaf.read_list(MOVES, as_of=position, limit=10)
                )
                assert [e.value for e in page.items] == [0, 1, 2, 3, 4], page
            fork = await meter.run("fork of the leaf", leaf.fork(at_entry=marker))
            messages = await meter.run("fork's first read", fork.messages())
            assert len(messages) == context, (len(messages), context)
        sizes.append(win.close(h))
    await h.close()
    return Report(
        "forks",
        f"a fork chain of depth {FORK_DEPTH} (each level writes newer versions of a"
        " rewindable value and list after its fork point, which must not leak); cycles of"
        f" {UNRELATED} unrelated values (other namespaces of the root, another conversation);"
        f" in the window each cycle reads the value and a list page {READS} times at a past"
        " position from the deepest fork, forks it again and reads the new fork's context",
        "A historical read through the fork chain, a fork and its first read cost the same"
        " when unrelated state grows 10x: each walks the chain's levels by indexed version"
        " and range lookups, never the other values.",
        ["value read as of", "list page as of", "fork of the leaf", "fork's first read"],
        sizes,
        unit=f"cycles of {UNRELATED} values",
    )


# ---------------------------------------------------------------------- subagents
async def _spawn_and_finish(
    h: pico.Harness, c: pico.ConversationHandle, child: int
) -> pico.TaskSnapshot | None:
    owner = await c.spawn(f"child {child}: inspect one file")
    assert await h.drive() == "suspended"  # done, but for the parked ones
    return await h.task(owner)


async def subagents(target: Target, n: int, window: int) -> Report:
    """Subagents spawned one at a time and driven to done beside ``LIVE_BESIDE`` live ones
    (their generations parked on a deferred answer, waiting for a permit no drive grants);
    after each window a cold reopen and its first drive pass."""
    provider = pico.FauxProvider(
        [pico.FauxDeferred(polls=1, then="late") for _ in range(LIVE_BESIDE)],
        keep_requests=False,
    )

    async def open_() -> pico.Harness:
        return await pico.Harness.open(target.url, session="subagents", provider=provider)

    h = await open_()
    c = await h.root()
    for k in range(LIVE_BESIDE):
        await c.spawn(f"live child {k}")
    assert await h.drive() == "suspended"  # the parked generations wait for a permit
    live = len(h.scheduler.live_tasks(None))
    meter = Meter(target.counter)
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for child in ops:
            if child == history:
                win = Window(meter, target, history)
            provider.script.append(f"child {child}: done.")

            owner = await meter.run("spawn + drive to done", _spawn_and_finish(h, c, child))
            assert owner is not None and owner.status == "done", owner
        size = win.close(h)
        await h.close()
        meter.recording = True  # the reopens join this size

        async def reopen() -> pico.Harness:
            fresh = await open_()
            assert await fresh.drive() == "suspended"
            return fresh

        for _ in range(5):
            fresh = await meter.run("cold reopen + first drive pass", reopen())
            assert len(fresh.scheduler.live_tasks(None)) == live
            await fresh.close()
        meter.recording = False
        size.ops = meter.ops
        sizes.append(size)
        h = await open_()
        c = await h.root()
    await h.close()
    return Report(
        "subagents",
        "subagents spawned one at a time (`spawn()`), each driven to done by one faux answer"
        f" (`harness.drive()`), beside {LIVE_BESIDE} live ones whose generations are parked on"
        " a deferred answer; after each window the harness is closed and reopened 5 times,"
        " each with its first drive pass",
        "Spawning and finishing a subagent, and a cold reopen with its first drive pass,"
        " cost the same when completed children grow 10x: an open and a pass read the live"
        " tasks only, never the completed ones.",
        ["spawn + drive to done", "cold reopen + first drive pass"],
        sizes,
        unit="children",
    )


# ---------------------------------------------------------------------- background tasks
async def _settle(h: pico.Harness, c: pico.ConversationHandle, task_id: int) -> None:
    """Drive the root until ``task_id`` is terminal: a conversation drive returns once its
    foreground work is done and does not wait for detached work, so the next drive runs
    at the next change (a commit, a finished execution)."""
    while True:
        assert await c.drive() == "idle"
        task = await h.task(task_id)
        if task is not None and task.role == "terminal":
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(h.scheduler.next_change(), 0.05)


async def background(target: Target, n: int, window: int) -> Report:
    """``LIVE_SCHEDULES`` live schedules; completed subagents accumulate; the windows
    measure drive passes over the live set and new schedules (aborted again at once)."""
    provider = pico.FauxProvider([], keep_requests=False)
    h = await pico.Harness.open(target.url, session="background", provider=provider)
    c = await h.root()
    for k in range(LIVE_SCHEDULES):
        await c.schedule(pico.Recurrence(every=3600), prompt=f"hourly check {k}")
    meter = Meter(target.counter)
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for child in ops:
            if child == history:
                win = Window(meter, target, history)
            provider.script.append(f"child {child}: done.")
            owner = await c.spawn(f"child {child}")
            await _settle(h, c, owner)
            if not meter.recording:
                continue
            assert await meter.run("drive pass (nothing due)", c.drive()) == "idle"
            extra = await meter.run(
                "schedule", c.schedule(pico.Recurrence(every=3600), prompt="one more")
            )
            assert await meter.run("abort_background", c.abort_background(extra)) == [extra]
            await _settle(h, c, extra)  # marked: its cancellation runs at the next pass
        live = len(h.scheduler.live_tasks(None))
        assert live == LIVE_SCHEDULES, live
        sizes.append(win.close(h))
    await h.close()
    return Report(
        "background",
        f"{LIVE_SCHEDULES} live background schedules (hourly, never due) in the root;"
        " completed subagents accumulate (spawned in the background, driven until done); the"
        " window measures a drive of the root with nothing due, a new schedule and its"
        " `abort_background`",
        "A drive pass, a new schedule and its cancellation cost the same when completed"
        f" tasks grow 10x: a pass reads the {LIVE_SCHEDULES} live tasks (from the owner's"
        " mirror), never the completed ones.",
        ["drive pass (nothing due)", "schedule", "abort_background"],
        sizes,
        unit="children",
    )


# ---------------------------------------------------------------------- (a) compaction
async def _collapse(h: pico.Harness, c: pico.ConversationHandle) -> str:
    """Ask for a collapse, drive it to publication; the collapse task's final status."""
    task_id = await c.collapse()
    assert await c.drive() == "idle"
    task = await h.task(task_id)
    return "?" if task is None else task.status


async def compaction(target: Target, n: int, window: int) -> Report:
    """Turns with one tool, a collapse every ``COLLAPSE_EVERY`` turns; at each size the
    harness is closed and ``REOPENS`` fresh harnesses cold-reopen the session and read it."""
    tools = [_tool("read")]
    provider = pico.FauxProvider([], keep_requests=False)

    def script(turn: int) -> list[Any]:
        items: list[Any] = [
            pico.FauxResponse(text="Let me look.", tool_calls=[("read", {"path": f"f{turn}"})]),
            f"Turn {turn}: the file says {turn}.",
        ]
        if (turn + 1) % COLLAPSE_EVERY == 0:
            items.append(f"Summary of turns through {turn}: each read one file.")
        return items

    async def open_() -> pico.Harness:
        return await pico.Harness.open(
            target.url, session="compaction", provider=provider, tools=tools
        )

    meter = Meter(target.counter)
    h = await open_()
    c = await h.root()
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for turn in ops:
            if turn == history:
                win = Window(meter, target, history)
            provider.script.extend(script(turn))
            _, result = await meter.run("turn", c.prompt(f"question {turn}"))
            assert result is not None and result.status == "done", result
            if (turn + 1) % COLLAPSE_EVERY == 0:
                assert await meter.run("collapse", _collapse(h, c)) == "done"
        size = win.close(h)
        await h.close()
        meter.recording = True  # the reopens join this size
        for _ in range(REOPENS):

            async def reopen() -> tuple[pico.Harness, int]:
                fresh = await open_()
                root = await fresh.root()
                messages = await root.messages()
                latest = await root.entries(order="desc", limit=20)
                assert latest.items
                return fresh, len(messages)

            fresh, projected = await meter.run("cold reopen + first read", reopen())
            assert projected > 0
            await fresh.close()
        meter.recording = False
        size.ops = meter.ops
        sizes.append(size)
        h = await open_()
        c = await h.root()
    await h.close()
    return Report(
        "compaction",
        f"agent turns of one tool call each, a model-written collapse (`collapse()` + drive)"
        f" after every {COLLAPSE_EVERY}th turn; then close and {REOPENS} cold reopens (a fresh"
        " `Harness.open`, `root()`, `messages()` and the latest 20 entries)",
        "With a collapse every few turns the context stays a few turns long, so a turn, a"
        " collapse and a cold reopen + first read cost the same when the transcript grows 10x.",
        ["turn", "collapse", "cold reopen + first read"],
        sizes,
    )


# ---------------------------------------------------------------------- (b) approvals
async def approvals(target: Target, n: int, window: int) -> Report:
    """Sequential turns of read, edit, test; ``edit`` is held, listed and decided."""

    async def before_tool(call: pico.ToolCall) -> pico.ToolDecision:
        if call.name == "edit":
            return pico.ToolDecision("hold", "an edit needs a person's approval")
        return pico.ToolDecision()

    provider = pico.FauxProvider([], keep_requests=False)
    h = await pico.Harness.open(
        target.url,
        session="approvals",
        provider=provider,
        tools=[_tool("read"), _tool("edit"), _tool("test")],
        hooks=pico.Hooks(before_tool=before_tool),
        tool_execution="sequential",
    )
    c = await h.root()
    meter = Meter(target.counter)
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for turn in ops:
            if turn == history:
                win = Window(meter, target, history)
            calls: list[tuple[str, JsonObject]] = [
                ("read", {"path": f"f{turn}"}),
                ("edit", {"path": f"f{turn}"}),
                ("test", {}),
            ]
            provider.script += [
                pico.FauxResponse(text="Read, edit, test.", tool_calls=calls),
                f"Turn {turn}: edited and tested.",
            ]
            input_id, held = await meter.run("prompt until held", c.prompt(f"fix {turn}"))
            assert held is not None and held.status == "running", held
            pending = await meter.run("pending_approvals", h.pending_approvals(c.id))
            assert len(pending) == 1, pending
            decision = "deny" if turn % 5 == 4 else "grant"
            await meter.run("decide_approval", h.decide_approval(pending[0].id, decision))

            async def finish(input_id: int = input_id) -> pico.InputResult | None:
                assert await c.drive() == "idle"
                return await c.result(input_id)

            result = await meter.run("drive to answer", finish())
            assert result is not None and result.status == "done", result
        # Check the chain once per size: read <- edit <- test, edit also after its approval.
        read, edit, test = reversed((await h.tasks(kind="tool", order="desc", limit=3)).items)
        assert read.id in edit.after and test.after == (edit.id,), (read, edit, test)
        parts = ["prompt until held", "pending_approvals", "decide_approval", "drive to answer"]
        meter.total("held-approval turn", parts)
        sizes.append(win.close(h))
    await h.close()
    return Report(
        "approvals",
        'turns of three tool calls run in sequence (`tool_execution="sequential"`): read,'
        " edit, test; a `before_tool` hook holds edit; `pending_approvals()` lists it,"
        " `decide_approval()` grants it (every fifth denied), a drive finishes the turn",
        "A held-approval turn (prompt, list, decide, drive to the answer) costs the same when"
        " completed approvals and tool calls grow 10x: only live tasks are read.",
        ["held-approval turn", "pending_approvals", "decide_approval"],
        sizes,
    )


# ---------------------------------------------------------------------- (c) streaming
async def _interrupt(target: Target, text: str) -> int:
    """Open the session with a provider that streams ``text`` one delta per fake-clock
    tick, let about half of it stream (its frames are saved), then close mid-stream.
    Returns the interrupted input's id."""
    clock = pico.FakeClock()
    tick = 0.001
    provider = pico.FauxProvider(
        [text], chunk_chars=DELTA_CHARS, cadence=tick, clock=clock, keep_requests=False
    )
    h = await pico.Harness.open(target.url, session="streaming", provider=provider)
    c = await h.root()
    input_id = await c.accept("one more long answer, please")
    drive = asyncio.ensure_future(c.drive())
    for _ in range(len(text) // DELTA_CHARS // 2):
        spins = 0
        while clock.next_wake() is None and not drive.done():  # until the stream sleeps
            spins += 1
            await asyncio.sleep(0 if spins < 1000 else 0.001)
        clock.advance(tick)
    assert not drive.done(), "the stream ended before the harness was closed"
    await h.close()
    await asyncio.gather(drive, return_exceptions=True)  # the closed drive's outcome
    return input_id


async def streaming(target: Target, n: int, window: int, stream_kb: int) -> Report:
    """One long streamed answer per turn; at each size also ``INTERRUPTS`` streams cut by a
    close, each recovered by a fresh owner from its saved frames."""
    words = "the quick brown fox jumps over the lazy dog; "
    text = (words * (stream_kb * 1000 // len(words) + 1))[: stream_kb * 1000]
    provider = pico.FauxProvider([], chunk_chars=DELTA_CHARS, keep_requests=False)

    async def open_(p: pico.FauxProvider) -> pico.Harness:
        return await pico.Harness.open(target.url, session="streaming", provider=p)

    h = await open_(provider)
    c = await h.root()
    meter = Meter(target.counter)
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for turn in ops:
            if turn == history:
                win = Window(meter, target, history)
            provider.script.append(text)
            _, result = await meter.run("streamed turn", c.prompt(f"write it all out {turn}"))
            assert result is not None and result.status == "done", result
        size = win.close(h)
        await h.close()
        for _ in range(INTERRUPTS):
            input_id = await _interrupt(target, text)

            async def recover(input_id: int = input_id) -> tuple[pico.Harness, str]:
                owner = await open_(pico.FauxProvider([], keep_requests=False))  # asks nothing
                root = await owner.root()
                assert await root.drive() == "idle"
                result = await root.result(input_id)
                return owner, "?" if result is None else result.status

            meter.recording = True
            owner, status = await meter.run("recover interrupted stream", recover())
            meter.recording = False
            assert status == "interrupted", status
            await owner.close()
        size.ops = meter.ops
        sizes.append(size)
        h = await open_(provider)
        c = await h.root()
    await h.close()
    frames = stream_kb * 1000 // 512  # the last partial frame is never written
    return Report(
        "streaming",
        f"one {stream_kb} KB answer per turn from the faux provider in {DELTA_CHARS}-character"
        f" deltas, saved as ~{frames} frames of 512 characters (the stream's checkpoints);"
        f" then {INTERRUPTS} streams closed halfway, each recovered by a fresh owner (open +"
        " drive: the saved frames become the `interrupted` answer)",
        f"A {stream_kb} KB streamed turn and the recovery of an interrupted stream cost the"
        " same when the streamed history grows 10x: frames go to a working scope that the"
        " settlement retires, and recovery reads only the interrupted stream's frames.",
        ["streamed turn", "recover interrupted stream"],
        sizes,
    )


# ---------------------------------------------------------------------- (d) queue
async def queue(target: Target, n: int, window: int) -> Report:
    """Cycles of accept, QUEUED follow-ups, two cancels, drive, result lookups."""
    provider = pico.FauxProvider([], keep_requests=False)
    h = await pico.Harness.open(target.url, session="queue", provider=provider)
    c = await h.root()
    meter = Meter(target.counter)
    rng = random.Random(18)
    inputs: list[int] = []  # every input admitted so far, for lookups far back
    sizes: list[Size] = []
    for history, ops in _phases(n, window):
        for cycle in ops:
            if cycle == history:
                win = Window(meter, target, history)
            provider.script += [f"Answer {cycle}.", f"Answer {cycle} to the follow-ups."]
            first = await meter.run("accept (idle)", c.accept(f"question {cycle}"))
            queued = [
                await meter.run("queue follow-up", c.follow_up(f"and {cycle}.{k}"))
                for k in range(QUEUED)
            ]
            for input_id in queued[1::2]:
                assert await meter.run("cancel queued", c.cancel_queued(input_id)) == "cancelled"
            assert await meter.run("drive (two answers)", c.drive()) == "idle"
            inputs += [first, *queued]
            old = [rng.choice(inputs) for _ in range(2)]
            for input_id in [first, *queued, *old]:
                result = await meter.run("result lookup", c.result(input_id))
                assert result is not None and result.status in ("done", "cancelled"), result
            for input_id in (first, queued[0]):
                late = await meter.run("late cancel", c.cancel_queued(input_id))
                assert late == "already_consumed", late
        sizes.append(win.close(h))
    await h.close()
    return Report(
        "queue",
        f"cycles of: `accept()` while idle, {QUEUED} `follow_up()`s queued behind it, every"
        " second one cancelled (`cancel_queued`), a drive (one answer, then one for the"
        " remaining follow-ups), `result()` of the cycle's inputs and of 2 random older ones,"
        " and 2 late `cancel_queued` calls (`already_consumed`)",
        "Queueing, cancelling and looking up a result (of this cycle's inputs or of any older"
        " one) cost the same when admitted inputs grow 10x: each reads its own queue and"
        " result values, never the history.",
        ["queue follow-up", "cancel queued", "result lookup", "drive (two answers)"],
        sizes,
        unit="cycles",
    )


# ---------------------------------------------------------------------- report
def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def _ratio(a: float, b: float) -> float:
    return b / a if a else float("inf")


def _moved(a: Op, b: Op) -> str:
    """The tables whose rows per operation changed between two sizes."""
    changed = []
    for table in sorted(set(a.tables) | set(b.tables)):
        ra, rb = a.tables[table] / len(a.wall_ms), b.tables[table] / len(b.wall_ms)
        if abs(rb - ra) >= 0.5:
            changed.append(f"{table.removeprefix('pico_')} {ra:.1f} -> {rb:.1f}")
    return f" ({', '.join(changed)})" if changed else ""


def render(report: Report, backend: str) -> str:
    lines = [
        f"### {report.workload} ({backend})",
        "",
        f"Workload: {report.setup}.",
        "",
        f"Flat-cost property: {report.claim}",
        "",
    ]
    rows: list[list[object]] = []
    for size in report.sizes:
        for name, op in size.ops.items():
            count = len(op.wall_ms)
            per = (
                (f"{op.queries / count:.1f}", f"{op.rows / count:.1f}")
                if backend == "sqlite"
                else ("-", "-")
            )
            rows.append(
                [
                    f"{size.history:,}",
                    name,
                    count,
                    f"{op.cpu_s:.3f}",
                    f"{percentile(op.wall_ms, 0.5):.2f}",
                    f"{percentile(op.wall_ms, 0.99):.2f}",
                    *per,
                ]
            )
    headers = [
        f"history ({report.unit})",
        "operation",
        "ops",
        "CPU s",
        "p50 ms",
        "p99 ms",
        "queries/op",
    ]
    lines += [markdown_table([*headers, "rows/op"], rows), ""]
    resources: list[list[object]] = []
    for size in report.sizes:
        d = size.disk
        on_disk = (
            [_mib(d.database), _mib(d.wal), _mib(d.shm), _mib(d.other), _mib(d.total)]
            if d is not None
            else ["-"] * 5
        )
        resources.append(
            [
                f"{size.history:,}",
                f"{size.head:,}",
                f"{size.wall_s:.1f}",
                f"{size.cpu.user:.2f}",
                f"{size.cpu.system:.2f}",
                f"{size.rss_mib:.0f}",
                *on_disk,
            ]
        )
    lines += [
        markdown_table(
            [
                f"history ({report.unit})",
                "log head",
                "window wall s",
                "CPU user s",
                "CPU sys s",
                "peak RSS MiB",
                "database MiB",
                "WAL MiB",
                "SHM MiB",
                "other MiB",
                "total MiB",
            ],
            resources,
        ),
        "",
    ]
    lo, hi = report.sizes[0], report.sizes[-1]
    lines.append(f"Ratio at {hi.history:,} / {lo.history:,} {report.unit} of history:")
    lines.append("")
    for name in report.primary:
        a, b = lo.ops[name], hi.ops[name]
        p50 = _ratio(percentile(a.wall_ms, 0.5), percentile(b.wall_ms, 0.5))
        verdict = p50 <= FLAT
        rows_note = ""
        if backend == "sqlite":
            ra, rb = a.rows / len(a.wall_ms), b.rows / len(b.wall_ms)
            verdict = verdict and rb <= FLAT_ROWS * ra + 1
            rows_note = f", rows/op {ra:.1f} -> {rb:.1f}" + _moved(a, b)
        lines.append(
            f"- {name}: p50 {p50:.2f}x{rows_note}: "
            + ("flat (held)" if verdict else "NOT flat (grew)")
        )
    lines += ["", f"(flat: p50 ratio <= {FLAT}; on SQLite also rows/op <= {FLAT_ROWS}x + 1)"]
    return "\n".join(lines)


def _target(backend: str, workload: str, tmp: Path) -> Target:
    if backend == "sqlite":
        db = tmp / f"{workload}.db"
        return Target(backend, f"sqlite:///{db}", db, RowCounter())
    if backend == "jsonl":
        directory = tmp / workload
        directory.mkdir()
        return Target(backend, f"jsonl:///{directory}", directory, None)
    return Target(backend, f"memory://workloads-{workload}-{time.time_ns()}", None, None)


def run_one(args: argparse.Namespace) -> str:
    workload: str = args.workload
    n, window = DEFAULTS[workload]
    n = args.n or n
    window = args.window or window
    tmp = Path(tempfile.mkdtemp(prefix=f"pico-workloads-{workload}-"))
    target = _target(args.backend, workload, tmp)
    runners: dict[str, Callable[[], Coroutine[Any, Any, Report]]] = {
        "turns": lambda: turns(target, n, window),
        "forks": lambda: forks(target, n, window),
        "subagents": lambda: subagents(target, n, window),
        "background": lambda: background(target, n, window),
        "compaction": lambda: compaction(target, n, window),
        "approvals": lambda: approvals(target, n, window),
        "streaming": lambda: streaming(target, n, window, args.stream_kb),
        "queue": lambda: queue(target, n, window),
    }
    t0 = time.perf_counter()
    if target.counter is not None:
        with target.counter.installed():
            report = asyncio.run(runners[workload]())
    else:
        report = asyncio.run(runners[workload]())
    text = render(report, args.backend)
    text += f"\n\nWhole run: {time.perf_counter() - t0:.1f} s wall ({tmp})."
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    suffix = "" if args.backend == "sqlite" else f"-{args.backend}"
    (out / f"workloads-{workload}{suffix}.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("workload", choices=[*WORKLOADS, "all"])
    ap.add_argument("--backend", choices=BACKENDS, default="sqlite")
    ap.add_argument("--n", type=int, default=0, help="history N (default: per workload)")
    ap.add_argument("--window", type=int, default=0, help="operations measured per size")
    ap.add_argument("--stream-kb", type=int, default=200, help="streaming: KB per answer")
    args = ap.parse_args()
    if args.workload != "all":
        print(run_one(args), flush=True)
        return
    # One process per workload: peak RSS is a process's high-water mark, so a workload
    # measured after another would report the other's peak.
    passed = [f"--backend={args.backend}", f"--stream-kb={args.stream_kb}"]
    passed += [f"--n={args.n}"] * bool(args.n) + [f"--window={args.window}"] * bool(args.window)
    for workload in WORKLOADS:
        cmd = [sys.executable, "-m", "benchmarks.workloads_bench", workload, *passed]
        subprocess.run(cmd, check=True)
        print(flush=True)


if __name__ == "__main__":
    main()
