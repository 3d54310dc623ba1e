"""The command line's lock: one command builds and saves at a time.

``asyncio.Lock``'s guarantees (one holder; waiters served first come, first served; a
waiter cancelled before it is served leaves the queue, one cancelled after it was served
passes the lock on), with a state simple enough that ``CommandLine.run`` takes and gives
back an uncontended lock with two attribute tests inline: ``asyncio.Lock``'s
``__aenter__``/``acquire``/``__aexit__``/``release``/``_wake_up_first`` were five Python
calls a command, ~50 an agent turn. A contended acquire (``wait``) queues a future, and a
release hands the lock straight to the first waiter still waiting (it stays held), so no
newcomer takes it in between.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType

__all__ = ["CommandLock"]


class CommandLock:
    """Take it with ``if lock.held: await lock.wait() else: lock.held = True`` (or
    ``async with lock``); give it back with ``lock.release()`` (inline: ``if
    lock.waiters: lock.release() else: lock.held = False``)."""

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self.held

    async def wait(self) -> None:
        """Own the lock, which is held now: queue and wait to be served."""
        served: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(served)
        try:
            await served
        except BaseException:
            if served.done() and not served.cancelled():
                self.release()  # served, then cancelled before it ran: pass the lock on
            else:
                with contextlib.suppress(ValueError):  # a release may have dropped it
                    self.waiters.remove(served)
            raise

    def release(self) -> None:
        """Give the lock to the first waiter still waiting, or free it."""
        waiters = self.waiters
        while waiters:
            served = waiters.popleft()
            if not served.done():
                served.set_result(None)  # it owns the lock now (held all along)
                return
        self.held = False

    async def __aenter__(self) -> None:
        if self.held:
            await self.wait()
        else:
            self.held = True

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
