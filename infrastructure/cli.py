"""The ``pico`` command line: a demo session, transcripts, and the audit log.

python -m pico demo [--db demo.db]
python -m pico show  --url sqlite:///demo.db [--session main]
python -m pico audit --url sqlite:///demo.db [--session main] [--after N] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pico.application.clock import FakeClock
from pico.application.faux import FauxProvider, FauxResponse
from pico.application.harness import ConversationHandle, Harness
from pico.application.tools import Tool, ToolContext
from pico.domain.errors import PicoError
from pico.domain.json import JsonObject, JsonValue

__all__ = ["main"]


def _text(content: JsonValue) -> str:
    """A readable one-line rendering: message text, tool calls, tool results."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        parts = []
        text = content.get("text", content.get("content"))
        if isinstance(text, str) and text:
            parts.append(text.replace("\n", " | ")[:160])
        calls = content.get("tool_calls")
        if isinstance(calls, list) and calls:
            rendered = [
                f"{c.get('name')}({json.dumps(c.get('arguments'))})"
                for c in calls
                if isinstance(c, dict)
            ]
            parts.append("-> " + ", ".join(rendered))
        if content.get("is_error") is True:
            parts.append("(error)")
        if parts:
            return " ".join(parts)
    return json.dumps(content)


async def print_conversation(h: Harness, conv: ConversationHandle, out: list[str]) -> None:
    snap = await conv.snapshot()
    origin = (
        f" (fork of {snap.source.conversation_id} after commit {snap.source.as_of})"
        if snap.source
        else ""
    )
    out.append(f"conversation {conv.id}{origin}")
    out.append("  transcript:")
    after: int | None = None
    while True:
        page = await conv.entries(after=after, limit=200)
        for e in page.items:
            own = "" if e.conversation_id == conv.id else f"  [from {e.conversation_id}]"
            out.append(f"    {e.id:>4} {e.kind:<9} {_text(e.content)}{own}")
        if page.next is None:
            break
        after = page.next
    out.append(f"  context (revision {snap.prefix_revision}):")
    for e in await conv.context_entries():
        out.append(f"    {e.id:>4} {e.kind:<9} {_text(e.content)}")


def _demo_tools(files: dict[str, str], clock: FakeClock) -> list[Tool]:
    schema: JsonObject = {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }

    async def read(args: JsonObject, ctx: ToolContext) -> str:
        path = str(args["path"])
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    async def grep(args: JsonObject, ctx: ToolContext) -> str:
        await clock.sleep_until(clock.now() + 0.2)  # a search that takes a moment
        hits = [
            f"{p}: {line}"
            for p, text in files.items()
            for line in text.splitlines()
            if str(args["path"]) in line
        ]
        return "\n".join(hits) or "no matches"

    return [
        Tool("read", "Read a file", schema, read, replay="safe"),
        Tool("grep", "Find lines containing a string (pass it as path)", schema, grep),
    ]


def _demo_script() -> list[Any]:
    return [
        "The parser has two problems: it recurses once per token, and it has no error recovery.",
        FauxResponse(
            text="Let me read it.",
            tool_calls=[("read", {"path": "parser.py"}), ("grep", {"path": "parse("})],
        ),
        lambda request: (
            (
                "Yes, an empty token list returns at once. "
                if "empty input" in request.messages[-1].text
                else ""
            )
            + (
                f"parse() calls itself on tokens[1:], so depth grows with input "
                f"({len(request.messages)} messages in context). Use a loop."
            )
        ),
        "I was going to explain every detail of the parser, token by token ...",
        "Error recovery: skip to the next statement boundary and record the error.",
    ]


