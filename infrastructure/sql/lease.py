"""Session leases on PostgreSQL (issue 16): the ``pico_leases`` rows behind
``application/lease.py``'s ``Heartbeat``.

Every statement runs in autocommit on one connection of the lease's own (never the
writer's: a busy or blocked write must not delay a renewal), and every expiry is the
database's ``now() + ttl``: the workers' clocks are never written or compared. A row is
acquired iff it is absent, expired, or already the caller's; renewed iff still the
caller's; deleted on close iff still the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pico.domain.errors import SessionLeasedError, StorageUnavailableError
from pico.infrastructure.sql.store import translate_error

__all__ = [
    "ACQUIRE",
    "ADVERTISE",
    "LOCK_WORK",
    "RELEASE",
    "RENEW",
    "SqlLeaseStore",
    "release_advertising",
]

ACQUIRE = """
INSERT INTO pico_leases AS l (session_id, owner, expires_at, renewed_at)
VALUES (%(session)s, %(owner)s, now() + make_interval(secs => %(ttl)s), now())
ON CONFLICT (session_id) DO UPDATE
   SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at
 WHERE l.expires_at < now() OR l.owner = EXCLUDED.owner
RETURNING expires_at
"""

HOLDER = """
SELECT owner, expires_at, greatest(extract(epoch FROM expires_at - now()), 0)::float8
  FROM pico_leases WHERE session_id = %(session)s
"""

RENEW = """
UPDATE pico_leases SET expires_at = now() + make_interval(secs => %(ttl)s), renewed_at = now()
 WHERE session_id = %(session)s AND owner = %(owner)s
RETURNING expires_at
"""

RELEASE = "DELETE FROM pico_leases WHERE session_id = %(session)s AND owner = %(owner)s"

# Releasing also advertises the session's remaining work (``pico_work``), in one
# transaction that locks the work row FIRST (creating it if absent), then the lease row:
# the order every other writer of both tables keeps (infrastructure/sql/work.py), so no
# two of them deadlock. Once the work row is locked, an inbox submit that committed
# before is visible to the statements after, and one that did not waits for this COMMIT
# and then marks the work due itself: a command can never be left without an owner.
LOCK_WORK = """
INSERT INTO pico_work AS w (session_id, due_at) VALUES (%(session)s, 'infinity')
ON CONFLICT (session_id) DO UPDATE SET due_at = w.due_at
"""

HELD = """
SELECT 1 FROM pico_leases WHERE session_id = %(session)s AND owner = %(owner)s FOR UPDATE
"""

ADVERTISE = """
UPDATE pico_work SET due_at = CASE
    WHEN EXISTS (SELECT 1 FROM pico_inbox i
                  WHERE i.session_id = %(session)s AND i.done_at IS NULL) THEN now()
    WHEN %(due)s::float8 IS NULL THEN 'infinity'::timestamptz
    ELSE now() + make_interval(secs => %(due)s::float8) END
 WHERE session_id = %(session)s
"""

UNADVERTISE = "DELETE FROM pico_work WHERE session_id = %(session)s AND due_at = 'infinity'"

#: A lease that is freed between the refused insert and the read of its holder is tried
#: again this many times.
ACQUIRE_ATTEMPTS = 3


class _NotHeld(Exception):
    """Raised inside the release transaction to roll it back (the lease is not ours)."""


async def release_advertising(conn: Any, params: dict[str, Any]) -> bool:
    """Release ``params["owner"]``'s lease of ``params["session"]`` and advertise its work
    due in ``params["due"]`` seconds (None: none unless its inbox holds a command), in
    one transaction on an autocommit connection. False (nothing changed) when the lease
    is no longer that owner's."""
    try:
        async with conn.transaction():
            await conn.execute(LOCK_WORK, params)
            held = await (await conn.execute(HELD, params)).fetchone()
            if held is None:  # taken over: the work row is the new owner's business
                raise _NotHeld
            await conn.execute(ADVERTISE, params)
            await conn.execute(UNADVERTISE, params)
            await conn.execute(RELEASE, params)
    except _NotHeld:
        return False  # rolled back
    return True


class SqlLeaseStore:
    """The lease rows of one open session, on one async autocommit connection opened at
    the first call. ``ttl`` bounds how long the connection may sit on an unacknowledged
    send (``tcp_user_timeout``) and how long connecting may take."""

    def __init__(self, conninfo: str, *, location: str) -> None:
        self.conninfo = conninfo
        self.location = location
        self._conn: Any = None

    async def _connection(self, ttl: float) -> Any:
        import psycopg  # a PostgreSQL storage only: its engine has loaded psycopg already

        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self.conninfo,
                autocommit=True,
                application_name="pico-lease",
                connect_timeout=max(1, int(ttl)),
                tcp_user_timeout=max(1000, int(ttl * 1000)),
            )
        return self._conn

    async def _run(self, statement: str, params: dict[str, Any], ttl: float, doing: str) -> Any:
        try:
            conn = await self._connection(ttl)
            cur = await conn.execute(statement, params)
            return await cur.fetchone() if cur.description is not None else None
        except asyncio.CancelledError:
            self.close()  # a cancelled statement leaves the connection in an unknown state
            raise
        except Exception as exc:
            raise self._failed(
                exc,
                doing,
                "check that the server is reachable and the schema is at head (pico db current)",
            ) from exc

    def _failed(self, exc: Exception, doing: str, advice: str) -> BaseException:
        """The PicoError for a failed statement; the connection is dropped (the next call
        reconnects)."""
        self.close()
        translated = translate_error(exc, self.location, doing, sqlite=False)
        if translated is exc:
            return StorageUnavailableError(
                f"PostgreSQL at {self.location} failed while {doing}: {exc}; {advice}"
            )
        return translated

    async def acquire(self, session_id: str, owner: str, ttl: float) -> Any:
        params = {"session": session_id, "owner": owner, "ttl": float(ttl)}
        for _ in range(ACQUIRE_ATTEMPTS):
            row = await self._run(ACQUIRE, params, ttl, "acquiring the session's lease")
            if row is not None:
                return row[0]
            held = await self._run(HOLDER, params, ttl, "reading the session's lease")
            if held is not None:
                raise SessionLeasedError(session_id, str(held[0]), held[1], float(held[2]))
        raise SessionLeasedError(session_id, "another worker (it keeps changing)", "now", 0.0)

    async def renew(self, session_id: str, owner: str, ttl: float) -> Any | None:
        params = {"session": session_id, "owner": owner, "ttl": float(ttl)}
        row = await self._run(RENEW, params, ttl, "renewing the session's lease")
        return None if row is None else row[0]

    async def release(self, session_id: str, owner: str, due: float | None = None) -> None:
        params = {"session": session_id, "owner": owner, "due": due}
        doing = "releasing the session's lease"
        try:
            await release_advertising(await self._connection(1.0), params)
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception as exc:
            raise self._failed(
                exc, doing, "the lease expires by itself and a worker then picks the session up"
            ) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Only the libpq connection is finished (no await): a synchronous close.
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
