"""``pico audit``: the session's stored events, in storage order, streamed page by page."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from typing import Annotated, TextIO

import typer

from pico.application.harness import Harness
from pico.application.ports import AuditRecord
from pico.infrastructure.cli.common import SessionOption, UrlArgument, UrlOption, location

__all__ = ["AUDIT_PAGE", "audit", "register"]

#: Events read per page while ``audit`` streams: memory stays flat for any log length.
AUDIT_PAGE = 1000


def _records(h: Harness, *, after: int = 0, page: int = AUDIT_PAGE) -> Iterator[AuditRecord]:
    while True:
        records = h.audit(after=after, limit=page)
        yield from records
        if len(records) < page:
            return
        after = records[-1].position


def _audit_line(r: AuditRecord) -> str:
    return json.dumps(
        {
            "position": r.position,
            "at": r.timestamp.isoformat() if r.timestamp else "-",
            "aggregate": r.aggregate,
            "version": r.version,
            "event": r.event,
            "payload": r.payload,
        },
        ensure_ascii=False,
    )


async def audit(
    url: str,
    session: str,
    *,
    after: int = 0,
    limit: int | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    page: int = AUDIT_PAGE,
) -> int:
    """Print the session's events after ``after`` as JSON lines, as they are read. With a
    ``limit``, print at most that many and say on ``err`` how many remain and where to
    page on. Returns the number of events printed."""
    out = out or sys.stdout
    err = err or sys.stderr
    printed = 0
    async with await Harness.open(url, session=session, read_only=True) as h:
        last = after
        for r in _records(h, after=after, page=page if limit is None else min(page, limit + 1)):
            if limit is not None and printed == limit:
                remaining = h.audit_count(after=last)
                noun = "event remains" if remaining == 1 else "events remain"
                print(
                    f"pico: printed {printed} event{'' if printed == 1 else 's'} "
                    f"(--limit {limit}); {remaining} more {noun}: continue with --after {last}",
                    file=err,
                )
                break
            out.write(_audit_line(r) + "\n")
            printed += 1
            last = r.position
        out.flush()
    return printed


def _audit(
    url: UrlArgument = None,
    url_option: UrlOption = None,
    session: SessionOption = "main",
    after: Annotated[
        int,
        typer.Option(
            "--after", min=0, help="Print events after this position (0: from the start)."
        ),
    ] = 0,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit",
            min=1,
            help="Print at most this many events and say how to page on (default: all).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print the session's stored events as JSON lines, in storage order."""
    asyncio.run(audit(location(url, url_option), session, after=after, limit=limit))


def register(app: typer.Typer) -> None:
    app.command("audit")(_audit)
