"""``pico audit``: the session's stored events, in storage order, as an auditor reads them
(``pico.audit_records``): JSON Lines with decoded payloads, CSV or a table; filters by
conversation, task, event type, time and position; constant memory for any log length."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Protocol, TextIO

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pico.application.audit import AUDIT_COLUMNS, AUDIT_PAGE, AuditEntry, audit_records
from pico.domain.errors import InvalidArgumentError, UnknownSessionError
from pico.infrastructure.cli.common import (
    SessionOption,
    UrlArgument,
    UrlOption,
    location,
    progress_bar,
)
from pico.infrastructure.container import open_storage

__all__ = ["AUDIT_PAGE", "Format", "audit", "register"]

#: Rows per rendered table: the table format keeps this many records in memory at most.
TABLE_ROWS = 100


class Format(StrEnum):
    """How ``pico audit`` prints records."""

    jsonl = "jsonl"
    csv = "csv"
    table = "table"


class _Writer(Protocol):
    def write(self, entry: AuditEntry) -> None: ...
    def close(self) -> None: ...


class _Jsonl:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, entry: AuditEntry) -> None:
        self.out.write(json.dumps(entry.to_json(), ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.out.flush()


class _Csv:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.rows = csv.writer(out, lineterminator="\n")
        self.rows.writerow(AUDIT_COLUMNS)

    def write(self, entry: AuditEntry) -> None:
        self.rows.writerow(
            [
                entry.position,
                "" if entry.at is None else entry.at.isoformat(),
                entry.aggregate,
                entry.version,
                entry.event,
                entry.owner or "",
                entry.host or "",
                "" if entry.pid is None else entry.pid,
                "" if entry.task is None else entry.task,
                json.dumps(entry.payload, ensure_ascii=False),
            ]
        )

    def close(self) -> None:
        self.out.flush()


class _Table:
    """A rich table, rendered every ``TABLE_ROWS`` records with fixed column widths, so the
    columns line up across chunks and memory stays flat. The payload column wraps."""

    def __init__(self, out: TextIO) -> None:
        terminal = out.isatty()
        self.console = Console(
            file=out, width=None if terminal else 160, markup=False, highlight=False
        )
        self.rows: list[AuditEntry] = []
        self.header = True

    def write(self, entry: AuditEntry) -> None:
        self.rows.append(entry)
        if len(self.rows) >= TABLE_ROWS:
            self._render()

    def close(self) -> None:
        if self.rows or self.header:
            self._render()
        self.console.file.flush()

    def _render(self) -> None:
        table = Table(box=box.SIMPLE_HEAD, show_header=self.header, pad_edge=False, expand=True)
        table.add_column("position", width=8, no_wrap=True, justify="right")
        table.add_column("at (UTC)", width=23, no_wrap=True)
        table.add_column("aggregate", width=14, no_wrap=True)
        table.add_column("v", width=4, no_wrap=True, justify="right")
        table.add_column("event", width=30, no_wrap=True)
        table.add_column("who", width=14, no_wrap=True)
        table.add_column("task", width=5, no_wrap=True, justify="right")
        # The payload wraps rather than being cut: an auditor never misses a field.
        table.add_column("payload", ratio=1, overflow="fold")
        for e in self.rows:
            who = "-" if e.owner is None else f"{e.owner[:8]}/{e.pid}"
            table.add_row(
                str(e.position),
                "-" if e.at is None else e.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:23],
                e.aggregate,
                str(e.version),
                e.event,
                who,
                "" if e.task is None else str(e.task),
                Text(json.dumps(e.payload, ensure_ascii=False, separators=(",", ":"))),
            )
        self.console.print(table)
        self.rows = []
        self.header = False


_WRITERS: dict[Format, Callable[[TextIO], _Writer]] = {
    Format.jsonl: _Jsonl,
    Format.csv: _Csv,
    Format.table: _Table,
}


@contextmanager
def _progress(
    total: Callable[[], int], err: TextIO, shown: bool
) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on ``err`` when ``shown`` (a terminal, not --quiet), else nothing."""
    with progress_bar("pico audit", err, shown=shown) as shown_bar:
        if shown_bar is None:
            yield None
            return
        bar, task = shown_bar
        bar.update(task, total=total())
        yield lambda n: bar.advance(task, n)


