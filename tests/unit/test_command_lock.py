"""The command line's lock keeps asyncio.Lock's guarantees: one holder, first come first
served, and a cancelled waiter never keeps or loses the lock for the others."""

from __future__ import annotations

import asyncio

from pico.application.command_lock import CommandLock


async def _take(lock: CommandLock) -> None:
    """As ``CommandLine.run`` takes it."""
    if lock.held:
        await lock.wait()
    else:
        lock.held = True


def test_an_uncontended_lock_is_taken_and_given_back_without_waiting() -> None:
    async def main() -> None:
        lock = CommandLock()
        await _take(lock)
        assert lock.locked() and not lock.waiters
        lock.release()
        assert not lock.locked()
        async with lock:
            assert lock.locked()
        assert not lock.locked()

    asyncio.run(main())


def test_waiters_are_served_in_arrival_order_and_no_newcomer_cuts_in() -> None:
    async def main() -> None:
        lock = CommandLock()
        order: list[str] = []

        async def holder(name: str) -> None:
            await _take(lock)
            order.append(name)
            await asyncio.sleep(0)
            lock.release()

        await _take(lock)  # held: everyone below queues
        tasks = [asyncio.create_task(holder(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0)  # all three wait
        assert len(lock.waiters) == 3
        lock.release()  # handed to "a": still held
        assert lock.locked()
        late = asyncio.create_task(holder("late"))  # arrives after the hand-over
        await asyncio.gather(*tasks, late)
        assert order == ["a", "b", "c", "late"]
        assert not lock.locked() and not lock.waiters

    asyncio.run(main())


async def _two_waiters(
    lock: CommandLock, got: list[str]
) -> tuple[asyncio.Task[None], asyncio.Task[None]]:
    """Take the lock, then queue "first" and "second", each noting itself in ``got`` when
    it holds the lock."""

    async def waiter(name: str) -> None:
        await _take(lock)
        got.append(name)
        lock.release()

    await _take(lock)
    first = asyncio.create_task(waiter("first"))
    second = asyncio.create_task(waiter("second"))
    await asyncio.sleep(0)  # both queue
    assert len(lock.waiters) == 2
    return first, second


def test_a_waiter_cancelled_before_it_is_served_leaves_the_queue() -> None:
    async def main() -> None:
        lock = CommandLock()
        got: list[str] = []
        first, second = await _two_waiters(lock, got)
        first.cancel()
        await asyncio.sleep(0)  # the cancellation runs: "first" leaves the queue
        assert len(lock.waiters) == 1
        lock.release()
        await asyncio.wait_for(second, 5)
        assert got == ["second"]
        assert first.cancelled()
        assert not lock.locked() and not lock.waiters

    asyncio.run(main())


def test_a_waiter_cancelled_after_it_was_served_passes_the_lock_on() -> None:
    async def main() -> None:
        lock = CommandLock()
        got: list[str] = []
        first, second = await _two_waiters(lock, got)
        lock.release()  # "first" is served ...
        first.cancel()  # ... and cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 5)  # a kept lock would leave it waiting
        assert first.cancelled()
        assert got == ["second"]
        assert not lock.locked() and not lock.waiters

    asyncio.run(main())