async def demo(db: Path) -> str:
    """An agent session on SQLite with the faux provider and two tools: a plain turn, a
    tool turn, an aborted turn, a reopen that continues; then the transcript."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    files = {"parser.py": "def parse(tokens):\n    return parse(tokens[1:])\n"}
    clock = FakeClock()
    provider = FauxProvider(_demo_script(), chunk_chars=6, cadence=0.05, clock=clock)
    out = [f"pico demo: an agent session in {db} (faux provider, tools: read, grep)", ""]

    async def drive_with_time(conv: ConversationHandle) -> str:
        driving = asyncio.ensure_future(conv.drive())
        while not driving.done():
            await asyncio.sleep(0)
            clock.advance(0.05)  # the faux stream's cadence follows this clock
        return driving.result()

    async def open_demo() -> Harness:
        return await Harness.open(
            url,
            session="main",
            provider=provider,
            tools=_demo_tools(files, clock),
            clock=clock,
            model="faux",
        )

    h = await open_demo()
    c = await h.root()
    input_id = await c.accept("Inspect the parser")
    out.append(
        f"> Inspect the parser\n  drive: {await drive_with_time(c)}; result: "
        f"{await c.result(input_id)}"
    )
    # A tool turn, with the user steering while the tools run.
    input_id = await c.accept("Explain the first problem")
    driving = asyncio.ensure_future(c.drive())
    steer_id = None
    while not driving.done():
        await asyncio.sleep(0)
        running = [
            t for t in (await h.tasks(kind="tool", live=True)).items if t.status == "running"
        ]
        if running and steer_id is None:
            steer_id = await c.steer("Also: is the fix safe for empty input?")
        clock.advance(0.05)
    out.append(
        f"> Explain the first problem (+ a steer during tool execution)\n  drive: "
        f"{driving.result()}; result: {await c.result(input_id)}; steer result: "
        f"{await c.result(steer_id) if steer_id else None}"
    )
    # An aborted turn: the abort is durable intent; the drive performs the cleanup.
    input_id = await c.accept("Explain everything in detail")
    driving = asyncio.ensure_future(c.drive())
    for _ in range(30):
        await asyncio.sleep(0)
    clock.advance(0.05)
    await asyncio.sleep(0)
    marked = await c.abort()
    while not driving.done():
        await asyncio.sleep(0)
        clock.advance(0.05)
    out.append(
        f"> Explain everything in detail\n  aborted tasks {marked}; result: "
        f"{await c.result(input_id)}"
    )
    await h.close()
    # A new process: reopen and continue the same conversation.
    provider.requests.clear()
    h = await open_demo()
    c = await h.root()
    input_id = await c.accept("And the second problem?")
    outcome = await drive_with_time(c)
    out.append(
        f"> And the second problem? (after reopening)\n  drive: {outcome}; result: "
        f"{await c.result(input_id)}"
    )
    out.append("")
    await print_conversation(h, c, out)
    tasks = await h.tasks(limit=100)
    out.append("")
    out.append("tasks: " + ", ".join(f"{t.id} {t.kind} {t.status}" for t in tasks.items))
    out.append(f"session head {h.head()}, {len(h.audit(limit=100000))} events in the audit log")
    await h.close()
    return "\n".join(out)


async def show(url: str, session: str) -> str:
    out: list[str] = []
    async with await Harness.open(url, session=session, read_only=True) as h:
        after: int | None = None
        while True:
            page = await h.conversations(after=after, limit=100)
            for snap in page.items:
                await print_conversation(h, ConversationHandle(h, snap.id), out)
                out.append("")
            if page.next is None:
                break
            after = page.next
    return "\n".join(out)


async def audit(url: str, session: str, after: int, limit: int) -> str:
    out: list[str] = []
    async with await Harness.open(url, session=session, read_only=True) as h:
        for r in h.audit(after=after, limit=limit):
            when = r.timestamp.isoformat() if r.timestamp else "-"
            out.append(
                json.dumps(
                    {
                        "position": r.position,
                        "at": when,
                        "aggregate": r.aggregate,
                        "version": r.version,
                        "event": r.event,
                        "payload": r.payload,
                    },
                    ensure_ascii=False,
                )
            )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pico", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run the demo session on a SQLite file")
    p_demo.add_argument("--db", type=Path, default=Path("pico-demo.db"))
    for name, text in (("show", "print every conversation"), ("audit", "print stored events")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--url", required=True, help="e.g. sqlite:///pico-demo.db")
        p.add_argument("--session", default="main")
        if name == "audit":
            p.add_argument("--after", type=int, default=0)
            p.add_argument("--limit", type=int, default=1000)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            text = asyncio.run(demo(args.db))
        elif args.command == "show":
            text = asyncio.run(show(args.url, args.session))
        else:
            text = asyncio.run(audit(args.url, args.session, args.after, args.limit))
    except PicoError as exc:
        print(f"pico: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0