def _instant(text: str | None, option: str) -> datetime | None:
    """``--since``/``--until``: an ISO 8601 time with its timezone (``Z`` or ``+02:00``)."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            f"{option} {text!r} is not an ISO 8601 time; give one like 2026-12-01T15:00:00Z"
        ) from None
    if value.tzinfo is None:
        raise InvalidArgumentError(
            f"{option} {text!r} has no timezone, so the instant is unknown; add Z (UTC) or "
            "an offset such as +02:00"
        )
    return value


async def audit(
    url: str,
    session: str,
    *,
    conversation: int | None = None,
    task: int | None = None,
    events: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: int = 0,
    before: int | None = None,
    limit: int | None = None,
    fmt: Format = Format.jsonl,
    quiet: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
    page: int = AUDIT_PAGE,
) -> int:
    """Print the session's events (``pico.audit_records`` with these filters) in ``fmt`` as
    they are read. With a ``limit``, print at most that many and say on ``err`` how many
    remain and where to page on. Returns the number of records printed."""
    out = out or sys.stdout
    err = err or sys.stderr
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InvalidArgumentError(f"--limit must be 1 or more, got {limit!r}")
    filtered = any(x is not None for x in (conversation, task, events, since, until, before))
    printed = 0
    # Through the storage adapter, not a Harness: a session whose aggregates no longer
    # load (the damage an auditor is looking for) is still exported event by event.
    storage = open_storage(url, session=session, durability=None, read_only=True)
    try:
        if storage.count_events(after=0) == 0:
            raise UnknownSessionError(session)
        shown = not quiet and err.isatty()
        with _progress(lambda: storage.count_events(after=after), err, shown) as advance:
            records = audit_records(
                storage,
                conversation=conversation,
                task=task,
                events=events,
                since=since,
                until=until,
                after=after,
                before=before,
                page=page if limit is None else min(page, limit + 1),
                progress=advance,
            )
            writer = _WRITERS[fmt](out)
            last = after
            for entry in records:
                if limit is not None and printed == limit:
                    # Unfiltered: one indexed count; filtered: the rest is read and counted.
                    remaining = (
                        1 + sum(1 for _ in records)
                        if filtered
                        else storage.count_events(after=last)
                    )
                    writer.close()
                    what = "matching event" if filtered else "event"
                    noun = f"{what} remains" if remaining == 1 else f"{what}s remain"
                    print(
                        f"pico: printed {printed} event{'' if printed == 1 else 's'} "
                        f"(--limit {limit}); {remaining} more {noun}: continue with --after {last}",
                        file=err,
                    )
                    return printed
                writer.write(entry)
                printed += 1
                last = entry.position
            writer.close()
    finally:
        storage.close()
    return printed


def _audit(
    url: UrlArgument = None,
    url_option: UrlOption = None,
    session: SessionOption = "main",
    conversation: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Only events naming this conversation (its own events, its tasks' creation).",
            show_default=False,
        ),
    ] = None,
    task: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Only this task's own events and the events its execution wrote.",
            show_default=False,
        ),
    ] = None,
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            metavar="TYPE",
            help="Only events of this type, e.g. Conversation.EntryAppended (repeat for more).",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="TIME",
            help="Only events stored at or after this ISO 8601 time, e.g. 2026-12-01T15:00:00Z.",
            show_default=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            metavar="TIME", help="Only events stored before this ISO 8601 time.", show_default=False
        ),
    ] = None,
    after: Annotated[
        int, typer.Option(min=0, help="Only events after this position (0: from the start).")
    ] = 0,
    before: Annotated[
        int | None,
        typer.Option(min=1, help="Only events before this position.", show_default=False),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Print at most this many events and say how to page on (default: all).",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            help="jsonl: one JSON object per event, payloads decoded; csv: fixed columns, the "
            "payload as JSON; table: for people.",
        ),
    ] = Format.jsonl,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar (it shows only on a terminal).")
    ] = False,
) -> None:
    """Print the session's stored events in storage order, with who wrote them and when.

    Every event by default, streamed in constant memory. Each record: position, time
    (UTC), stream, version, event type, the claim current when it was written (owner,
    host, pid), the task whose execution wrote it, and the payload with JSON text fields
    decoded."""
    asyncio.run(
        audit(
            location(url, url_option),
            session,
            conversation=conversation,
            task=task,
            events=event,
            since=_instant(since, "--since"),
            until=_instant(until, "--until"),
            after=after,
            before=before,
            limit=limit,
            fmt=fmt,
            quiet=quiet,
        )
    )


def register(app: typer.Typer) -> None:
    app.command("audit")(_audit)
