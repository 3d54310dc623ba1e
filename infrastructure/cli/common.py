"""What every ``pico`` command shares: where the session is (the storage URL as the first
argument or ``--url``, and ``--session``), and the one-line rendering of an error.

A command module imports these; ``app.py`` imports the command modules, so the shared
pieces live here rather than in ``app.py`` (no import cycle)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, TextIO

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from pico.domain.errors import InvalidArgumentError

__all__ = [
    "SessionOption",
    "UrlArgument",
    "UrlOption",
    "location",
    "one_line",
    "progress_bar",
]

UrlArgument = Annotated[
    str | None,
    typer.Argument(
        help="The storage URL, e.g. sqlite:///pico-demo.db, postgresql://user@host/db or "
        "jsonl:///sessions.",
        show_default=False,
    ),
]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", metavar="URL", help="The storage URL, as an option.", show_default=False),
]
SessionOption = Annotated[str, typer.Option("--session", help="The session name.")]


def location(url: str | None, url_option: str | None) -> str:
    """The storage URL, given once: as the first argument (``pico audit sqlite:///x.db``)
    or as ``--url``; ``InvalidArgumentError`` otherwise."""
    if url is not None and url_option is not None:
        raise InvalidArgumentError(
            "give the storage URL once: as the first argument or as --url, not both"
        )
    chosen = url if url is not None else url_option
    if chosen is None:
        raise InvalidArgumentError(
            "the storage URL is required: give it as the first argument or as --url, e.g. "
            "sqlite:///pico-demo.db"
        )
    return chosen


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    return " ".join(text.split()) or "(no message)"


@contextmanager
def progress_bar(
    label: str, err: TextIO, *, shown: bool
) -> Iterator[tuple[Progress, TaskID] | None]:
    """A transient rich progress bar of events on ``err`` when ``shown`` (a terminal and
    not ``--quiet``): ``(bar, task)`` to advance, or None. Never on piped output."""
    if not shown:
        yield None
        return
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(file=err),
        transient=True,
    )
    with bar:
        yield bar, bar.add_task("events", total=None)
