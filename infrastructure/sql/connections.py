"""PostgreSQL: the connections a process's sessions share between their transactions.

A session's writer used to hold one pooled connection for as long as the session was
open, and its reader another. A worker process holding eight sessions then drove eight
writer backends in turn (its commands block its event loop, so one at a time), and each
command cost the server ~30% more CPU than the same command on one session's backend:
eight backends' private caches taking turns on two cores, where one stays warm
(docs/benchmarks.md, "Sessions sharing connections"). Now a writer takes a connection
for a transaction (or its deferred batch, or a claim's lock) and gives it back when the
transaction has ended, and a read takes one for its snapshot; what is given back is lent
again most recently used first (psycopg's pool lends the oldest idle one first), so
sessions that take turns on one thread keep using one warm backend, and a process needs
about as many connections as it has transactions in flight instead of two per session.

Only connections outside any transaction come back: a deferred batch, a claim's held lock
or an open snapshot keep theirs. Statements prepared on a connection are shared by every
session that uses it (``_PREPARED`` in ``store.py`` is keyed by connection).
"""

from __future__ import annotations

import select
import threading
from typing import Any

__all__ = ["IdleConnections", "Lent"]

# libpq's PQtransactionStatus of a connection between transactions.
_PG_IDLE = 0


def _reusable(conn: Any) -> bool:
    """Open and outside any transaction: fit to be lent again."""
    return not conn.closed and conn.info.transaction_status == _PG_IDLE


class Lent:
    """A connection lent by ``IdleConnections.take``, with the two ways SQLAlchemy's pool
    connection ends too: ``close`` gives it back to psycopg's pool (its holder is done
    with it, e.g. its session is closing; one inside a transaction is dropped instead),
    ``invalidate`` drops it (the server rolls back what it held)."""

    __slots__ = ("_idle", "driver_connection")

    def __init__(self, idle: IdleConnections, conn: Any) -> None:
        self._idle = idle
        self.driver_connection = conn

    def close(self) -> None:
        if _reusable(self.driver_connection):
            self._idle.release(self.driver_connection)
        else:
            self.invalidate()  # an open transaction is dropped, not rolled back over the wire

    def invalidate(self) -> None:
        conn = self.driver_connection
        # Closed for real, without a round trip (``close`` would hand it back to the pool,
        # which rolls an open transaction back first: a partitioned network could hang
        # there); the pool then discards it and opens a replacement in the background.
        conn.pgconn.finish()
        self._idle.release(conn)


def _alive(conn: Any) -> bool:
    """Whether an idle connection's server still holds it, without a round trip: an idle
    connection is sent nothing, so one whose socket has something to read was ended by
    its server (a backend that ends sends its FATAL and closes the socket; the rare
    parameter notice makes a healthy one look the same, and it is replaced)."""
    if not _reusable(conn):
        return False
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except Exception:  # no socket: the link is gone
        return False
    return not readable


class IdleConnections:
    """The process's idle PostgreSQL connections of one ``SqlDatabase``, over its psycopg
    pool: ``take`` lends the one given back last (or one from the pool), in autocommit
    (pico opens its transactions itself); ``give`` takes one back when it is outside any
    transaction. At most ``keep`` wait here; more go back to the pool. SQLAlchemy's
    engines (event loads, schema work) get theirs through ``creator``, which also lends
    an idle one first, so connections waiting here never starve them."""

    def __init__(self, pool: Any, *, keep: int = 4) -> None:
        self._pool = pool
        self._keep = keep
        self._stack: list[Any] = []
        self._lock = threading.Lock()

    def _pop(self) -> Any | None:
        """The connection given back last whose server has not closed it; one that it
        closed (a restart, ``pg_terminate_backend``, ``idle_session_timeout``) goes back
        to the pool, which replaces it, instead of failing the next command's BEGIN."""
        while True:
            with self._lock:
                if not self._stack:
                    return None
                conn = self._stack.pop()
            if _alive(conn):
                return conn
            Lent(self, conn).invalidate()  # the pool drops it and opens a replacement

    def take(self) -> Lent:
        """A connection for the caller alone until it gives it back; psycopg's pool
        raises its ``PoolTimeout`` when every connection is in use past its timeout."""
        conn = self._pop()
        if conn is None:
            conn = self._pool.getconn()
            conn.autocommit = True
        return Lent(self, conn)

    def give(self, lent: Lent) -> None:
        """Take ``lent`` back; one that is closed, broken or inside a transaction is not
        lent again (it is dropped: the server rolls back what it held)."""
        conn = lent.driver_connection
        if not _reusable(conn):
            lent.invalidate()
            return
        with self._lock:
            if len(self._stack) < self._keep:
                self._stack.append(conn)
                return
        self.release(conn)

    def creator(self) -> Any:
        """SQLAlchemy's connection factory: an idle connection first, else the pool's,
        not in autocommit (SQLAlchemy's transactions are implicit)."""
        conn = self._pop()
        if conn is None:
            return self._pool.getconn()
        conn.autocommit = False
        return conn

    def release(self, conn: Any) -> None:
        """Back to psycopg's pool, as SQLAlchemy's engines lend them (not in autocommit)."""
        if _reusable(conn):
            conn.autocommit = False
        self._pool.putconn(conn)

    def close(self) -> None:
        """Return every idle connection to the pool (the database is closing)."""
        with self._lock:
            stack, self._stack = self._stack, []
        for conn in stack:
            self.release(conn)
