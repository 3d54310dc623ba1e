"""Workers (issue 16, docs/workers.md): processes that claim sessions with work, drive
them under a lease, execute the commands other processes left in their inboxes, and
release them when idle.

A ``Worker`` holds up to ``concurrency`` sessions. Its loop picks due sessions from the
work queue (PostgreSQL: ``pico_work`` rows and expired leases, taken with ``FOR UPDATE
SKIP LOCKED`` together with their leases, so two workers never pick one session), and
runs each in a ``SessionRunner``: open the session under the lease the pick took, drain
its inbox, drive it, and close it once nothing happened for ``idle_after`` seconds and
no work is due within that time (closing releases the lease and advertises the next due
work). Wakeups come as notifications (a submitted command, work advertised by a release);
every ``poll_every`` seconds the worker looks anyway, so a lost notification only delays.

The SQL lives in infrastructure (``WorkQueue`` below is its port).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from pico.application.inbox import InboxItem, execute, is_verdict, reply_json
from pico.application.lease import Lease, new_owner
from pico.domain.errors import InvalidArgumentError, PicoError, StaleWriterError

__all__ = ["SessionRunner", "WorkQueue", "Worker"]

log = logging.getLogger("pico.worker")

#: Seconds before a session whose open or drive failed is offered to a worker again.
FAILURE_BACKOFF = 30.0


class WorkQueue(Protocol):
    """The database side of a worker (PostgreSQL: ``infrastructure/sql/work.py``)."""

    async def pick(self, owner: str, ttl: float, limit: int) -> list[str]:
        """Take up to ``limit`` sessions with work due and no live lease, each with a
        lease held by ``owner`` for ``ttl`` seconds, in one transaction."""
        ...

    async def next_due(self) -> float | None:
        """Seconds until the earliest work another pick could take (0: now), or None."""
        ...

    async def waiting(self, session_ids: Sequence[str]) -> set[str]:
        """Which of these sessions have a command waiting in their inbox."""
        ...

    async def pending(self, session_id: str) -> list[InboxItem]:
        """The session's waiting commands, oldest first."""
        ...

    async def reply(self, item: InboxItem, owner: str, reply: str) -> bool:
        """Store the reply and mark the command done, iff ``owner`` holds the lease."""
        ...

    async def abandon(self, session_id: str, owner: str, due: float) -> None:
        """Give a picked session back (its open failed): lease released, work due in
        ``due`` seconds."""
        ...

    async def wait(self, timeout: float) -> set[str]:
        """Wait up to ``timeout`` seconds for a notification; the session ids named."""
        ...

    async def close(self) -> None: ...


Opener = Callable[..., Awaitable[Any]]


