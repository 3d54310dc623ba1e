"""``pico.verify``: the hash chain over a stored session, from Python (the command is
``infrastructure/cli/verify.py``).

``verify`` reads through the storage adapter alone (no ``Harness``: a session whose
aggregates no longer load must still be verifiable), opened read-only, so it runs beside
the owner. ``start_chain`` is the one that writes: it opens the session for writing and
records ``Session.ChainStarted`` (``Harness.start_chain``).
"""

from __future__ import annotations

import asyncio

from pico.application.chain import ChainReport
from pico.application.harness import Harness
from pico.domain.errors import UnknownSessionError
from pico.infrastructure.container import open_storage

__all__ = ["start_chain", "verify"]


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
