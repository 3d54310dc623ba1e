"""PostgreSQL LISTEN/NOTIFY wakes a watcher on another handle (§9.4; issue 15).

The owner's save ends its transaction with ``pg_notify`` on the session's channel; a
read-only handle's watch hub waits on it instead of sleeping its poll interval. Every test
sets that interval to 30 s, so a delivery within a second proves the notification (or a
fresh LISTEN) woke the watcher, never the poll. Real server, real connections, no mocks:
the rolled-back save runs in a private database whose deferred constraint trigger fails
the COMMIT after the NOTIFY statement ran; the killed LISTEN connection is terminated with
``pg_terminate_backend``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

import pico
from pico.application.watch import WatchBase, WatchCommit, WatchEvent
from pico.infrastructure.sql.notify import CommitListener, channel_for
from tests.backends import require_postgres
from tests.processes import spawn_child

#: Far longer than any test waits: a delivery inside ``PROMPT`` was not the poll.
LONG_POLL = 30.0
PROMPT = 1.0


def _url() -> str:
    return require_postgres("the LISTEN/NOTIFY watch tests")


def _listener(h: pico.Harness) -> CommitListener:
    wait: Any = getattr(h._line.storage, "wait_commit")  # noqa: B009
    owner = wait.__self__
    assert isinstance(owner, CommitListener)
    return owner


async def _listening(listener: CommitListener, *, connects: int = 1) -> int:
    """Until the hub's LISTEN connection number ``connects`` is open; its server pid."""
    deadline = time.monotonic() + 10
    while listener.connects < connects or listener.pid is None:
        assert time.monotonic() < deadline, "the watcher never opened its LISTEN connection"
        await asyncio.sleep(0.01)
    return listener.pid


class Watcher:
    """A read-only handle watching one conversation, its events in a queue."""

    def __init__(self, h: pico.Harness, cid: int) -> None:
        self.h = h
        self.events: asyncio.Queue[WatchEvent] = asyncio.Queue()
        h.watches.poll_interval = LONG_POLL
        self.unsubscribe = h.watch(cid, self.events.put_nowait)

    async def next(self, within: float = PROMPT) -> WatchEvent:
        return await asyncio.wait_for(self.events.get(), within)


@contextlib.asynccontextmanager
async def _pair(url: str) -> AsyncIterator[tuple[pico.ConversationHandle, Watcher]]:
    session = f"t-{uuid.uuid4().hex[:12]}"
    owner = await pico.Harness.open(url, session=session)
    reader: pico.Harness | None = None
    try:
        conversation = await owner.root()
        reader = await pico.Harness.open(url, session=session, read_only=True)
        watcher = Watcher(reader, conversation.id)
        assert isinstance(await watcher.next(), WatchBase)
        await _listening(_listener(reader))
        yield conversation, watcher
    finally:
        if reader is not None:
            await reader.close()
        await owner.close()


def _entries(event: WatchEvent) -> list[str]:
    assert isinstance(event, WatchCommit), event
    return [
        _text(c.payload["content"])
        for c in event.changes
        if c.event == "Conversation.EntryAppended"
    ]


def _text(content: Any) -> Any:
    # The audit payload shows content decoded; older payloads carried its stored JSON text.
    if isinstance(content, str):
        with contextlib.suppress(ValueError):
            return json.loads(content)
    return content


def _raw_listen(url: str, channel: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'LISTEN "{channel}"')
    return conn


def _received(conn: psycopg.Connection[Any], channel: str, *, until: int) -> list[int]:
    """The positions notified on ``channel`` until one reaches ``until`` (bounded)."""
    out: list[int] = []
    for notify in conn.notifies(timeout=5):
        if notify.channel == channel:
            out.append(int(notify.payload))
            if out[-1] >= until:
                break
    return out


# ---------------------------------------------------------------------------------------
async def test_a_commit_wakes_a_read_only_watcher_at_once_not_at_its_poll() -> None:
    async with _pair(_url()) as (conversation, watcher):
        for text in ("first", "second", "third"):
            started = time.monotonic()
            await conversation.append("user", text)
            # Check: delivered well inside the 30 s poll interval, whole and in order.
            assert _entries(await watcher.next()) == [text]
            assert time.monotonic() - started < PROMPT
        # Check: one LISTEN connection served every wakeup.
        assert _listener(watcher.h).connects == 1


