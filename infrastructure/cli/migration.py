"""``pico replay``, ``pico rebuild`` and ``pico migrate`` (issue 13: the read model is
derived, the events are the truth). ``register(app)`` adds the three commands.

Exit codes: 0 equal (or rebuilt, or migrated and proved equal); 1 differences found (the
rows are listed) or a copy that does not prove equal; 2 bad input, usage, or storage that
cannot be used (one line on stderr, ``pico: <message>``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TextIO

import typer
from rich.console import Console

from pico.domain.errors import PicoError
from pico.infrastructure.cli.common import (
    SessionOption,
    UrlArgument,
    UrlOption,
    location,
    one_line,
    progress_bar,
)

__all__ = ["register"]


def _fail(exc: PicoError) -> typer.Exit:
    typer.echo(f"pico: {one_line(str(exc))}", err=True)
    return typer.Exit(2)


def _print(lines: list[str], out: TextIO) -> None:
    console = Console(file=out, markup=False, highlight=False, width=None if out.isatty() else 160)
    for line in lines:
        console.print(line, soft_wrap=True)


def _replay(
    url: UrlArgument = None, url_option: UrlOption = None, session: SessionOption = "main"
) -> None:
    """Rebuild the session's read model from its events into fresh tables and compare it
    with the live read model, row by row. Reads only. Exit code 0: equal; 1: the differing
    rows are listed (at most 20 per table, all counted)."""
    from pico.infrastructure.replay import replay

    try:
        report = asyncio.run(replay(location(url, url_option), session=session))
    except PicoError as exc:
        raise _fail(exc) from None
    _print(report.lines(), sys.stdout)
    if not report.equal:
        raise typer.Exit(1)


def _rebuild(
    url: UrlArgument = None, url_option: UrlOption = None, session: SessionOption = "main"
) -> None:
    """Replace the session's read model with one rebuilt from its events, in one
    transaction under the database's write lock (a failure leaves the old one).
    Working-scope rows are kept. JSONL keeps no read model on disk: there it verifies."""
    from pico.infrastructure.replay import rebuild

    try:
        report = asyncio.run(rebuild(location(url, url_option), session=session))
    except PicoError as exc:
        raise _fail(exc) from None
    _print(report.lines(), sys.stdout)


@contextmanager
def _bar(shown: bool, err: TextIO) -> Iterator[Callable[[int, int], None] | None]:
    with progress_bar("pico migrate", err, shown=shown) as shown_bar:
        if shown_bar is None:
            yield None
            return
        bar, task = shown_bar

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _migrate(
    source: Annotated[
        str, typer.Option("--from", metavar="URL", help="Where the session is.", show_default=False)
    ],
    target: Annotated[
        str,
        typer.Option(
            "--to", metavar="URL", help="Where to copy it (created if new).", show_default=False
        ),
    ],
    session: SessionOption = "main",
    as_name: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="NAME",
            help="The copy's session name (default: the same). Stream ids and chain links "
            "are derived again for it.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bar (it shows only on a terminal).")
    ] = False,
) -> None:
    """Copy one session between sqlite, postgresql and jsonl storage, batch by batch, and
    prove the copy equal: stored bodies byte for byte, the hash chain on the target, and
    the two read models row by row. An existing target session is refused; an interrupted
    copy resumes when run again. Exit code 0: proved equal; 1: not equal."""
    from pico.infrastructure.migrate import migrate

    try:
        with _bar(not quiet and sys.stderr.isatty(), sys.stderr) as advance:
            report = asyncio.run(
                migrate(source, target, session=session, as_name=as_name, progress=advance)
            )
    except PicoError as exc:
        raise _fail(exc) from None
    _print(report.lines(), sys.stdout)
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``replay``, ``rebuild`` and ``migrate`` to ``app``."""
    app.command("replay")(_replay)
    app.command("rebuild")(_rebuild)
    app.command("migrate")(_migrate)