class SessionRunner:
    """One held session: opened under the worker's lease, driven, its inbox drained,
    closed when idle, when its lease is lost, or when the worker stops."""

    def __init__(self, worker: Worker, session_id: str) -> None:
        self.worker = worker
        self.session_id = session_id
        self.harness: Any = None
        self.woken = asyncio.Event()
        self.woken.set()  # drain at once: the pick may be for a waiting command
        #: Inbox commands executed (replied) by this runner.
        self.executed = 0
        #: Why the runner ended: "idle", "lease lost", "stopped", or an error.
        self.ended: str | None = None

    def wake(self) -> None:
        self.woken.set()

    async def run(self) -> None:
        worker = self.worker
        try:
            self.harness = await worker.opener(
                worker.url,
                session=self.session_id,
                lease=dataclasses.replace(worker.lease, owner=worker.owner),
                **worker.options,
            )
        except StaleWriterError as exc:  # another worker got in first: not ours
            self.ended = f"not opened: {exc}"
            return
        except Exception as exc:
            self.ended = f"not opened: {exc}"
            log.error(
                "worker %s: session %r could not be opened: %s", worker.owner, self.session_id, exc
            )
            with contextlib.suppress(Exception):
                await worker.queue.abandon(self.session_id, worker.owner, FAILURE_BACKOFF)
            return
        try:
            self.ended = await self._serve()
        finally:
            # Releases the lease, advertising what is due; a failed drive backs off.
            failed = self.ended is None or self.ended.startswith("drive failed")
            await self.harness.close(backoff=FAILURE_BACKOFF if failed else 0.0)

    async def _serve(self) -> str:
        worker, harness = self.worker, self.harness
        lost = harness.lease.lost_event
        drive: asyncio.Future[Any] | None = None
        # A drive runs until the session is idle or suspended; the next starts only after
        # something changed (a commit, an ended execution, an observer's event, a command).
        needed = True
        try:
            while True:
                if harness.faulted is not None or lost.is_set():
                    return "lease lost" if lost.is_set() else f"faulted: {harness.faulted}"
                if worker.stopping.is_set():
                    return "stopped"
                if self.woken.is_set():
                    self.woken.clear()
                    await self._drain()
                    needed = True
                if drive is not None and drive.done():
                    error = drive.exception()
                    drive = None
                    if error is not None:
                        if lost.is_set() or harness.faulted is not None:
                            continue
                        log.error("worker %s: session %r: %s", worker.owner, self.session_id, error)
                        return f"drive failed: {error}"
                if drive is None and needed:
                    needed = False
                    drive = asyncio.ensure_future(harness.drive(permits=worker.permits))
                change = harness.scheduler.subscribe()
                waits: list[asyncio.Future[Any]] = [
                    change,
                    asyncio.ensure_future(self.woken.wait()),
                    asyncio.ensure_future(lost.wait()),
                    asyncio.ensure_future(worker.stopping.wait()),
                ]
                if drive is not None:
                    waits.append(drive)
                try:
                    done, _ = await asyncio.wait(
                        waits, timeout=worker.idle_after, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    harness.scheduler.unsubscribe(change)
                    for extra in waits[1:4]:
                        extra.cancel()
                if change in done:
                    needed = True
                elif not done and self._quiet():  # a drive may sleep for a distant timer
                    return "idle"
        finally:
            if drive is not None and not drive.done():
                drive.cancel()
                with contextlib.suppress(BaseException):
                    await drive
            elif drive is not None and not drive.cancelled():
                drive.exception()  # retrieved: ``ended`` says why the runner stopped

    def _quiet(self) -> bool:
        """Nothing runs here and no work is due within ``idle_after``: release."""
        harness = self.harness
        scheduler = harness.scheduler
        if scheduler.executing or scheduler.observers or self.woken.is_set():
            return False
        due = harness.due_in()
        return due is None or due > self.worker.idle_after

    async def _drain(self) -> None:
        """Execute the session's waiting commands, oldest first, page by page."""
        worker, harness = self.worker, self.harness
        while True:
            items = await worker.queue.pending(self.session_id)
            replied = 0
            for item in items:
                try:
                    value = await execute(harness, item)
                except Exception as exc:
                    if not is_verdict(exc):
                        raise  # the owner's trouble: the command waits for the next owner
                    reply = reply_json(error=exc)
                else:
                    reply = reply_json(value)
                if await worker.queue.reply(item, worker.owner, reply):
                    self.executed += 1
                    replied += 1
            if not items or replied < len(items):
                return  # empty, or a reply refused (the lease is gone): stop here


class Worker:
    """Claims sessions with work and drives them (docs/workers.md).

    ``options`` are ``Harness.open``'s keyword arguments for every session (``provider``,
    ``tools``, ``hooks``, ``definitions``, ``model``, ...); ``opener`` is
    ``Harness.open`` unless a test or an embedder wraps it."""

    def __init__(
        self,
        url: str,
        queue: WorkQueue,
        *,
        opener: Opener,
        concurrency: int = 8,
        lease: Lease | None = None,
        idle_after: float = 2.0,
        poll_every: float = 2.0,
        permits: Iterable[str] = (),
        options: dict[str, Any] | None = None,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise InvalidArgumentError(
                f"concurrency must be an int of at least 1 (sessions held at once), got "
                f"{concurrency!r}"
            )
        for name, value in (("idle_after", idle_after), ("poll_every", poll_every)):
            if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
                raise InvalidArgumentError(
                    f"{name} must be a finite number of seconds above 0, got {value!r}"
                )
        if lease is not None and not isinstance(lease, Lease):
            raise InvalidArgumentError(
                f"lease must be a pico.Lease(ttl=..., renew_every=...), not {type(lease).__name__}"
            )
        forbidden = {"session", "lease", "read_only"} & set(options or {})
        if forbidden:
            raise InvalidArgumentError(
                f"a worker chooses {', '.join(sorted(forbidden))} itself; drop it from the "
                "session options"
            )
        self.url = url
        self.queue = queue
        self.opener = opener
        self.concurrency = concurrency
        self.lease = lease or Lease()
        self.owner = self.lease.owner or new_owner()
        self.idle_after = float(idle_after)
        self.poll_every = float(poll_every)
        self.permits = tuple(permits)
        self.options = dict(options or {})
        self.runners: dict[str, SessionRunner] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.stopping = asyncio.Event()
        #: Sessions this worker opened so far, and how each runner ended (newest last).
        self.picked = 0
        self.finished: list[tuple[str, str | None]] = []
        self._wakeup = asyncio.Event()

    @property
    def sessions(self) -> list[str]:
        """The sessions held right now."""
        return list(self.runners)

    def stop(self) -> None:
        """Ask the worker to stop: every held session is closed (released) and ``run``
        returns."""
        self.stopping.set()
        self._wakeup.set()

    async def run(self) -> None:
        """Pick, drive and release sessions until ``stop()``."""
        try:
            while not self.stopping.is_set():
                await self._pick()
                await self._poll_inboxes()
                timeout = self.poll_every
                if len(self.runners) < self.concurrency:
                    due = await self._next_due()
                    if due is not None:
                        timeout = min(timeout, max(due, 0.01))
                if self.stopping.is_set():
                    break
                await self._wait(timeout)
        finally:
            self.stopping.set()
            tasks = list(self._tasks.values())
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.queue.close()

    async def _pick(self) -> None:
        free = self.concurrency - len(self.runners)
        if free <= 0:
            return
        try:
            picked = await self.queue.pick(self.owner, self.lease.ttl, free)
        except PicoError as exc:
            log.warning("worker %s: picking sessions failed: %s", self.owner, exc)
            return
        for session_id in picked:
            if session_id in self.runners:
                continue  # still closing an earlier hold; its release advertises the work
            self.picked += 1
            runner = SessionRunner(self, session_id)
            self.runners[session_id] = runner
            self._tasks[session_id] = asyncio.ensure_future(self._hold(runner))

    async def _hold(self, runner: SessionRunner) -> None:
        try:
            await runner.run()
        except Exception as exc:
            runner.ended = f"failed: {exc}"
            log.exception("worker %s: session %r failed", self.owner, runner.session_id)
        finally:
            self.runners.pop(runner.session_id, None)
            self._tasks.pop(runner.session_id, None)
            self.finished.append((runner.session_id, runner.ended))
            self._wakeup.set()  # a free slot: pick again at once

    async def _poll_inboxes(self) -> None:
        if not self.runners:
            return
        try:
            waiting = await self.queue.waiting(list(self.runners))
        except PicoError as exc:
            log.warning("worker %s: reading inboxes failed: %s", self.owner, exc)
            return
        for session_id in waiting:
            runner = self.runners.get(session_id)
            if runner is not None:
                runner.wake()

    async def _next_due(self) -> float | None:
        try:
            return await self.queue.next_due()
        except PicoError:
            return None

    async def _wait(self, timeout: float) -> None:
        self._wakeup.clear()
        notified = asyncio.ensure_future(self.queue.wait(timeout))
        woken = asyncio.ensure_future(self._wakeup.wait())
        try:
            await asyncio.wait([notified, woken], return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        if not notified.done():
            notified.cancel()
            with contextlib.suppress(BaseException):
                await notified
            return
        if notified.exception() is not None:
            return
        for session_id in notified.result():
            runner = self.runners.get(session_id)
            if runner is not None:
                runner.wake()
