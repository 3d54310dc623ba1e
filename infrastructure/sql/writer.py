"""The session writer's connection and transactions (SQLite and PostgreSQL).

``RawWriter`` holds one session writer's DBAPI connection and runs its fixed-shape
statements: one transaction per command, or a deferred batch that later commands join
(group commit). On PostgreSQL a command's statements travel as one string, prepared once per
connection (``_ClientBatch``, ``_executed``, ``_literal``).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import IntegrityError

if TYPE_CHECKING:
    from pico.infrastructure.sql.store import SqlDatabase


log = logging.getLogger("pico.storage")


# The session's write lock on PostgreSQL: a transaction-level advisory lock on the
# session's key (the two-int key space, apart from the schema lock's single key), taken
# FIRST by every write transaction of a claimed writer and by a claim (RawWriter.exclusive),
# so they queue in one order and never deadlock; no other session ever waits for it.
SESSION_LOCK = "SELECT pg_advisory_xact_lock(7305730, hashtext(%s))"


class RawWriter:
    """One DBAPI connection for a session's writes, with explicit transactions."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self._fairy: Any = None
        # The fairy's DBAPI connection, read once a checkout: ``driver_connection`` is
        # three Python calls through SQLAlchemy's pool, and a turn asks ~50 times.
        self._conn: Any = None
        self.sqlite = db.dialect == "sqlite"
        self._integrity: type[Exception] = db.writer.dialect.loaded_dbapi.IntegrityError
        self.thread: int | None = None
        # A deferred batch: BEGIN IMMEDIATE issued, commands written, COMMIT not yet.
        self.pending = False
        # Why a deferred batch was lost (its COMMIT failed): every later write refuses, so
        # the owning session faults at its next command instead of building on it.
        self.lost: BaseException | None = None
        # Inside ``exclusive``: the write lock is held and the next transaction joins it.
        self.held = False
        # PostgreSQL: the session whose advisory lock every write transaction takes first
        # (set by the claim, ``exclusive``); None before any claim.
        self.lock_key: str | None = None
        # How a write transaction ends: on PostgreSQL with durability "process" without
        # waiting for its WAL flush (``_ASYNC_COMMIT``, set just before the COMMIT, so a
        # transaction begun by a claim or a deferred batch ends the same way).
        self._commit = (
            f"{_ASYNC_COMMIT};COMMIT" if not self.sqlite and db.durability != "fsync" else "COMMIT"
        )
        self._token_conn: Any = None  # change_token: the connection its counter is from
        self._token_epoch = 0
        self._batch_version: int | None = None  # change_token's counter read in this batch
        self._batch_rolled_back = False  # SQLite rolled the open batch back (_check_batch)

    def sql(self, statement: str) -> str:
        """Our statements use qmark placeholders; psycopg wants %s."""
        return statement if self.sqlite else _psycopg_style(statement)

    def connection(self) -> Any:
        """The held DBAPI connection, taken on first use on the calling thread: SQLite's
        is the writer's own for its lifetime; PostgreSQL's is lent by the process's idle
        connections (in autocommit: transactions are ours to open, ``_BEGIN``) and given
        back when the transaction, batch or claim holding it ends (``_release``)."""
        conn = self._conn
        if conn is not None:
            return conn
        with self.db.translating("connecting to write"):
            if self.db.idle is not None:
                self._fairy = self.db.idle.take()
            else:
                self._fairy = self.db.writer.raw_connection()
        self.thread = threading.get_ident()
        conn = self._conn = self._fairy.driver_connection
        return conn

    def change_token(self) -> tuple[bool, int, int] | None:
        """SQLite: a value that moves whenever the session's rows may have changed other
        than by this writer's own commits: another connection committed to the file
        (``PRAGMA data_version``, per connection), the writer's connection was replaced,
        or a deferred batch was lost (its rows rolled back: by ``abandon`` or a failed
        flush, or by SQLite itself after an I/O or out-of-memory error in a read inside
        it, which leaves the batch pending with no transaction open). What the owner's
        mirrors check before they are read (projections/queries.py ``TaskQueries.own``).
        None on any thread but the writer's: the mirrors hold what its saves wrote, an
        open batch's rows included, and another thread reads only what is committed (the
        store's reader connections), so it reads the store."""
        if self.thread is not None and self.thread != threading.get_ident():
            return None
        try:
            conn = self.connection()
            if conn is not self._token_conn:
                self._token_conn = conn
                self._token_epoch += 1
            self._check_batch(conn)
            if self.pending and conn.in_transaction and not self._batch_rolled_back:
                # Inside the open batch (BEGIN IMMEDIATE: this connection holds the file's
                # write lock) no other connection can commit, so the counter cannot move:
                # read once a batch (a turn's checks are mostly made inside one: 14 of 17).
                version = self._batch_version
                if version is None:
                    version = self._batch_version = _data_version(conn)
            else:
                version = _data_version(conn)
        except Exception as exc:  # a driver error, as a read would report it
            translated = self.db.translate(exc, "checking for other writers' commits")
            if translated is exc:
                raise
            raise translated from exc
        intact = self.lost is None and not (self.pending and self._batch_rolled_back)
        return intact, self._token_epoch, version

    def _check_batch(self, conn: Any) -> None:
        """SQLite rolls an open batch back by itself on an I/O, disk-full or out-of-memory
        error in a statement inside it, leaving it pending with no transaction open:
        remembered until the batch ends, because a read snapshot on this connection may
        open a transaction again (``idle_connection``), which is not the batch's."""
        if self.pending and not conn.in_transaction:
            self._batch_rolled_back = True

    def _release(self) -> None:
        """PostgreSQL: give the connection back between transactions, for this process's
        other sessions (``IdleConnections``); a deferred batch or a claim's lock keeps it."""
        if self.pending or self.held or self._fairy is None or self.db.idle is None:
            return
        fairy, self._fairy, self._conn = self._fairy, None, None
        self.db.idle.give(fairy)

    def busy(self) -> bool:
        """Whether a transaction is open on this writer's connection, which a write now
        would join and end instead of running its own: a deferred batch, a claim's lock,
        or (SQLite) a read snapshot on its thread that began one (``idle_connection``)."""
        if self.pending or self.held:
            return True
        conn = self._conn
        return self.sqlite and conn is not None and bool(conn.in_transaction)

    def idle_connection(self) -> Any | None:
        """The writer's connection for a read on its own thread between transactions (or
        inside its own deferred batch, whose writes the session's reads must see), or
        None. SQLite empties a connection's page cache whenever another connection has
        written, so the reader connections start every snapshot cold after each commit;
        the writer's own cache stays warm across its commits."""
        conn = self._conn
        if conn is None or self.thread != threading.get_ident():
            return None
        if not self.sqlite:
            # PostgreSQL: only inside the batch. Between transactions the reader's
            # connections serve (a REPEATABLE READ snapshot each) and the writer's stays idle.
            return conn if self.pending else None
        self._check_batch(conn)
        return conn if self.pending or not conn.in_transaction else None

    def batch_aborted(self, exc: BaseException) -> None:
        """A read inside the open PostgreSQL batch failed on the server, which aborts the
        whole transaction: the batch is lost (a COMMIT would only roll it back), so every
        later write refuses and the session faults at its next command or flush."""
        self.lost = exc
        self._end_batch()
        if self._conn is not None:
            self._rollback(self._conn, None)
            self._release()

    @contextmanager
    def exclusive(self, session_id: str) -> Iterator[None]:
        """Take the session's write lock before reading: SQLite ``BEGIN IMMEDIATE`` (the
        file's); PostgreSQL the session's advisory lock (``SESSION_LOCK``), which every
        write transaction of a claimed writer takes first: the claim waits for the
        session's transaction in flight and holds off the next one, whose version check
        then refuses it. It never touches another session: a claim on PostgreSQL makes no
        other session's commands wait (issue 16). The next ``transaction`` runs inside the
        lock and its COMMIT releases it; leaving the block without one rolls back. Only
        an opening claim uses it."""
        if self.lost is not None:
            raise RuntimeError(f"a deferred batch of this session was lost: {self.lost!r}")
        self.flush()
        conn = self.connection()
        cur = conn.cursor()
        try:
            if self.db.pending:  # this process's open batches: the claim may wait for one
                self.db.flush_pending(but=self)
            if self.sqlite:
                cur.execute("BEGIN IMMEDIATE")
            else:
                self.lock_key = session_id  # every later write transaction takes it too
                cur.execute(_BEGIN)
                cur.execute(SESSION_LOCK, (session_id,))
            self.held = True
            yield
        except BaseException as exc:
            translated = self.db.translate(exc, "taking the write lock")
            if translated is not exc:
                raise translated from exc
            raise
        finally:
            if self.held:  # no transaction consumed the lock
                self.held = False
                self._rollback(conn, cur)
            cur.close()
            self._release()

    def transaction(self, work: Callable[[Any], None], *, defer: bool = False) -> None:
        """Run ``work`` in the write transaction and commit it; with ``defer`` leave it
        open so the next transaction joins it (group commit: one COMMIT for several
        commands; ``flush`` ends it). A failure rolls back the whole open batch, deferred
        commands included: the caller must treat them as uncertain."""
        if self.lost is not None:
            raise RuntimeError(f"a deferred batch of this session was lost: {self.lost!r}")
        conn = self.connection()
        # PostgreSQL's statements go through ``_ClientBatch``; SQLite's through a cursor.
        cur: Any = conn.cursor() if self.sqlite else None
        held, self.held = self.held, False
        try:
            if not self.sqlite:
                # One round trip for the whole transaction: BEGIN, the command's statements
                # and COMMIT, bound on the client, go out as ONE simple-query string
                # (``_ClientBatch``); a read in ``work`` (a fetch) sends what is queued
                # with it. The first failing statement is raised, and the server skips the
                # rest, COMMIT included. A deferred command's string ends without COMMIT
                # (its errors are its own); the next transaction joins the batch, and a
                # durable one ends it with its COMMIT in the same string.
                if self.pending and conn.info.transaction_status != _PG_INTRANS:
                    raise RuntimeError(f"the open batch on {self.db.location} was aborted")
                if not held and not self.pending and self.lock_key is not None:
                    # Another handle of this session in this process (a stale owner's)
                    # may hold its lock in an open batch only this thread can commit.
                    self.db.flush_pending(but=self, session=self.lock_key)
                batch = _ClientBatch(conn)
                try:
                    if not held and not self.pending:
                        batch.execute(_BEGIN)
                        if self.lock_key is not None:
                            batch.execute(SESSION_LOCK, (self.lock_key,))
                    work(batch)
                    # A deferred batch stays open: the server arms its idle limit at the
                    # string's ReadyForQuery (``_BATCH_IDLE_LIMIT``).
                    if defer:
                        batch.execute(_BATCH_IDLE_LIMIT)
                    else:
                        batch.execute(self._commit)
                    batch.send()
                finally:
                    batch.close()
                if defer:
                    self.pending = True
                    self.db.pending.add(self)
                else:
                    self._end_batch()
                    self._release()
                return
            self._check_batch(conn)
            if self.pending and self._batch_rolled_back:
                # SQLite rolled the open batch back by itself (an I/O, disk-full or
                # out-of-memory error in a statement inside it): its commands are lost,
                # and this one would run outside any batch, on what they numbered (also
                # when a read snapshot on this connection has begun a transaction since).
                raise RuntimeError(f"the open batch on {self.db.location} was rolled back")
            if not self.pending and not held:
                if self.db.pending:
                    self.db.flush_pending(but=self)
                cur.execute("BEGIN IMMEDIATE")
            work(cur)
            if defer:
                self.pending = True
                self.db.pending.add(self)
            else:
                self._end_batch()
                cur.execute("COMMIT")
                if self.db.guard is not None:
                    self.db.release_guard()  # a write open verified the file and claimed
        except BaseException as exc:
            self._end_batch()
            self._rollback(conn, cur)
            self._release()
            if isinstance(exc, self._integrity):
                raise IntegrityError(str(exc)) from exc
            translated = self.db.translate(exc, "writing")
            if translated is not exc:
                raise translated from exc
            raise
        finally:
            if cur is not None:
                cur.close()

    def abandon(self, reason: str) -> None:
        """The owner faulted (its lease lost, say): an open deferred batch must never
        commit and must not keep holding the session's locks. It is rolled back now — on
        PostgreSQL by dropping the connection (the server rolls back when it sees it go;
        no round trip that a partitioned network could hang), on SQLite with ROLLBACK,
        which also frees the file's write lock — and every later write refuses."""
        if not self.pending:
            return
        self._end_batch()
        self.lost = RuntimeError(f"the handle faulted with the batch open: {reason}")
        if self.sqlite and self._fairy is not None and self.thread == threading.get_ident():
            try:
                self._conn.execute("ROLLBACK")
                return
            except Exception:
                pass  # the connection is gone: dropping it rolls back too
        self.close()

    def flush(self) -> None:
        """Commit the deferred batch, if any (a failure rolls it back and raises)."""
        if self.lost is not None:
            raise RuntimeError(f"a deferred batch of this session was lost: {self.lost!r}")
        if not self.pending:
            return
        self._end_batch()
        conn = self.connection()
        cur = conn.cursor()
        try:
            if not self.sqlite and conn.info.transaction_status != _PG_INTRANS:
                # An aborted transaction's COMMIT answers ROLLBACK without an error.
                raise RuntimeError(f"the open batch on {self.db.location} was aborted")
            cur.execute(self._commit)
        except BaseException as exc:
            self.lost = exc
            self._rollback(conn, cur)
            translated = self.db.translate(exc, "committing deferred commands")
            if translated is not exc:
                raise translated from exc
            raise
        finally:
            cur.close()
            self._release()

    def _end_batch(self) -> None:
        self.pending = False
        self._batch_version = None
        self._batch_rolled_back = False
        self.db.pending.discard(self)

    def _rollback(self, conn: Any, cur: Any) -> None:
        try:
            if self.sqlite:
                if conn.in_transaction:
                    cur.execute("ROLLBACK")
            else:
                conn.rollback()
                _forget_prepared(conn)
        except Exception:  # the connection is gone: drop it, the caller faults
            self.close()

    def close(self) -> None:
        self._end_batch()  # an unflushed batch is rolled back with its connection
        if self._fairy is not None:
            fairy, self._fairy, self._conn = self._fairy, None, None
            try:
                fairy.close()
            except Exception:
                fairy.invalidate()


