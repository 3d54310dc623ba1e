"""PostgreSQL LISTEN/NOTIFY: commit wakeups for a watcher on another handle (§9.4).

The owner's save sends ``pg_notify(channel, last position)`` as the last statement of the
transaction that writes the events (``NOTIFY_STATEMENT``), so PostgreSQL delivers it at
COMMIT and drops it with a rollback: a watcher is woken only for committed data. A
read-only handle's ``CommitListener`` LISTENs on the session's channel on a connection of
its own and wakes the watch hub's poll loop (``WatchHub._poll``), which stays the fallback:
a notification problem never raises, it only costs the poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Any

import sqlalchemy as sa

__all__ = [
    "NOTIFY_STATEMENT",
    "SERIAL_SEQUENCE",
    "CommitListener",
    "channel_for",
    "conninfo",
    "notify_statement",
]

log = logging.getLogger("pico.storage")

#: Sent inside the write transaction, after the batch's events are inserted: the payload is
#: the batch's newest event position (``currval`` of the id sequence this transaction just
#: advanced, so no index is read). ``notify_statement`` names the sequence once resolved.
NOTIFY_STATEMENT = (
    "SELECT pg_notify(%s, currval(pg_get_serial_sequence('pico_events', 'id'))::text)"
)
#: The name of the events' id sequence (``pg_get_serial_sequence``, resolved once per
#: database: on every commit its catalog lookups were 2% of the server's CPU per command).
#: No row (None) where there is no such table.
SERIAL_SEQUENCE = (
    "SELECT pg_get_serial_sequence(c.oid::regclass::text, 'id') FROM pg_class c "
    "WHERE c.oid = to_regclass('pico_events')"
)


def notify_statement(sequence: str | None) -> str:
    """``NOTIFY_STATEMENT`` with the events' id sequence named (``SERIAL_SEQUENCE``; None:
    not resolved, looked up by each commit)."""
    if sequence is None:
        return NOTIFY_STATEMENT
    literal = "'" + sequence.replace("'", "''") + "'"
    return f"SELECT pg_notify(%s, currval({literal}::regclass)::text)"


def channel_for(session_id: str) -> str:
    """The session's channel: a short hash, since channel names are identifiers of at most
    63 bytes and a session id may be longer or hold any character."""
    return "pico_" + hashlib.sha256(session_id.encode()).hexdigest()[:24]


def conninfo(url: sa.URL) -> str:
    """A libpq connection string for an SQLAlchemy URL (``postgresql+psycopg://...``)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class CommitListener:
    """One session's commit notifications on a dedicated autocommit connection, opened at
    the first ``wait`` and closed with the storage.

    ``wait(after=, timeout=)`` returns when a notification names a position above
    ``after``, at the timeout, or at once after (re)connecting: a commit may have landed
    before LISTEN took effect, so the caller re-reads the newest position (a spurious
    wakeup). A connection that breaks is dropped and the call returns (the next call
    reconnects); a connection that cannot be opened makes the call sleep its timeout (the
    caller's poll). Nothing here raises for a notification problem.
    """

    def __init__(self, conninfo: str, channel: str, *, location: str = "") -> None:
        self.conninfo = conninfo
        self.channel = channel
        self.location = location or "PostgreSQL"
        #: The newest position any notification named (it may be ahead of a caller).
        self.latest = 0
        #: Connections opened so far (a reconnect after a broken one counts too).
        self.connects = 0
        self._conn: Any = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The LISTEN connection's server process id, while one is open."""
        conn = self._conn
        return None if conn is None or conn.closed else int(conn.info.backend_pid)

    async def wait(self, *, after: int, timeout: float) -> None:
        timeout = max(0.0, float(timeout))
        if self._closed:
            await asyncio.sleep(timeout)
            return
        if self.latest > after:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = self._conn
        if conn is None or conn.closed:
            self._conn = None
            if not await self._connect(timeout):
                await asyncio.sleep(max(0.0, deadline - loop.time()))
            return  # fresh LISTEN: the caller re-reads the newest position first
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                # aclosing: leaving early must release the connection's lock at once.
                async with contextlib.aclosing(conn.notifies(timeout=remaining)) as received:
                    async for notify in received:
                        if notify.channel != self.channel:
                            continue
                        try:
                            position = int(notify.payload)
                        except ValueError:
                            return  # not ours to parse: a wakeup all the same
                        self.latest = max(self.latest, position)
                        if position > after:
                            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection broke (terminated, server restart)
            log.info("%s: LISTEN %s stopped (%s); reconnecting", self.location, self.channel, exc)
            self._drop()

    async def _connect(self, timeout: float) -> bool:
        import psycopg  # a PostgreSQL storage only: psycopg is loaded by its engine already

        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is not None and not self._conn.closed:
                return True
            conn: Any = None
            try:
                conn = await asyncio.wait_for(
                    psycopg.AsyncConnection.connect(
                        self.conninfo,
                        autocommit=True,
                        application_name=f"pico-listen-{self.channel}",
                    ),
                    timeout=max(timeout, 0.1),
                )
                await conn.execute(f'LISTEN "{self.channel}"')
            except asyncio.CancelledError:
                if conn is not None:
                    _finish(conn)
                raise
            except Exception as exc:
                if conn is not None:
                    _finish(conn)
                log.info("%s: cannot LISTEN for commits (%s); polling instead", self.location, exc)
                return False
            if self._closed:
                _finish(conn)
                return False
            self._conn = conn
            self.connects += 1
            return True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _finish(conn)

    def close(self) -> None:
        """Synchronous, as the storage's close is: the connection is finished at once."""
        self._closed = True
        self._drop()


def _finish(conn: Any) -> None:
    # AsyncConnection.close() only finishes the libpq connection (it never awaits outside a
    # pool): do exactly that, so a synchronous close needs no event loop.
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
