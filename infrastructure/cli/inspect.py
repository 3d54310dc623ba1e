"""``pico inspect``: a session's live work, read-only: the head, every live task by role
(ready, inflight, waiting) with its conversation, kind, status, dependencies and marks.
The live tasks come from the indexed live-task rows (§7.2), never from task history."""

from __future__ import annotations

import asyncio

import typer

from pico.application.harness import Harness
from pico.domain.values import TaskSnapshot
from pico.infrastructure.cli.common import SessionOption, UrlArgument, UrlOption, location

__all__ = ["inspect_session", "register"]


def _task(task: TaskSnapshot) -> str:
    parts = [f"task {task.id}", f"conversation {task.conversation_id}", task.kind, task.status]
    if not task.foreground:
        parts.append("background")
    if task.after:
        parts.append("after " + ",".join(str(i) for i in task.after))
    if task.required_permit:
        parts.append(f"needs permit {task.required_permit!r}")
    if task.abort_requested:
        parts.append("abort requested")
    if task.owned_conversation_id is not None:
        parts.append(f"owns conversation {task.owned_conversation_id}")
    return "  " + " | ".join(parts)


async def inspect_session(url: str, session: str) -> list[str]:
    """The lines ``pico inspect`` prints."""
    async with await Harness.open(url, session=session, read_only=True) as h:
        live = await h.inspect()
        lines = [f"session {session!r}: head {h.head()}, main head {h.main_head()}"]
        total = sum(len(tasks) for tasks in live.values())
        if not total:
            lines.append("no live work")
        for role in ("ready", "inflight", "waiting"):
            if live[role]:
                lines.append(f"{role} ({len(live[role])}):")
                lines.extend(_task(t) for t in live[role])
        return lines


def _inspect(
    url: UrlArgument = None, url_option: UrlOption = None, session: SessionOption = "main"
) -> None:
    """Show a session's live work, reading only: every live task by role (ready, inflight,
    waiting), with its conversation, kind, status, dependencies, permit and abort mark."""
    for line in asyncio.run(inspect_session(location(url, url_option), session)):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command("inspect")(_inspect)
