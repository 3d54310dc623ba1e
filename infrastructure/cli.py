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

from pico.application.harness import ConversationHandle, Harness
from pico.domain.errors import PicoError
from pico.domain.json import JsonValue

__all__ = ["main"]


def _text(content: JsonValue) -> str:
    return content if isinstance(content, str) else json.dumps(content)


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


async def demo(db: Path) -> str:
    """Open a SQLite session file, write conversations, entries, a compaction and a fork,
    and print the transcript and context of each."""
    if db.exists():
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    out = [f"pico demo: session 'main' in {db}", ""]
    async with await Harness.open(url, session="main") as h:
        a = await h.root()
        q1 = await a.append("user", "Inspect the parser")
        await a.append("assistant", "The parser has two problems: recursion and error recovery.")
        await a.append("user", "Explain the first one")
        call = await a.append(
            "assistant", "Let me read the file.", metadata={"tool_calls": ["read-1"]}
        )
        result = await a.append(
            "tool",
            "def parse(tokens): return parse(tokens[1:])",
            metadata={"tool_call_id": "read-1"},
        )
        await a.append("assistant", "parse() recurses on every token: deep input overflows.")
        fork_point = result
        await a.compact(
            "Summary: the parser recurses per token and lacks error recovery.", through=q1 + 2
        )
        b = await a.fork(at_entry=fork_point)
        await b.append("user", "Instead, rewrite parse() as a loop.")
        await a.handoff("Handoff: continue with error recovery only.")
        out.append(
            f"forked conversation {b.id} from {a.id} at entry {fork_point} "
            f"(tool call {call} answered by {result})"
        )
        out.append(f"session head {h.head()}, main head {h.main_head()}")
        out.append("")
        for conv in (a, b):
            await print_conversation(h, conv, out)
            out.append("")
    async with await Harness.open(url, session="main", read_only=True) as r:
        out.append(f"reopened read-only: {len(r.audit(limit=100000))} events in the audit log")
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
