"""``pico verify``: recompute a session's hash chain from its stored events
(``pico.verify``). Exit code 0: "verified N events through position P"; 1: the first
position where history was changed, one break per line. ``--start-chain`` is the one
writing option: it anchors history written before the chain (``Harness.start_chain``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from pico.infrastructure.cli.common import SessionOption, UrlArgument, UrlOption, location
from pico.infrastructure.tamper import start_chain, verify

__all__ = ["register"]


def _verify(
    url: UrlArgument = None,
    url_option: UrlOption = None,
    session: SessionOption = "main",
    start: Annotated[
        bool,
        typer.Option(
            "--start-chain",
            help="Anchor the history written before the hash chain: writes ONE "
            "Session.ChainStarted event (opens the session for writing), then verifies.",
        ),
    ] = False,
) -> None:
    """Verify a session's hash chain, reading only.

    Every event is read, decoded and checked against its type's schema, and every
    commit's link is recomputed from the previous link and the commit's stored bytes.
    Exit code 0: verified (the head link is printed: record it); 1: history was changed,
    the first position first; 2: the verification could not run."""
    where = location(url, url_option)
    if start:
        anchored, report = asyncio.run(start_chain(where, session=session))
        typer.echo(f"anchored {anchored} events written before the hash chain")
    else:
        report = asyncio.run(verify(where, session=session))
    if report.ok:
        typer.echo(report.summary())
        return
    for found in report.breaks:
        typer.echo(f"session {report.session!r}: history was changed at {found}")
    typer.echo(report.summary())
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("verify")(_verify)