async def test_the_notification_names_the_batch_last_position_and_is_sent_once() -> None:
    url = _url()
    async with _pair(url) as (conversation, watcher):
        storage: Any = watcher.h._line.storage
        channel = channel_for(storage.session_id)
        raw = _raw_listen(url, channel)
        try:
            await conversation.append("user", "one")
            await conversation.append("user", "two")
            last = storage.last_position()
            # Check: one notification per durable transaction, each its newest position.
            got = _received(raw, channel, until=last)
            assert len(got) == 2 and got[-1] == last and got[0] < last
        finally:
            raw.close()
        assert _entries(await watcher.next()) == ["one"]
        assert _entries(await watcher.next()) == ["two"]


async def test_another_sessions_commit_notifies_nothing_on_this_channel() -> None:
    url = _url()
    async with _pair(url) as (conversation, watcher):
        storage: Any = watcher.h._line.storage
        channel = channel_for(storage.session_id)
        raw = _raw_listen(url, channel)
        other = await pico.Harness.open(url, session=f"t-{uuid.uuid4().hex[:12]}")
        try:
            other_root = await other.root()
            for i in range(3):
                await other_root.append("user", f"elsewhere {i}")
            await conversation.append("user", "here")
            # Check: the other session's commits come before ours on the server, so had
            # they notified this channel, they would arrive first; only ours arrives.
            assert _received(raw, channel, until=storage.last_position()) == [
                storage.last_position()
            ]
        finally:
            raw.close()
            await other.close()
        assert _entries(await watcher.next()) == ["here"]
        assert watcher.events.empty()
        # Check: the watcher's own listener never saw a position of the other session.
        assert _listener(watcher.h).latest == storage.last_position()


@contextlib.contextmanager
def _private_database(url: str) -> Iterator[str]:
    """A throwaway database on the dev server: the failing trigger touches no one else's."""
    name = f"pico_notify_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(url, autocommit=True)
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield url.rsplit("/", 1)[0] + "/" + name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.close()


_DOOM = """
CREATE FUNCTION pico_test_doom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'doomed at commit' USING ERRCODE = '40001';
END $$;
CREATE CONSTRAINT TRIGGER pico_test_doom AFTER INSERT ON pico_entries
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (NEW.content LIKE '%doomed%') EXECUTE FUNCTION pico_test_doom();
"""


async def test_a_save_that_fails_at_commit_sends_no_notification() -> None:
    with _private_database(_url()) as url:
        session = f"t-{uuid.uuid4().hex[:12]}"
        owner = await pico.Harness.open(url, session=session)
        try:
            conversation = await owner.root()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(_DOOM)
            reader = await pico.Harness.open(url, session=session, read_only=True)
            watcher = Watcher(reader, conversation.id)
            assert isinstance(await watcher.next(), WatchBase)
            await _listening(_listener(reader))
            channel = channel_for(session)
            raw = _raw_listen(url, channel)
            try:
                before = owner._line.storage.last_position()
                # The NOTIFY statement runs, then the deferred trigger fails the COMMIT.
                with pytest.raises(pico.PicoError):
                    await conversation.append("user", "doomed")
                await owner.close()
                owner = await pico.Harness.open(url, session=session)  # a new owner
                conversation = await owner.root()
                await conversation.append("user", "kept")
                last = owner._line.storage.last_position()
                # Check: nothing was notified for the rolled-back batch (it would come
                # first); the claim and the kept commit were.
                got = _received(raw, channel, until=last)
                assert got[-1] == last and all(p > before for p in got)
                assert len(got) == 2  # the new owner's claim, then "kept"
            finally:
                raw.close()
            # Check: the watcher delivers the kept entry only, never the doomed one.
            assert _entries(await watcher.next()) == ["kept"]
            assert watcher.events.empty()
            await reader.close()
        finally:
            await owner.close()


