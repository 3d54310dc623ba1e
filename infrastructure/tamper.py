"""``pico verify``: the hash chain over a stored session, from Python and the command line.

Reads through the storage adapter alone (no ``Harness``: a session whose aggregates no
longer load must still be verifiable), opened read-only, so it runs beside the owner.
``--start-chain`` is the one writing option: it opens the session for writing and records
``Session.ChainStarted`` (``Harness.start_chain``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from pico.application.chain import ChainReport
from pico.application.harness import Harness
from pico.domain.errors import UnknownSessionError
from pico.infrastructure.container import open_storage

__all__ = ["register", "verify"]


async def verify(url: str, *, session: str = "main") -> ChainReport:
    """Recompute a stored session's hash chain, reading only.

    Raises ``ConfigurationError`` (a bad URL), ``StorageUnavailableError`` (unreachable or
    missing storage), ``UnknownSessionError`` (no such session) and
    ``StorageCorruptError`` (an event that does not decode or match its schema, by
    position)."""
    return await asyncio.to_thread(_verify, url, session)


def _verify(url: str, session: str) -> ChainReport:
    storage = open_storage(url, session=session, durability=None, read_only=True)
    try:
        report = storage.verify_chain()
    finally:
        storage.close()
    if report.events == 0:
        raise UnknownSessionError(session)
    return report


async def start_chain(url: str, *, session: str = "main") -> tuple[int, ChainReport]:
    """Anchor a session written before the chain, then verify it."""
    async with await Harness.open(url, session=session) as h:
        anchored = await h.start_chain()
        return anchored, await h.verify()


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify_command(
        url: Annotated[
            str,
            typer.Argument(help="Storage URL: sqlite:///file.db, postgresql://..., jsonl:///dir"),
        ],
        session: Annotated[str, typer.Option(help="The session to verify.")] = "main",
        start_chain_: Annotated[
            bool,
            typer.Option(
                "--start-chain",
                help="Anchor history written before the hash chain (writes ONE "
                "Session.ChainStarted event; opens the session for writing).",
            ),
        ] = False,
    ) -> None:
        """Recompute the hash chain from the log: "verified N events through position P",
        or the first position where history was changed (exit code 1)."""
        if start_chain_:
            anchored, report = asyncio.run(start_chain(url, session=session))
            typer.echo(f"anchored {anchored} events written before the hash chain")
        else:
            report = asyncio.run(verify(url, session=session))
        if report.ok:
            typer.echo(report.summary())
            return
        for found in report.breaks:
            typer.echo(f"session {report.session!r}: history was changed at {found}")
        typer.echo(report.summary(), err=True)
        raise typer.Exit(1)
