"""``pico check``: verify a stored session without writing (``pico.check``), one finding
per line; exit code 0 when clean, 1 with findings."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

import typer

from pico.infrastructure.cli.common import SessionOption, UrlArgument, UrlOption, location

__all__ = ["check", "register"]


async def check(url: str, session: str, out: TextIO | None = None) -> int:
    """Verify a session (``pico.check``) and print each finding on its own line. Returns
    the exit code: 0 clean, 1 findings."""
    from pico.infrastructure.verify import check as verify

    out = out or sys.stdout
    report = await verify(url, session=session)
    for finding in report.findings:
        out.write(f"{finding}\n")
    summary = "clean" if report.ok else f"{len(report.findings)} finding(s)"
    skipped = "".join(f"; skipped: {s}" for s in report.skipped)
    out.write(f"session {session!r}: {report.events} events checked, {summary}{skipped}\n")
    out.flush()
    return 0 if report.ok else 1


def _check(
    url: UrlArgument = None, url_option: UrlOption = None, session: SessionOption = "main"
) -> None:
    """Verify a stored session, reading only.

    The SQLite integrity check (every line of
    a JSONL journal parses), every event decodes, versions are contiguous, batches end with
    their boundary and match their hash chain link, and the read model equals a replay of
    the events. Exit code 0: clean;
    1: findings, one per line; 2: the check could not run."""
    code = asyncio.run(check(location(url, url_option), session))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("check")(_check)
