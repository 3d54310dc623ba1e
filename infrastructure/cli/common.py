"""What every ``pico`` command shares: where the session is (the storage URL as the first
argument or ``--url``, and ``--session``), and the one-line rendering of an error.

A command module imports these; ``app.py`` imports the command modules, so the shared
pieces live here rather than in ``app.py`` (no import cycle)."""

from __future__ import annotations

from typing import Annotated

import typer

from pico.domain.errors import InvalidArgumentError

__all__ = ["SessionOption", "UrlArgument", "UrlOption", "location", "one_line"]

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