async def test_a_killed_listen_connection_falls_back_to_polling_then_reconnects() -> None:
    url = _url()
    async with _pair(url) as (conversation, watcher):
        listener = _listener(watcher.h)
        first = await _listening(listener)
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        # Check: the hub reconnects by itself (a new server process) ...
        second = await _listening(listener, connects=2)
        assert second != first
        # ... and a commit after it is delivered at once, woken by the new LISTEN.
        await conversation.append("user", "after the kill")
        assert _entries(await watcher.next()) == ["after the kill"]

        # Now the server refuses the listener (nothing listens on port 1): the watcher
        # falls back to its poll, and never raises.
        good = listener.conninfo
        listener.conninfo = "host=127.0.0.1 port=1 dbname=none connect_timeout=1"
        watcher.h.watches.poll_interval = 0.2
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (second,))
        await conversation.append("user", "while polling")
        assert _entries(await watcher.next(within=5)) == ["while polling"]
        assert listener.connects == 2 and listener.pid is None
        # Check: once the server takes it again, the next wait reconnects.
        listener.conninfo = good
        await _listening(listener, connects=3)
        watcher.h.watches.poll_interval = LONG_POLL
        await _listening(listener, connects=3)
        await conversation.append("user", "listening again")
        assert _entries(await watcher.next(within=5)) == ["listening again"]


async def test_an_unreachable_server_makes_a_wait_sleep_its_timeout_and_never_raise() -> None:
    listener = CommitListener("host=127.0.0.1 port=1 dbname=none connect_timeout=1", "pico_x")
    started = time.monotonic()
    await listener.wait(after=0, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 3 and listener.pid is None
    listener.close()


def test_sqlite_storage_has_no_wait_commit(tmp_path: Any) -> None:
    async def main() -> None:
        url = f"sqlite:///{tmp_path / 'w.db'}"
        owner = await pico.Harness.open(url, session="s")
        reader = await pico.Harness.open(url, session="s", read_only=True)
        try:
            # Check: the hub polls SQLite (no notifications to wait on).
            assert getattr(reader._line.storage, "wait_commit", None) is None
        finally:
            await reader.close()
            await owner.close()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    import pico

    async def main(url, session, cid):
        h = await pico.Harness.open(url, session=session, read_only=True)
        h.watches.poll_interval = 30
        listener = h._line.storage.wait_commit.__self__

        def show(event):
            entries = [c.payload["content"] for c in getattr(event, "changes", ())
                       if c.event == "Conversation.EntryAppended"]
            entries = [json.loads(e) if e.startswith('"') else e for e in entries]
            print(json.dumps({"type": type(event).__name__, "entries": entries}), flush=True)

        h.watch(int(cid), show)
        while listener.pid is None:
            await asyncio.sleep(0.01)
        print(json.dumps({"type": "listening"}), flush=True)
        await asyncio.Event().wait()  # until the parent kills us

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def test_a_watcher_in_another_process_is_woken_by_the_owners_commit() -> None:
    url = _url()
    session = f"t-{uuid.uuid4().hex[:12]}"
    owner = await pico.Harness.open(url, session=session)
    child = None
    try:
        conversation = await owner.root()
        child = spawn_child(CHILD, url, session, str(conversation.id))
        assert child.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        stdout = child.stdout

        def pump() -> None:
            for text in stdout:
                lines.put(text)

        threading.Thread(target=pump, daemon=True).start()

        async def line(within: float) -> dict[str, Any]:
            text = await asyncio.to_thread(lines.get, timeout=within)
            value: dict[str, Any] = json.loads(text)
            return value

        assert (await line(30))["type"] == "WatchBase"
        assert (await line(30))["type"] == "listening"
        for text in ("across", "processes"):
            started = time.monotonic()
            await conversation.append("user", text)
            got = await line(PROMPT)
            # Check: the other process got the whole commit well inside its 30 s poll.
            assert got == {"type": "WatchCommit", "entries": [text]}
            assert time.monotonic() - started < PROMPT
    finally:
        if child is not None:
            child.kill()
            child.wait()
        await owner.close()