def _data_version(conn: Any) -> int:
    """SQLite's ``PRAGMA data_version`` on ``conn``: it moves when another connection
    commits to the file."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


class _ClientBatch:
    """A PostgreSQL write transaction's statements, bound on the client and sent as one
    simple-query string: a cursor for ``work`` with the calls it makes (execute,
    executemany, fetchone, fetchall). Each statement with parameters is prepared once per
    connection (``PREPARE``, in the string before its first use) and sent as ``EXECUTE
    name(literal, ...)``: the server neither parses nor plans it again, and the client
    binds a few dozen values per command with ``_literal`` instead of psycopg's general
    dumpers. A string without a read goes out through libpq's ``PQexec`` (one call, the
    GIL released, only the last result or the first error kept), skipping psycopg's
    cursor and result machinery for the ten results nobody reads; a read goes through
    a ``ClientCursor``. This is what bounds one session's commands/s: the client's CPU per
    command, then the server's, serially (issue 16; docs/benchmarks.md)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._cur: Any = None
        self._parts: list[str] = []
        self._prepared = _PREPARED.setdefault(conn, {})

    def _cursor(self) -> Any:
        if self._cur is None:
            from psycopg import ClientCursor  # loaded already: conn is psycopg's

            self._cur = ClientCursor(self._conn)
        return self._cur

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> None:
        if params is None:
            self._parts.append(statement)
            return
        self._parts.append(_executed(self._prepared, self._parts, statement, params, self._cursor))

    def executemany(self, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        split = _multi_row(statement) if len(rows) > 1 else None
        if split is None:
            for row in rows:
                self.execute(statement, row)
            return
        # A plain INSERT of several rows is ONE multi-row statement, prepared per number of
        # rows up to ``_PREPARED_ROWS`` (a command's events are a few), literal beyond.
        text = _rows_statement(*split, len(rows))
        flat = [value for row in rows for value in row]
        if len(rows) <= _PREPARED_ROWS:
            self.execute(text, flat)
        else:
            self._parts.append(_bind(_fragments(text), flat, self._cursor))

    def send(self) -> None:
        """Send what is queued (one round trip); the first failing statement is raised
        (psycopg's exception for its SQLSTATE) and the server skips the rest."""
        if not self._parts:
            return
        text = ";".join(self._parts)
        self._parts.clear()
        conn = self._conn
        result = conn.pgconn.exec_(text.encode(conn.info.encoding))
        if result.status not in _PQ_OK:
            from psycopg import OperationalError
            from psycopg.errors import error_from_result

            error = error_from_result(result, encoding=conn.info.encoding)
            if getattr(error, "sqlstate", None) is None:
                # No SQLSTATE: no statement failed, the link did (the server went away).
                # psycopg's cursor reports that as OperationalError: so does this.
                raise OperationalError(str(error)) from error
            raise error

    def _query(self) -> Any:
        """Send what is queued through the cursor, which then holds the last result."""
        return _run_string(self._cursor(), self._parts)

    def fetchone(self) -> Any:
        return self._query().fetchone()

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._query().fetchall()
        return rows

    def close(self) -> None:
        self._parts.clear()
        if self._cur is not None:
            self._cur.close()


def _executed(
    prepared: dict[str, tuple[str, ...]],
    parts: list[str],
    statement: str,
    params: Sequence[Any],
    cursor: Callable[[], Any],
    *,
    limit: int | None = None,
) -> str:
    """``statement`` (psycopg style) with ``params`` as ``EXECUTE name(literal, ...)`` of
    its prepared form on the connection whose registry ``prepared`` is, queuing its
    ``PREPARE`` into ``parts`` the first time (it runs before the EXECUTE in the same
    string, and survives the transaction's rollback). With ``limit``, a connection that
    holds that many prepared statements already, or a statement of more parameters than
    ``_PREPARED_PARAMS`` (a read's IN list of one page size), gets the statement with its
    literals instead."""
    call = prepared.get(statement)
    if call is None:
        count = len(params)
        if limit is not None and (len(prepared) >= limit or count > _PREPARED_PARAMS):
            return _bind(_fragments(statement), params, cursor)
        name = f"pico_{len(prepared)}"
        numbers = iter(range(1, count + 1))
        text = _PLACEHOLDER.sub(lambda m: "%" if m[0] == "%%" else f"${next(numbers)}", statement)
        call = (f"EXECUTE {name}(", *([","] * (count - 1)), ")") if count else (f"EXECUTE {name}",)
        # Bound first: a value that cannot be (a text holding NUL) leaves the connection's
        # registry as it was, not naming a statement its server never prepared.
        bound = _bind(call, params, cursor)
        parts.append(f"PREPARE {name} AS {text}")
        prepared[statement] = call
        return bound
    return _bind(call, params, cursor)


def _bind(fragments: Sequence[str], params: Sequence[Any], cursor: Callable[[], Any]) -> str:
    """``fragments`` (a statement split at its placeholders) with ``params`` between them
    as SQL literals (``_literal``; psycopg's own quoting, ``cursor().mogrify``, for any
    other type)."""
    if len(fragments) != len(params) + 1:
        raise TypeError(f"{len(fragments) - 1} placeholders for {len(params)} parameters")
    out = [fragments[0]]
    for value, fragment in zip(params, fragments[1:], strict=True):
        literal = _literal(value)
        out.append(cursor().mogrify("%s", (value,)) if literal is None else literal)
        out.append(fragment)
    return "".join(out)


def _run_string(cur: Any, parts: list[str]) -> Any:
    """Send ``parts`` as one simple-query string on ``cur`` (a ClientCursor) and leave it
    on the last statement's result, the one read; ``parts`` is emptied. Nothing queued:
    the cursor keeps its result."""
    if parts:
        text = ";".join(parts)
        parts.clear()
        cur.execute(text)
        while cur.nextset():
            pass
    return cur


@functools.lru_cache(maxsize=1024)
def _psycopg_style(statement: str) -> str:
    """Our statements use qmark placeholders; psycopg wants %s."""
    return statement.replace("?", "%s")


def _forget_prepared(conn: Any) -> None:
    """After a failed transaction on ``conn`` (rolled back): which of its string's
    PREPAREs ran is unknown, so none is kept, on either side."""
    if _PREPARED.pop(conn, None):
        conn.execute("DEALLOCATE ALL")


# libpq's ExecStatusType of a statement that succeeded: EMPTY_QUERY, COMMAND_OK, TUPLES_OK.
_PQ_OK = (0, 1, 2)
# The writer's statements each connection has prepared: statement -> its EXECUTE, split
# at its placeholders (``_ClientBatch._bind``).
# Forgotten (and the server's deallocated) when a write transaction fails, as it cannot
# tell which of its PREPAREs ran (``RawWriter._rollback``).
_PREPARED: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, ...]]] = weakref.WeakKeyDictionary()
_PLACEHOLDER = re.compile(r"%%|%s")
# A read prepares a statement of at most this many parameters (its IN lists have one
# length per page), and at most ``_READ_PREPARED`` statements per connection.
_PREPARED_PARAMS = 8
_READ_PREPARED = 200
_PREPARED_ROWS = 8
_MULTI_ROW: dict[str, tuple[str, str] | None] = {}
# The row may hold scalar subqueries (one level of parentheses: the event's stream and
# topic numbers, recorder.py ``_INSERT_EVENT``).
_PLAIN_INSERT = re.compile(r"(INSERT INTO [^;]+? VALUES )(\((?:[^()]|\([^()]*\))*\))", re.S)


