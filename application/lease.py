"""Session leases (issue 16; seed 003 §1.2 "One writer per session"): the owner of a
session on PostgreSQL holds a lease row that expires on the database's clock unless it
is renewed, and stops itself before the database could let another worker take over.

``Lease`` is the configuration (``Harness.open(url, lease=Lease(...))``); ``Heartbeat``
acquires the lease before the claim, renews it in an asyncio task on its own connection,
and calls ``on_lost`` at the owner's LOCAL deadline if no renewal succeeded by then
(docs/workers.md has the timing argument). The SQL is infrastructure's (``LeaseStore``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pico.domain.errors import InvalidArgumentError

__all__ = ["Heartbeat", "Lease", "LeaseStore"]

log = logging.getLogger("pico.lease")

#: How long ``close`` waits for the lease row to be deleted before leaving it to expire.
RELEASE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Lease:
    """A session lease: held for ``ttl`` seconds after each renewal, renewed every
    ``renew_every`` seconds (``0 < renew_every < ttl / 2``: a renewal may fail once and
    the next still lands before the owner's deadline).

    ``margin`` (``min(1 s, ttl / 4)``) is how much earlier than the database's expiry the
    owner stops: it covers a difference in clock RATE between the worker and the database
    over one ``ttl``, never a difference in wall-clock time (none is compared)."""

    ttl: float = 10.0
    renew_every: float = 3.0
    #: The holder's name. None (the default): a new unique name per open. A worker passes
    #: its own, so that a lease its pick took (``pico_work``) is acquired as its own.
    owner: str | None = None

    def __post_init__(self) -> None:
        if self.owner is not None and (
            not isinstance(self.owner, str) or not self.owner or len(self.owner) > 200
        ):
            raise InvalidArgumentError(
                f"Lease owner must be None or a non-empty name of at most 200 characters, "
                f"got {self.owner!r}"
            )
        for name in ("ttl", "renew_every"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(
                    f"Lease {name} must be a finite number of seconds above 0, got {value!r}"
                )
        if not self.renew_every < self.ttl / 2:
            raise InvalidArgumentError(
                f"Lease renew_every ({self.renew_every!r}s) must be below half the ttl "
                f"({self.ttl!r}s), so that one failed renewal still leaves time for the "
                f"next; e.g. Lease(ttl={self.ttl!r}, renew_every={self.ttl / 4!r})"
            )

    @property
    def margin(self) -> float:
        """Seconds the owner stops before the database's expiry of its last renewal."""
        return min(1.0, self.ttl / 4)


class LeaseStore(Protocol):
    """The lease rows (PostgreSQL: ``infrastructure/sql/lease.py``), on a connection of
    their own so a busy writer never delays a renewal. Expiry is the database's
    ``now() + ttl``; ``expires_at`` values are the database's timestamps."""

    async def acquire(self, session_id: str, owner: str, ttl: float) -> Any:
        """Take the lease if it is free, expired or already ``owner``'s; returns its new
        expiry. Held by another and unexpired: ``SessionLeasedError``, nothing written."""
        ...

    async def renew(self, session_id: str, owner: str, ttl: float) -> Any | None:
        """Extend ``owner``'s lease to ``now() + ttl``; its new expiry, or None when
        ``owner`` no longer holds it."""
        ...

    async def release(self, session_id: str, owner: str, due: float | None = None) -> None:
        """Delete the lease row if ``owner`` still holds it, and in the same transaction
        advertise the session's remaining work to workers: due in ``due`` seconds (0:
        now), or none (None) unless a command waits in its inbox (docs/workers.md)."""
        ...

    def close(self) -> None:
        """Drop the connection at once (synchronous, like the storage's close)."""
        ...


def new_owner() -> str:
    """A lease owner name unique to one open: host, process id and a random suffix, so
    the holder an error names can be found."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Heartbeat:
    """One open's lease: acquired by ``start``, renewed every ``renew_every`` seconds,
    released by ``stop``.

    The owner keeps a LOCAL deadline on the event loop's monotonic clock: the moment it
    SENT its last successful renewal (or acquisition), plus ``ttl - margin``. The
    database computed that renewal's expiry as its own ``now() + ttl`` when it executed
    the statement, which is after the send, so the deadline falls at least ``margin``
    before the database lets another worker acquire the lease. A timer fires
    ``on_lost`` at the deadline whatever a renewal in flight is doing (a hung connection
    cannot postpone it); a renewal that fails or finds the lease gone fires it at once.
    After that the lease is never renewed again."""

    def __init__(self, store: LeaseStore, lease: Lease, session_id: str) -> None:
        self.store = store
        self.lease = lease
        self.session_id = session_id
        self.owner = lease.owner or new_owner()
        #: The database's expiry of the last successful renewal (its timestamp).
        self.expires_at: Any = None
        #: Why the lease was lost (None while held).
        self.lost: str | None = None
        #: Set when the lease is lost (a worker waits on it).
        self.lost_event = asyncio.Event()
        #: Called once, with the reason, when the lease is lost.
        self.on_lost: Callable[[str], None] | None = None
        self.renewals = 0
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def deadline(self) -> float:
        """The local deadline on the event loop's clock (``loop.time()``)."""
        return self._deadline

    async def start(self) -> None:
        """Acquire the lease (``SessionLeasedError`` when another holds it) and start
        renewing it."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        self.expires_at = await self.store.acquire(self.session_id, self.owner, self.lease.ttl)
        self._extend(sent)
        self._task = asyncio.ensure_future(self._renewing())

    def _extend(self, sent: float) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = sent + self.lease.ttl - self.lease.margin
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._deadline, self._expired)

    def _expired(self) -> None:
        self._timer = None
        self.lose(
            f"the lease was not renewed within {self.lease.ttl - self.lease.margin:.1f}s "
            "(ttl minus the safety margin): another worker may take the session over"
        )

    def check(self) -> None:
        """Before admitting a write: lose the lease now if its local deadline has passed
        (the loop may have been too busy to run the timer yet)."""
        if (
            self.lost is None
            and not self._stopped
            and asyncio.get_running_loop().time() >= self._deadline
        ):
            self._expired()

    def lose(self, reason: str) -> None:
        if self.lost is not None or self._stopped:
            return
        self.lost = f"lease lost: {reason}"
        log.warning("session %r: %s", self.session_id, self.lost)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()  # a hung renewal: never renew again
        self.lost_event.set()
        if self.on_lost is not None:
            self.on_lost(self.lost)

    async def _renewing(self) -> None:
        loop = asyncio.get_running_loop()
        while self.lost is None:
            await asyncio.sleep(self.lease.renew_every)
            sent = loop.time()
            remaining = self._deadline - sent
            if remaining <= 0:
                self._expired()
                return
            try:
                renewed = await asyncio.wait_for(
                    self.store.renew(self.session_id, self.owner, self.lease.ttl), remaining
                )
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                self._expired()
                return
            except Exception as exc:
                self.lose(f"renewing it failed ({exc})")
                return
            if self.lost is not None:
                return  # lost while the renewal was in flight: its answer changes nothing
            if renewed is None:
                self.lose("another worker holds it now")
                return
            self.expires_at = renewed
            self.renewals += 1
            self._extend(sent)

    async def stop(self, due: float | None = 0.0) -> None:
        """Stop renewing and delete the lease row if still ours (after the line closed:
        nothing is written under it any more), advertising work due in ``due`` seconds
        (None: none; the default 0 when unknown), then drop the connection."""
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(task), 0.5)
        try:
            await asyncio.wait_for(
                self.store.release(self.session_id, self.owner, due), RELEASE_TIMEOUT
            )
        except Exception as exc:  # it expires by itself within ttl
            log.info("session %r: lease not released (%s); it expires", self.session_id, exc)
        finally:
            self.store.close()
