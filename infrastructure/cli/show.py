"""``pico show``: every conversation's transcript and current context, read-only."""

from __future__ import annotations

import asyncio
import json

import typer

from pico.application.conversation import ConversationHandle
from pico.application.harness import Harness
from pico.domain.json import JsonValue
from pico.infrastructure.cli.common import SessionOption, UrlArgument, UrlOption, location

__all__ = ["print_conversation", "register", "show"]


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
    """Append ``conv``'s transcript (paged) and its current context to ``out``."""
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


async def show(url: str, session: str) -> str:
    """Every conversation of ``session``, opened read-only (no claim, nothing written)."""
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


def _show(
    url: UrlArgument = None, url_option: UrlOption = None, session: SessionOption = "main"
) -> None:
    """Print every conversation's transcript and context."""
    print(asyncio.run(show(location(url, url_option), session)))


def register(app: typer.Typer) -> None:
    app.command("show")(_show)