def _multi_row(statement: str) -> tuple[str, str] | None:
    """``(head, values)`` of a plain ``INSERT ... VALUES (%s, ...)`` (nothing after its one
    row of placeholders: no ON CONFLICT, whose DO UPDATE may not touch a row twice in one
    statement, no RETURNING), or None."""
    if statement not in _MULTI_ROW:
        found = _PLAIN_INSERT.fullmatch(statement.strip())
        _MULTI_ROW[statement] = None if found is None else (found.group(1), found.group(2))
    return _MULTI_ROW[statement]


@functools.lru_cache(maxsize=256)
def _rows_statement(head: str, values: str, rows: int) -> str:
    """The INSERT of ``rows`` rows: ``head`` and the row of placeholders that many times."""
    return head + ",".join([values] * rows)


@functools.lru_cache(maxsize=1024)
def _fragments(statement: str) -> tuple[str, ...]:
    """A psycopg-style statement split at its ``%s`` placeholders (``%%`` is ``%``)."""
    out: list[str] = []
    current: list[str] = []
    for piece in re.split(r"(%%|%s)", statement):
        if piece == "%s":
            out.append("".join(current))
            current = []
        else:
            current.append("%" if piece == "%%" else piece)
    out.append("".join(current))
    return tuple(out)


def _literal(value: Any) -> str | None:
    """``value`` as a PostgreSQL literal for the types the writer binds, or None for
    psycopg's own quoting (``ClientCursor.mogrify``, which this matches: a text with a
    NUL byte is left to psycopg, which refuses it). Text goes as a standard string
    (quotes doubled) or, holding a backslash, an escape string (``E'...'``, backslashes
    doubled too), which reads the same whatever ``standard_conforming_strings`` is; bytes
    as hex bytea; a negative number after a space (``x -1``, never ``x--1``, a comment).
    The writer binds a few dozen values per command: psycopg's general dumper
    machinery was a fifth of its client CPU (issue 16)."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            return None
        if "\\" in text:
            return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
        return "'" + text.replace("'", "''") + "'"
    if kind is int:
        return f" {value}" if value < 0 else str(value)
    if value is None:
        return "NULL"
    if kind is bool:
        return "true" if value else "false"
    if kind is bytes:
        data: bytes = value
        return "E'\\\\x" + data.hex() + "'::bytea"
    return None


# What psycopg's implicit BEGIN sent on the writer's connection (SQLAlchemy's default
# isolation level), spelled out so a server's default_transaction_isolation cannot change it.
_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
# Durability "process" on PostgreSQL, as on SQLite (synchronous=NORMAL): a commit is
# durable against a crash of pico's process — it reached the server, which every other
# connection sees at once (a worker's takeover included) — but the server flushes its WAL
# in the background (within 3 x wal_writer_delay, 0.6 s by default), so a crash of the
# database server or its machine may lose the last commits. It spares each command the
# WAL flush, which bounds one session's commands/s (about 0.9-1.2 ms per commit on this
# machine). Durability "fsync" leaves the server's synchronous_commit in force.
_ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
# psycopg's ``TransactionStatus.INTRANS``: idle inside a transaction that has not failed.
_PG_INTRANS = 2
#: psycopg's TransactionStatus INERROR and UNKNOWN: an aborted transaction or a lost link.
_PG_BROKEN = (3, 4)
# A deferred batch is committed within the line's flush window (milliseconds) by a live
# owner. One whose owner stalls (a stopped process, a loop blocked, a faulted handle not
# yet closed) would keep its locks for as long: rows of its own session only (its head
# row, its streams' keys), which a new owner's claim waits for, and ROW EXCLUSIVE on
# pico_events, which only a claim's table lock waits for (no command takes one). The server
# ends such a batch (and its connection) after this long idle (5 s); the owner then faults,
# as after a crash. SET LOCAL: the limit ends with the batch.
_BATCH_IDLE_LIMIT = "SET LOCAL idle_in_transaction_session_timeout = 5000"
