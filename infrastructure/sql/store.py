"""SQLite and PostgreSQL: the event recorder and the read store, on SQLAlchemy Core.

``SqlRecorder.insert_events`` writes the stored events AND their projected read-model rows
in ONE transaction, so no reader ever sees half a commit and no read lags a returned
command. Reads run in one read transaction per logical query (a consistent snapshot:
WAL on SQLite, REPEATABLE READ on PostgreSQL).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sqlite3
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from pico.domain.errors import (
    ConfigurationError,
    PicoError,
    StorageCorruptError,
    StorageUnavailableError,
)
from pico.domain.values import Order, SessionMeta
from pico.infrastructure.settings import mask_url
from pico.infrastructure.sql import schema as t
from pico.infrastructure.sql.connections import IdleConnections
from pico.infrastructure.sql.notify import (
    NOTIFY_STATEMENT,
    SERIAL_SEQUENCE,
    CommitListener,
    channel_for,
    conninfo,
    notify_statement,
)
from pico.projections.ops import (
    AppendContext,
    AppendElement,
    CreateConversation,
    DeleteConversation,
    DropElements,
    DropValue,
    EstablishAddress,
    LinkOwned,
    MarkTaskAbort,
    PatchTask,
    PutClaim,
    PutClear,
    PutCommit,
    PutEntry,
    PutRoot,
    PutSession,
    PutTask,
    PutValue,
    PutVersion,
    ReplacePrefix,
    ResetContext,
    RetireWorking,
    RowOp,
)
from pico.projections.queries import ConvRow, EditRow, EntryRow, TaskRow

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger("pico.storage")

__all__ = [
    "SESSION_LOCK",
    "SqlDatabase",
    "SqlReadStore",
    "SqlRecorder",
    "read_only_connector",
    "translate_error",
]


class SqlDatabase:
    """Engines for one database URL: a writer engine and a reader engine.

    Opening writes nothing into a file that is not known good: a SQLite file is first
    inspected on a read-only connection (``mode=ro``), the schema is created only in a
    new or empty file (or migrated in one that is already pico's), and the journal mode
    is set only on the writer's connection, which opens at the first write. A read-only
    database never writes at all: every connection is ``mode=ro`` on SQLite and every
    transaction ``READ ONLY`` on PostgreSQL, and no DDL runs.
    """

    def __init__(
        self,
        url: str,
        *,
        durability: str = "process",
        read_only: bool = False,
        location: str | None = None,
        upgrade_schema: bool = False,
        manage_schema: bool = True,
        pool_max_size: int = 100,
        pool_timeout: float = 30.0,
    ) -> None:
        self.url = url
        #: PostgreSQL: this database's connection pool (``_open_postgresql``).
        self.pool: ConnectionPool | None = None
        #: PostgreSQL: the connections its sessions share between transactions.
        self.idle: IdleConnections | None = None
        self.pool_max_size = pool_max_size
        self.pool_timeout = pool_timeout
        self.dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
        self.read_only = read_only
        #: ``process`` or ``fsync`` (``Harness.open(durability=)``): on PostgreSQL
        #: ``process`` commits asynchronously (``_ASYNC_COMMIT``), ``fsync`` waits for the
        #: WAL flush as the server is configured to.
        self.durability = durability
        #: The embedder's opt-in to upgrading an older schema on open (``schema.ensure``).
        self.upgrade_schema = upgrade_schema
        #: False for ``pico db``: the open neither judges nor changes the schema.
        self.manage_schema = manage_schema
        #: What messages name: the SQLite file path, or the URL with its password masked.
        self.location = location or mask_url(url)
        #: False when a read-only open found no pico schema (nothing to read).
        self.has_schema = True
        #: PostgreSQL: the commit NOTIFY, naming the events' id sequence once it is known.
        self.notify_statement = NOTIFY_STATEMENT
        # SQLite writers of this process holding a deferred (not yet committed) batch: any
        # other connection about to take the write lock, or to read streams, commits
        # them first (RawWriter.flush_pending), so one session's open batch can never
        # block another's BEGIN IMMEDIATE on the same thread. PostgreSQL's are one set
        # for the process: a claim waits on the session's advisory lock, which another
        # handle's open batch of that session may hold, whatever URL or SqlDatabase its
        # writer came from (``RawWriter.exclusive`` flushes them first).
        self.pending: set[RawWriter] = set() if self.dialect == "sqlite" else _PG_PENDING
        #: A read-only connection held on an existing SQLite file until it is verified.
        self.guard: Any = None
        if self.dialect == "sqlite":
            self._open_sqlite(url, durability)
        else:
            self._open_postgresql(url)

    def _open_sqlite(self, url: str, durability: str) -> None:
        self.path = Path(url[len("sqlite:///") :])
        self.location = str(self.path)
        state = _sqlite_state(self.path, read_only=self.read_only)
        # Judged before anything is written: a refused schema leaves the file untouched.
        setup = self.manage_schema and (
            not isinstance(state, t.SchemaState) or self._needs_setup(state)
        )
        sync = "FULL" if durability == "fsync" else "NORMAL"
        if self.read_only:
            self.has_schema = state != "new"
            creator = read_only_connector(self.path)
            self.writer = sa.create_engine("sqlite://", creator=creator, poolclass=sa.pool.NullPool)
            self.reader = sa.create_engine(
                "sqlite://", creator=creator, poolclass=sa.pool.SingletonThreadPool
            )
            self.loader = sa.create_engine(
                "sqlite://", creator=creator, poolclass=sa.pool.SingletonThreadPool
            )
            for engine in (self.writer, self.reader, self.loader):
                _sqlite_pragmas(engine, sync, begin="BEGIN")
            return
        # Every RawWriter (one per open session) holds a private connection for its
        # lifetime: its reads between transactions may span awaits (RawWriter.
        # idle_connection), so no other session may share it.
        if state != "new":
            self._hold_guard()
        self.writer = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.reader = sa.create_engine(url, poolclass=sa.pool.SingletonThreadPool)
        # Event-stream loads get their own connection: a command's read snapshot may be
        # open on the reader's (one per thread) while it loads an aggregate.
        self.loader = sa.create_engine(url, poolclass=sa.pool.SingletonThreadPool)
        # Only the writer sets the journal mode (a persistent change of the file's
        # header): it connects at the first write, after the session was read.
        _sqlite_wal(self.writer)
        _sqlite_pragmas(self.writer, sync, begin="BEGIN IMMEDIATE")
        _sqlite_pragmas(self.reader, sync, begin="BEGIN")
        _sqlite_pragmas(self.loader, sync, begin="BEGIN")
        if setup:  # new, empty, or pico's to adopt or (opted in) upgrade
            self._setup()

    @property
    def _shown_url(self) -> str:
        """The URL a message tells the operator to pass to ``pico db`` (password masked)."""
        return f"sqlite:///{self.path}" if self.dialect == "sqlite" else self.location

    def _needs_setup(self, state: t.SchemaState) -> bool:
        return t.check(
            state,
            upgrade=self.upgrade_schema,
            read_only=self.read_only,
            location=self.location,
            url=self._shown_url,
            dialect=self.dialect,
        )

    def _hold_guard(self) -> None:
        """Keep a read-only connection on an existing file until a write open has verified
        it (its first commit). SQLite's last connection to close checkpoints the -wal into
        the main file and deletes it; while the guard is open no read-write connection is
        last, and a read-only connection cannot checkpoint. So an open that fails on
        damage (or on anything else before it writes) leaves the file and a leftover -wal
        byte-identical, and the damaged frames stay where an operator can set them aside."""
        guard = read_only_connector(self.path)()
        try:
            guard.execute("SELECT count(*) FROM sqlite_master").fetchall()  # takes its lock
        except Exception:
            guard.close()  # the inspection already vouched for the header; reads will tell
            return
        self.guard = guard

    def release_guard(self) -> None:
        guard, self.guard = self.guard, None
        if guard is not None:
            guard.close()

    def _open_postgresql(self, url: str) -> None:
        # One pool per URL per process, shared by its sessions (container._open_sql):
        # psycopg's own (``psycopg_pool``), which checks a connection before lending it,
        # replaces a broken or old one and reconnects in the background. SQLAlchemy lends
        # from it (``close_returns``: its close gives the connection back). A session's
        # writer and reader take a connection per transaction and snapshot and give it
        # back (``IdleConnections``, most recently used first), so the pool grows with the
        # transactions a process has in flight, not with the sessions it holds, up to
        # ``pool_max_size`` (``PicoSettings.pg_pool_max_size``); beyond it a transaction
        # waits up to the pool's timeout, then gets StorageUnavailableError.
        import psycopg  # loads libpq: PostgreSQL only
        from psycopg_pool import ConnectionPool

        info = conninfo(sa.make_url(url))
        with self.translating("connecting"):
            # One direct connection first: a server that cannot be reached, a wrong
            # password or database fail here at once, with libpq's own message (the pool
            # would retry them in the background until its timeout).
            psycopg.connect(info, connect_timeout=_PG_CONNECT_TIMEOUT).close()
        self.pool = ConnectionPool(
            info,
            # psycopg's own automatic prepared statements stay off: pico prepares its
            # statements itself (``_executed``), and psycopg answers a ROLLBACK on a
            # connection where it has prepared any with DEALLOCATE ALL, which would drop
            # pico's too (a connection now serves many sessions' claims in turn).
            kwargs={"prepare_threshold": None},
            min_size=1,
            max_size=self.pool_max_size,
            open=False,
            close_returns=True,
            check=ConnectionPool.check_connection,
            timeout=self.pool_timeout,
            name=self.location,
        )
        with self.translating("connecting"):
            self.pool.open(wait=True, timeout=_PG_CONNECT_TIMEOUT)
        self.idle = IdleConnections(self.pool)
        idle = self.idle
        self.writer = sa.create_engine(
            url, poolclass=sa.pool.NullPool, creator=lambda: idle.creator()
        )
        _pg_checkin(self.writer)
        if self.read_only:
            self.reader = self.loader = self.writer.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
            with self._closing_on_failure("connecting"), self.reader.connect() as conn:
                state = t.read_state(conn)
                self.has_schema = not state.fresh
                if self.has_schema and self.manage_schema:
                    self._needs_setup(state)  # refuses an older or newer schema
        else:
            self.reader = self.writer.execution_options(isolation_level="REPEATABLE READ")
            self.loader = self.reader
            if self.manage_schema:
                self._setup()

    @contextmanager
    def _schema_lock(self, doing: str) -> Iterator[Connection]:
        """One writing transaction that holds the schema lock: SQLite's write lock (BEGIN
        IMMEDIATE), PostgreSQL's advisory lock (concurrent opens across processes)."""
        with self.translating(doing), self.writer.begin() as conn:
            if self.dialect == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7305729)")
            yield conn

    def _setup(self) -> None:
        doing = "setting up pico's tables"
        with self._closing_on_failure(doing), self._schema_lock(doing) as conn:
            # Read again under the lock: another process may have set it up meanwhile.
            t.ensure(
                conn,
                upgrade=self.upgrade_schema,
                location=self.location,
                url=self._shown_url,
                dialect=self.dialect,
            )
            if self.dialect == "postgresql":  # the tables exist now
                sequence = conn.execute(sa.text(SERIAL_SEQUENCE)).scalar()
                if isinstance(sequence, str):
                    self.notify_statement = notify_statement(sequence)

    def schema_state(self) -> t.SchemaState:
        """What the database holds (``pico db current``); reads only."""
        if not self.has_schema:
            return t.SchemaState()
        with self.translating("reading its schema"), self.reader.connect() as conn:
            return t.read_state(conn)

    def migrate(self, target: str) -> tuple[t.SchemaState, str]:
        """Create, adopt or upgrade the schema to ``target`` in one transaction
        (``pico db upgrade``); returns the state found and the revision reached."""
        with self._schema_lock(f"upgrading pico's tables to {target}") as conn:
            return t.upgrade(conn, target, location=self.location)

    @contextmanager
    def _closing_on_failure(self, doing: str) -> Iterator[None]:
        """An opening step: on any failure release the engines, then raise the driver
        error as its ``PicoError`` (``translating``)."""
        with self.translating(doing):
            try:
                yield
            except BaseException:
                self.close()
                raise

    def translate(self, exc: BaseException, doing: str) -> BaseException:
        """The ``PicoError`` for a driver error met while ``doing`` something, or ``exc``
        itself when it is not a storage failure (the caller re-raises it unchanged)."""
        return translate_error(exc, self.location, doing, sqlite=self.dialect == "sqlite")

    @contextmanager
    def translating(self, doing: str) -> Iterator[None]:
        """Raise a driver error met in the block as its ``PicoError`` (``translate``);
        anything else passes through unchanged."""
        try:
            yield
        except Exception as exc:
            translated = self.translate(exc, doing)
            if translated is exc:
                raise
            raise translated from exc

    def raw_writer(self) -> RawWriter:
        return RawWriter(self)

    def flush_pending(self, *, but: RawWriter | None = None, session: str | None = None) -> None:
        """Commit every deferred batch of this process's writers (on their own thread);
        with ``session``, only those of that session's other handles."""
        here = threading.get_ident()
        for writer in list(self.pending):
            if (
                writer is not but
                and writer.thread == here
                and (session is None or writer.lock_key == session)
            ):
                try:
                    writer.flush()
                except Exception:  # recorded on that writer: its own session faults on it
                    log.warning("group commit of another session failed", exc_info=True)

    def close(self) -> None:
        # An unverified file's guard closes last (see _hold_guard): no checkpoint runs.
        if self.idle is not None:
            self.idle.close()
        self.writer.dispose()
        for engine in {self.reader, self.loader}:
            if engine is not self.writer:
                engine.dispose()
        if self.pool is not None:
            self.pool.close()
        self.release_guard()


#: How long opening the pool waits for its first connection (seconds).
_PG_CONNECT_TIMEOUT = 30

#: PostgreSQL writers of this process holding an open deferred batch (``SqlDatabase.pending``).
_PG_PENDING: set[RawWriter] = set()

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_SQLITE_UNAVAILABLE = {3, 5, 6, 8, 10, 13, 14, 23}  # PERM BUSY LOCKED READONLY IOERR FULL
# CANTOPEN AUTH
_SQLITE_SHORT_READ = 522  # SQLITE_IOERR_SHORT_READ: the file is shorter than its pages
_CORRUPT_TEXT = (
    "malformed",
    "not a database",
    "could not decode to utf-8",
    "corrupt",
    "unsupported file format",
    "no such table",
    "no such column",
)


def translate_error(
    exc: BaseException, location: str, doing: str, *, sqlite: bool
) -> BaseException:
    """Driver and SQLAlchemy errors as pico's: damage the driver detects is
    ``StorageCorruptError``, a database that cannot be reached, opened or locked is
    ``StorageUnavailableError``; anything else is returned unchanged. Translated once,
    here, at the adapter boundary; the message stands alone (passwords masked)."""
    if isinstance(exc, PicoError):
        return exc
    orig: BaseException = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if sqlite:
        if not isinstance(orig, sqlite3.Error):
            return exc
        code = getattr(orig, "sqlite_errorcode", None)
        lowered = text.lower()
        if (
            code == _SQLITE_SHORT_READ
            or (code is not None and code & 0xFF in _SQLITE_CORRUPT)
            or any(s in lowered for s in _CORRUPT_TEXT)
        ):
            what = (
                "is not a SQLite database (or is encrypted or damaged)"
                if "not a database" in lowered
                else "is damaged"
            )
            return StorageCorruptError(
                f"{location} {what}: SQLite reported {text!r} while {doing}; nothing was "
                "changed. Restore the file from a backup or point pico at another file "
                "(pico check URL --session S reports what is damaged)"
            )
        if (code is not None and code & 0xFF in _SQLITE_UNAVAILABLE) or isinstance(
            orig, sqlite3.OperationalError
        ):
            return StorageUnavailableError(
                f"{location} could not be used while {doing}: SQLite reported {text!r}; check "
                "the file and its directory exist and are readable (and writable to write), "
                "and that the disk is not full"
            )
        return exc
    # psycopg is imported only by a PostgreSQL engine (its libpq costs ~9 MiB of RSS): if
    # it is not loaded, the error is not one of its.
    psycopg: Any = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(orig, psycopg.Error):
        return exc
    pool: Any = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(orig, pool.PoolTimeout):
        return StorageUnavailableError(
            f"PostgreSQL at {location} could not be used while {doing}: every connection of "
            f"this process's pool is in use ({_mask_text(text)}): each open transaction, read "
            "snapshot and group-committed batch holds one; finish or close what no longer "
            "needs one, or raise PICO_PG_POOL_MAX_SIZE (and the server's max_connections)"
        )
    if isinstance(orig, psycopg.errors.InsufficientPrivilege):
        return StorageUnavailableError(
            f"PostgreSQL at {location} refused while {doing}: {_mask_text(text)}; the role in "
            "the URL lacks a privilege pico needs: a first open creates pico's tables (CREATE "
            "on the schema), so create them as their owner with `pico db upgrade URL`, then "
            "grant this role the privileges in docs/postgresql.md"
        )
    if isinstance(orig, psycopg.OperationalError):
        return StorageUnavailableError(
            f"PostgreSQL at {location} could not be used while {doing}: {_mask_text(text)}; "
            "check that the server is running and reachable, and the user, password and "
            "database in the URL"
        )
    if isinstance(orig, psycopg.errors.DataError | psycopg.errors.UndefinedTable):
        return StorageCorruptError(
            f"PostgreSQL at {location}: {_mask_text(text)} while {doing}; nothing was changed. "
            "The pico tables are damaged or missing: restore the database from a backup"
        )
    return exc


def _mask_text(text: str) -> str:
    """A driver message without any ``password=...`` it may quote."""
    return re.sub(r"(password\s*=\s*)\S+", r"\1***", text, flags=re.IGNORECASE)


def read_only_connector(path: Path) -> Callable[[], Any]:
    """A DBAPI connect function for ``path`` opened read-only at the driver (``mode=ro``):
    nothing through it can write, create the file or change its journal mode."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"

    def connect() -> Any:
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    return connect


def _sqlite_state(path: Path, *, read_only: bool) -> str | t.SchemaState:
    """What the file at ``path`` is, inspected without writing: ``new`` (absent, or empty:
    pico may create its schema there) or the state of pico's schema in it. A directory, a
    missing or unwritable directory, a foreign SQLite database or a damaged file raise, and
    nothing is created."""
    if path.is_dir():
        raise StorageUnavailableError(
            f"{path} is a directory, not a SQLite file; name a file inside it, e.g. "
            f"sqlite:///{path / 'pico.db'}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not path.exists():
        if not parent.is_dir():
            raise StorageUnavailableError(
                f"the directory {parent} of {path} does not exist; create it first (pico "
                "creates the database file, not its directories)"
            )
        if not read_only and not os.access(parent, os.W_OK | os.X_OK):
            raise StorageUnavailableError(
                f"cannot create {path}: the directory {parent} is not writable; pick another "
                "path or fix its permissions"
            )
        return "new"
    if not os.access(path, os.R_OK):
        raise StorageUnavailableError(f"{path} is not readable; fix its permissions")
    if not read_only and not (os.access(path, os.W_OK) and os.access(parent, os.W_OK | os.X_OK)):
        raise StorageUnavailableError(
            f"{path} (or its directory, which holds the -wal and -shm files) is not writable; "
            "open it with read_only=True to read it, or fix its permissions"
        )
    if path.stat().st_size == 0:
        return "new"
    location = str(path)
    with path.open("rb") as f:
        header = f.read(100)
    if (
        len(header) == 100
        and header[:16] == b"SQLite format 3\x00"
        and not (header[18] in (1, 2) and header[19] in (1, 2))
    ):
        # Versions above 2 make SQLite treat the file as read-only or unreadable: damage
        # in the header, not a permission to report.
        raise StorageCorruptError(
            f"{path} is damaged: its header's file format versions are {header[18]} and "
            f"{header[19]} (SQLite writes 1 or 2); nothing was changed. Restore the file from "
            "a backup (pico check URL --session S reports what is damaged)"
        )
    try:
        conn = read_only_connector(path)()
    except sqlite3.Error as exc:
        translated = translate_error(exc, location, "opening it", sqlite=True)
        if translated is exc:
            raise
        raise translated from exc
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return "new"
        if "pico_schema" not in tables and t.VERSION_TABLE not in tables:
            raise ConfigurationError(
                f"{path} is a SQLite database of another application (it has no pico tables); "
                "nothing was changed. Point pico at its own file or a new path"
            )
        found = t.state_from(tables.__contains__, lambda sql: conn.execute(sql).fetchall())
    except sqlite3.Error as exc:
        translated = translate_error(exc, location, "reading its schema", sqlite=True)
        if translated is exc:
            raise
        raise translated from exc
    finally:
        conn.close()
    return found


class RawWriter:
    """One DBAPI connection for a session's writes, with explicit transactions."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self._fairy: Any = None
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

    def sql(self, statement: str) -> str:
        """Our statements use qmark placeholders; psycopg wants %s."""
        return statement if self.sqlite else _psycopg_style(statement)

    def connection(self) -> Any:
        """The held DBAPI connection, taken on first use on the calling thread: SQLite's
        is the writer's own for its lifetime; PostgreSQL's is lent by the process's idle
        connections (in autocommit: transactions are ours to open, ``_BEGIN``) and given
        back when the transaction, batch or claim holding it ends (``_release``)."""
        if self._fairy is None:
            with self.db.translating("connecting to write"):
                if self.db.idle is not None:
                    self._fairy = self.db.idle.take()
                else:
                    self._fairy = self.db.writer.raw_connection()
            self.thread = threading.get_ident()
        return self._fairy.driver_connection

    def _release(self) -> None:
        """PostgreSQL: give the connection back between transactions, for this process's
        other sessions (``IdleConnections``); a deferred batch or a claim's lock keeps it."""
        if self.pending or self.held or self._fairy is None or self.db.idle is None:
            return
        fairy, self._fairy = self._fairy, None
        self.db.idle.give(fairy)

    def idle_connection(self) -> Any | None:
        """The writer's connection for a read on its own thread between transactions (or
        inside its own deferred batch, whose writes the session's reads must see), or
        None. SQLite empties a connection's page cache whenever another connection has
        written, so the reader connections start every snapshot cold after each commit;
        the writer's own cache stays warm across its commits."""
        if self._fairy is None or self.thread != threading.get_ident():
            return None
        conn = self._fairy.driver_connection
        if not self.sqlite:
            # PostgreSQL: only inside the batch. Between transactions the reader's
            # connections serve (a REPEATABLE READ snapshot each) and the writer's stays idle.
            return conn if self.pending else None
        return conn if self.pending or not conn.in_transaction else None

    def batch_aborted(self, exc: BaseException) -> None:
        """A read inside the open PostgreSQL batch failed on the server, which aborts the
        whole transaction: the batch is lost (a COMMIT would only roll it back), so every
        later write refuses and the session faults at its next command or flush."""
        self.lost = exc
        self._end_batch()
        if self._fairy is not None:
            conn = self._fairy.driver_connection
            self._rollback(conn, None)
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
                self._fairy.driver_connection.execute("ROLLBACK")
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
            fairy, self._fairy = self._fairy, None
            try:
                fairy.close()
            except Exception:
                fairy.invalidate()


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
            from psycopg.errors import error_from_result

            raise error_from_result(result, encoding=conn.info.encoding)

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
        parts.append(f"PREPARE {name} AS {text}")
        call = (f"EXECUTE {name}(", *([","] * (count - 1)), ")") if count else (f"EXECUTE {name}",)
        prepared[statement] = call
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
_PLAIN_INSERT = re.compile(r"(INSERT INTO [^;]+? VALUES )(\([^()]*\))", re.S)


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


def _pg_checkin(engine: Engine) -> None:
    """A writer's connection (``RawWriter.connection``: autocommit, transactions opened
    explicitly) goes back to the pool as SQLAlchemy lent it: not in autocommit, which would
    make every statement of a later ``engine.begin()`` (a schema upgrade) commit alone."""

    @sa_event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, _rec: Any) -> None:
        if dbapi_conn is not None and dbapi_conn.autocommit:
            dbapi_conn.autocommit = False


def _sqlite_wal(engine: Engine) -> None:
    """Put the file in WAL mode at connect: a persistent change of its header, so only the
    writer does it (registered before ``_sqlite_pragmas``, whose listener then runs second)."""

    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.execute("PRAGMA journal_mode=WAL")


def _sqlite_pragmas(engine: Engine, synchronous: str, *, begin: str) -> None:
    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        # Take transaction control from pysqlite so BEGIN IMMEDIATE is ours to issue.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        # SQLite's default checkpoint (every 1,000 WAL pages) runs inside the COMMIT that
        # crosses it, with two fsyncs under synchronous=NORMAL: at ~200 pages per agent turn
        # that was one checkpoint every ~5 turns. A larger interval checkpoints hot pages once
        # instead of many times and pays the fsyncs a tenth as often (2,000-turn benchmark:
        # mean minus median per turn ~0.9-1.1 -> ~0.5-0.7 ms). The WAL may grow to ~40 MiB.
        cur.execute("PRAGMA wal_autocheckpoint=10000")
        cur.close()

    @sa_event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql(begin)


class SqlRecorder(AggregateRecorder):
    """An eventsourcing recorder whose inserts also apply read-model row ops.

    The write path is fixed-shape and hot, so it runs precompiled statements on one held
    DBAPI connection (the session has one writer); reads use SQLAlchemy Core.
    """

    def __init__(self, db: SqlDatabase, *, table: sa.Table = t.events) -> None:
        self.db = db
        self.table = table
        self.is_events = table is t.events
        self._writer = db.raw_writer()
        #: PostgreSQL: every event batch ends its transaction with a NOTIFY on the
        #: session's channel (LISTEN/NOTIFY watch wakeups); False only to measure its cost.
        self.notify_commits = db.dialect == "postgresql" and self.is_events
        self._channels: dict[str, str] = {}
        self._listeners: list[CommitListener] = []
        #: The last context position of each conversation this writer has written or read,
        #: as of its last committed transaction (None: an empty context): the owner is the
        #: session's only writer, so an append needs no read of it (``_LAST_POSITION``).
        self._lasts: dict[tuple[str, int], int | None] = {}

    @property
    def writer(self) -> RawWriter:
        return self._writer

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        session_id: str = kwargs.get("session_id", "")
        ops: Sequence[RowOp] = kwargs.get("ops", ())
        if self.is_events:
            sql = self._writer.sql(_INSERT_EVENT)
            rows: list[tuple[Any, ...]] = [
                (session_id, _hex(e.originator_id), e.originator_version, e.topic, e.state)
                for e in stored_events
            ]
        else:
            sql = self._writer.sql(_INSERT_SNAPSHOT)
            rows = [
                (_hex(e.originator_id), e.originator_version, e.topic, e.state)
                for e in stored_events
            ]

        def write(cur: Any) -> None:
            if rows:
                cur.executemany(sql, rows)
            if not self.is_events:
                # Only the newest snapshot is ever read: older ones would grow storage with
                # every snapshot interval (a context can be long), so replace them.
                cur.executemany(self._writer.sql(_PRUNE_SNAPSHOTS), [(r[0], r[1]) for r in rows])
            if ops:
                projection.apply(ops, cur)
            if notify is not None:
                # Last, in the same transaction: delivered at COMMIT, dropped by a rollback.
                cur.execute(self.db.notify_statement, (notify,))

        notify = self._channel(session_id) if self.notify_commits and rows else None
        projection = SqlProjectionWriter(
            None, self._writer.sql, session_id, self.db.dialect, lasts=self._lasts
        )
        try:
            self._writer.transaction(write, defer=bool(kwargs.get("defer")))
        except BaseException:
            # What the failed transaction read or wrote is not the database's: forget all
            # (a rolled-back deferred batch took earlier commands' appends with it).
            self._lasts.clear()
            raise
        projection.settle()
        return None

    def _channel(self, session_id: str) -> str:
        channel = self._channels.get(session_id)
        if channel is None:
            channel = self._channels[session_id] = channel_for(session_id)
        return channel

    def listen(self, session_id: str) -> Callable[..., Any] | None:
        """PostgreSQL: ``wait_commit(after=, timeout=)`` for a watcher of ``session_id``
        (a ``CommitListener`` closed with this recorder); None on SQLite, which has no
        notifications (the watch hub polls)."""
        if self.db.dialect != "postgresql" or not self.is_events:
            return None
        listener = CommitListener(
            conninfo(self.db.writer.url), self._channel(session_id), location=self.db.location
        )
        self._listeners.append(listener)
        return listener.wait

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        c = self.table.c
        q = sa.select(c.originator_id, c.originator_version, c.topic, c.state).where(
            c.originator_id == _hex(originator_id)
        )
        if gt is not None:
            q = q.where(c.originator_version > gt)
        if lte is not None:
            q = q.where(c.originator_version <= lte)
        q = q.order_by(c.originator_version.desc() if desc else c.originator_version)
        if limit is not None:
            q = q.limit(limit)
        if self._writer.pending:  # the loader must see every command this session ran
            self._writer.flush()
        with (
            self.db.translating(f"reading the events of stream {_hex(originator_id)}"),
            self.db.loader.connect() as conn,
        ):
            return [StoredEvent(UUID(r[0]), r[1], r[2], _body(r[3])) for r in conn.execute(q)]

    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]:
        c = t.events.c
        q = (
            sa.select(c.id, c.originator_id, c.originator_version, c.topic, c.state)
            .where(c.session_id == session_id, c.id > after)
            .order_by(c.id)
            .limit(limit)
        )
        if self._writer.pending:
            self._writer.flush()
        doing = f"reading the events of session {session_id!r} after position {after}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return [
                (r[0], StoredEvent(UUID(r[1]), r[2], r[3], _body(r[4]))) for r in conn.execute(q)
            ]

    def last_session_position(self, session_id: str) -> int:
        """The position of the session's newest stored event (0: none): one index seek."""
        c = t.events.c
        q = sa.select(sa.func.max(c.id)).where(c.session_id == session_id)
        if self._writer.pending:
            self._writer.flush()
        doing = f"reading the newest event position of session {session_id!r}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return int(conn.execute(q).scalar_one() or 0)

    def count_session_events(self, session_id: str, *, after: int) -> int:
        c = t.events.c
        q = sa.select(sa.func.count()).where(c.session_id == session_id, c.id > after)
        if self._writer.pending:
            self._writer.flush()
        doing = f"counting the events of session {session_id!r} after position {after}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def flush(self) -> None:
        self._writer.flush()

    def abandon(self, reason: str) -> None:
        self._writer.abandon(reason)

    def exclusive(self, session_id: str) -> Any:
        # A claim: another owner may have written since this one last did.
        self._lasts.clear()
        return self._writer.exclusive(session_id)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        self._writer.close()


def _hex(value: UUID | str) -> str:
    return value.hex if isinstance(value, UUID) else UUID(value).hex


_INSERT_EVENT = (
    "INSERT INTO pico_events (session_id, originator_id, originator_version, "
    "topic, state) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_SNAPSHOT = (
    "INSERT INTO pico_snapshots (originator_id, originator_version, topic, "
    "state) VALUES (?, ?, ?, ?)"
)
_PRUNE_SNAPSHOTS = "DELETE FROM pico_snapshots WHERE originator_id = ? AND originator_version < ?"
_INSERT_ENTRY = (
    "INSERT INTO pico_entries (session_id, id, conversation_id, kind, key, "
    "content, metadata, by_task_id, commit_end) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_EDIT = (
    "INSERT INTO pico_context_edits (session_id, conversation_id, seq, op, base, "
    "ids, removed, revision) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_ELEMENT = (
    "INSERT INTO pico_context_elements (session_id, conversation_id, position, "
    "entry_id) VALUES (?, ?, ?, ?)"
)
# ORDER BY ... DESC LIMIT 1, not max(): PostgreSQL's generic plan for a prepared max()
# (psycopg prepares a statement after its 5th run) aggregates over every element of the
# conversation, so each append cost O(context) (2.4 -> 4.8 ms per commit over 4,000
# appends); this form is a backward index probe in every plan (§7.2: "latest" is DESC LIMIT 1).
_LAST_POSITION = (
    "SELECT position FROM pico_context_elements WHERE session_id = ? AND conversation_id = ? "
    "ORDER BY position DESC LIMIT 1"
)
_PIVOT = (
    "SELECT position FROM pico_context_elements WHERE session_id = ? AND "
    "conversation_id = ? ORDER BY position LIMIT 1 OFFSET ?"
)
_DELETE_THROUGH = (
    "DELETE FROM pico_context_elements WHERE session_id = ? AND "
    "conversation_id = ? AND position <= ?"
)
_DELETE_CONTEXT = "DELETE FROM pico_context_elements WHERE session_id = ? AND conversation_id = ?"
_INSERT_COMMIT = "INSERT INTO pico_commits (session_id, last, first, scope) VALUES (?, ?, ?, ?)"
_HEAD_MAIN = "UPDATE pico_sessions SET head = ?, main_head = ? WHERE session_id = ?"
_HEAD = "UPDATE pico_sessions SET head = ? WHERE session_id = ?"
# The session's write lock on PostgreSQL: a transaction-level advisory lock on the
# session's key (the two-int key space, apart from the schema lock's single key), taken
# FIRST by every write transaction of a claimed writer and by a claim (RawWriter.exclusive),
# so they queue in one order and never deadlock; no other session ever waits for it.
SESSION_LOCK = "SELECT pg_advisory_xact_lock(7305730, hashtext(%s))"
_INSERT_SESSION = "INSERT INTO pico_sessions (session_id, head, main_head) VALUES (?, 0, 0)"
_OWNER = "UPDATE pico_sessions SET owner = ? WHERE session_id = ?"
_ROOT = "UPDATE pico_sessions SET root_id = ? WHERE session_id = ?"
_INSERT_CONVERSATION = (
    "INSERT INTO pico_conversations (session_id, id, created_seq, source_conversation_id, "
    "source_as_of, inherit_state, owner_task_id, prefix_revision, deleted_seq) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, 0, NULL)"
)
_REVISION = "UPDATE pico_conversations SET prefix_revision = ? WHERE session_id = ? AND id = ?"
_DELETED = "UPDATE pico_conversations SET deleted_seq = ? WHERE session_id = ? AND id = ?"


_ESTABLISH = {
    "sqlite": (
        "INSERT OR IGNORE INTO pico_addresses (session_id, scope_kind, kind, namespace, "
        "key, rewind) VALUES (?, ?, ?, ?, ?, ?)"
    ),
    "postgresql": (
        "INSERT INTO pico_addresses (session_id, scope_kind, kind, namespace, key, "
        "rewind) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
    ),
}
_UPSERT_VALUE = (
    "INSERT INTO pico_values (session_id, scope, namespace, key, seq, value) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, scope, namespace, key) "
    "DO UPDATE SET seq = excluded.seq, value = excluded.value"
)
_DROP_VALUE = (
    "DELETE FROM pico_values WHERE session_id = ? AND scope = ? AND namespace = ? AND key = ?"
)
_PUT_VERSION = (
    "INSERT INTO pico_value_versions (session_id, conversation_id, namespace, key, "
    "seq, value) VALUES (?, ?, ?, ?, ?, ?)"
)
_APPEND_ELEMENT = (
    "INSERT INTO pico_list_elements (session_id, scope, namespace, key, id, "
    "value) VALUES (?, ?, ?, ?, ?, ?)"
)
_DROP_ELEMENTS = (
    "DELETE FROM pico_list_elements WHERE session_id = ? AND scope = ? AND "
    "namespace = ? AND key = ?"
)
_PUT_CLEAR = (
    "INSERT INTO pico_list_clears (session_id, scope, namespace, key, seq) VALUES (?, ?, ?, ?, ?)"
)
_RETIRE_VALUES = "DELETE FROM pico_values WHERE session_id = ? AND scope = ? AND seq <= ?"
_RETIRE_ELEMENTS = "DELETE FROM pico_list_elements WHERE session_id = ? AND scope = ? AND id <= ?"


_INSERT_TASK = (
    "INSERT INTO pico_tasks (session_id, id, conversation_id, kind, status, role, state, "
    "after, foreground, spawned_by, owned_conversation_id, not_before, required_permit, "
    "abort_requested, updated_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)"
)
# A patch without new state (NULL) keeps the stored state.
_PATCH_TASK = (
    "UPDATE pico_tasks SET status = ?, role = ?, state = COALESCE(?, state), after = ?, "
    "not_before = ?, required_permit = ?, updated_seq = ? WHERE session_id = ? AND id = ?"
)
_MARK_ABORT = (
    "UPDATE pico_tasks SET abort_requested = ?, updated_seq = ? WHERE session_id = ? AND id = ?"
)
_LINK_OWNED = (
    "UPDATE pico_tasks SET owned_conversation_id = ?, updated_seq = ? "
    "WHERE session_id = ? AND id = ?"
)


class SqlProjectionWriter:
    """Applies row ops inside the events' transaction. Touches only the rows a commit
    changes: no transcript or context rewrite per append."""

    def __init__(
        self,
        cur: Any,
        sql: Callable[[str], str],
        session_id: str,
        dialect: str = "sqlite",
        *,
        lasts: dict[tuple[str, int], int | None] | None = None,
    ) -> None:
        self.cur = cur
        self.q = sql
        self.sid = session_id
        self.dialect = dialect
        # The writer's known last context positions (``SqlRecorder._lasts``), updated by
        # ``settle`` once this transaction committed: ``_changed`` holds its new values,
        # ``_forgotten`` the conversations whose last position it no longer knows.
        self._lasts = lasts
        self._changed: dict[int, int | None] = {}
        self._forgotten: set[int] = set()
        # Consecutive writes of one statement go out as one executemany (psycopg pipelines
        # them); the buffer is flushed before every read and at the end, so order holds.
        self._pending: list[tuple[Any, ...]] = []
        self._pending_sql: str | None = None

    def _x(self, statement: str, params: tuple[Any, ...]) -> None:
        if statement is not self._pending_sql:
            self._flush()
            self._pending_sql = statement
        self._pending.append(params)

    def _flush(self) -> None:
        if self._pending_sql is not None and self._pending:
            if len(self._pending) == 1:
                self.cur.execute(self.q(self._pending_sql), self._pending[0])
            else:
                self.cur.executemany(self.q(self._pending_sql), self._pending)
        self._pending = []
        self._pending_sql = None

    def _read_one(self, statement: str, params: tuple[Any, ...]) -> Any:
        self._flush()
        self.cur.execute(self.q(statement), params)
        row = self.cur.fetchone()
        return None if row is None else row[0]

    def settle(self) -> None:
        """The transaction committed: what it wrote is what the writer now knows."""
        if self._lasts is None:
            return
        for cid in self._forgotten:
            self._lasts.pop((self.sid, cid), None)
        for cid, last in self._changed.items():
            self._lasts[(self.sid, cid)] = last

    def apply(self, ops: Sequence[RowOp], cur: Any = None) -> None:
        if cur is not None:
            self.cur = cur
        sid = self.sid
        entries: list[tuple[Any, ...]] = []
        edits: list[tuple[Any, ...]] = []
        establish: set[tuple[Any, ...]] = set()
        for op in ops:  # most frequent ops first
            if isinstance(op, PutCommit):
                self._x(_INSERT_COMMIT, (sid, op.last, op.first, op.scope))
                if op.scope == "main":
                    self._x(_HEAD_MAIN, (op.last, op.last, sid))
                else:
                    self._x(_HEAD, (op.last, sid))
            elif isinstance(op, PatchTask):
                after = json.dumps(list(op.after))
                self._x(
                    _PATCH_TASK,
                    (
                        op.status,
                        op.role,
                        op.state,
                        after,
                        op.not_before,
                        op.required_permit,
                        op.seq,
                        sid,
                        op.task_id,
                    ),
                )
            elif isinstance(op, PutTask):
                self._x(
                    _INSERT_TASK,
                    (
                        sid,
                        op.task_id,
                        op.conversation_id,
                        op.kind,
                        op.status,
                        op.role,
                        op.state,
                        json.dumps(list(op.after)),
                        op.foreground,
                        op.spawned_by,
                        op.not_before,
                        op.required_permit,
                        False,
                        op.task_id,
                    ),
                )
            elif isinstance(op, PutEntry):
                entries.append(
                    (
                        sid,
                        op.entry_id,
                        op.conversation_id,
                        op.kind,
                        op.key,
                        op.content,
                        op.metadata,
                        op.by_task_id,
                        op.commit_end,
                    )
                )
            elif isinstance(op, AppendContext):
                self._append_elements(op.conversation_id, op.ids)
                edits.append(
                    self._edit(op.conversation_id, op.seq, "append", op.ids, 0, op.revision)
                )
            elif isinstance(op, CreateConversation):
                cid = op.conversation_id
                self._x(
                    _INSERT_CONVERSATION,
                    (
                        sid,
                        cid,
                        cid,
                        op.source_conversation_id,
                        op.source_as_of,
                        op.inherit_state,
                        op.owner_task_id,
                    ),
                )
                self._insert_elements(cid, 0, op.context)
                self._known(cid, len(op.context) - 1 if op.context else None)
                edits.append(self._edit(cid, cid, "create", op.context, 0, 0))
            elif isinstance(op, ReplacePrefix):
                self._replace(op)
                edits.append(
                    self._edit(
                        op.conversation_id,
                        op.seq,
                        "replace",
                        op.replacement,
                        op.removed,
                        op.revision,
                    )
                )
            elif isinstance(op, ResetContext):
                self._x(_DELETE_CONTEXT, (sid, op.conversation_id))
                self._insert_elements(op.conversation_id, 0, op.ids)
                self._known(op.conversation_id, len(op.ids) - 1 if op.ids else None)
                self._x(_REVISION, (op.revision, sid, op.conversation_id))
                edits.append(
                    self._edit(op.conversation_id, op.seq, "reset", op.ids, 0, op.revision)
                )
            elif isinstance(op, DeleteConversation):
                self._x(_DELETED, (op.seq, sid, op.conversation_id))
            elif isinstance(op, EstablishAddress):
                # Idempotent: written once per batch, after the other rows.
                establish.add((sid, op.scope_kind, op.kind, op.namespace, op.key, op.rewind))
            elif isinstance(op, PutValue):
                self._x(_UPSERT_VALUE, (sid, op.scope, op.namespace, op.key, op.seq, op.value))
            elif isinstance(op, DropValue):
                self._x(_DROP_VALUE, (sid, op.scope, op.namespace, op.key))
            elif isinstance(op, PutVersion):
                self._x(
                    _PUT_VERSION, (sid, op.conversation_id, op.namespace, op.key, op.seq, op.value)
                )
            elif isinstance(op, AppendElement):
                self._x(
                    _APPEND_ELEMENT, (sid, op.scope, op.namespace, op.key, op.element_id, op.value)
                )
            elif isinstance(op, DropElements):
                self._x(_DROP_ELEMENTS, (sid, op.scope, op.namespace, op.key))
            elif isinstance(op, PutClear):
                self._x(_PUT_CLEAR, (sid, op.scope, op.namespace, op.key, op.seq))
            elif isinstance(op, RetireWorking):
                self._x(_RETIRE_VALUES, (sid, op.scope, op.seq))
                self._x(_RETIRE_ELEMENTS, (sid, op.scope, op.seq))
            elif isinstance(op, MarkTaskAbort):
                self._x(_MARK_ABORT, (True, op.seq, sid, op.task_id))
            elif isinstance(op, LinkOwned):
                self._x(_LINK_OWNED, (op.conversation_id, op.seq, sid, op.task_id))
            elif isinstance(op, PutSession):
                self._x(_INSERT_SESSION, (sid,))
            elif isinstance(op, PutClaim):
                self._x(_OWNER, (op.owner, sid))
            elif isinstance(op, PutRoot):
                self._x(_ROOT, (op.conversation_id, sid))
        self._flush()
        if establish:
            self.cur.executemany(self.q(_ESTABLISH[self.dialect]), sorted(establish))
        if entries:
            self.cur.executemany(self.q(_INSERT_ENTRY), entries)
        if edits:
            self.cur.executemany(self.q(_INSERT_EDIT), edits)

    def _edit(
        self, cid: int, seq: int, op: str, ids: Sequence[int], removed: int, revision: int
    ) -> tuple[Any, ...]:
        return (
            self.sid,
            cid,
            seq,
            op,
            op in ("create", "reset"),
            json.dumps(list(ids)),
            removed,
            revision,
        )

    def _insert_elements(self, cid: int, start: int, ids: Sequence[int]) -> None:
        if ids:
            self._flush()
            self.cur.executemany(
                self.q(_INSERT_ELEMENT), [(self.sid, cid, start + i, e) for i, e in enumerate(ids)]
            )

    def _known(self, cid: int, last: int | None) -> None:
        self._changed[cid] = last
        self._forgotten.discard(cid)

    def _last_position(self, cid: int) -> int | None:
        """The conversation's last context position: what this transaction or the writer
        knows, else one read."""
        if cid in self._changed:
            return self._changed[cid]
        key = (self.sid, cid)
        if self._lasts is not None and cid not in self._forgotten and key in self._lasts:
            return self._lasts[key]
        last: int | None = self._read_one(_LAST_POSITION, (self.sid, cid))
        self._known(cid, last)
        return last

    def _append_elements(self, cid: int, ids: Sequence[int]) -> None:
        last = self._last_position(cid)
        start = 0 if last is None else last + 1
        self._insert_elements(cid, start, ids)
        if ids:
            self._known(cid, start + len(ids) - 1)

    def _replace(self, op: ReplacePrefix) -> None:
        cid = op.conversation_id
        # The position of the last replaced element; the retained suffix is not rewritten.
        pivot = self._read_one(_PIVOT, (self.sid, cid, op.removed - 1))
        self._x(_DELETE_THROUGH, (self.sid, cid, pivot))
        self._insert_elements(cid, pivot - len(op.replacement) + 1, op.replacement)
        self._x(_REVISION, (op.revision, self.sid, cid))
        # Whether a suffix was retained is not known here: the next append reads.
        self._changed.pop(cid, None)
        self._forgotten.add(cid)


#: The context of a read inside an open snapshot: it adds nothing (nullcontext is reusable).
_NESTED: AbstractContextManager[None] = nullcontext()


class SqlReadStore:
    """The ``ReadStore`` primitives as indexed SQL queries for one session.

    Each logical read runs in one read transaction (one snapshot); statements are
    precompiled text executed on that transaction's DBAPI connection, because building
    SQLAlchemy expressions cost ~10x the query itself on these point lookups.
    """

    def __init__(
        self, db: SqlDatabase, session_id: str, *, writer: RawWriter | None = None
    ) -> None:
        self.db = db
        self.sid = session_id
        self._writer = writer
        self._local = threading.local()
        self._pg = db.dialect == "postgresql"
        self._begin = "BEGIN ISOLATION LEVEL REPEATABLE READ" + (
            " READ ONLY" if db.read_only else ""
        )
        self._lock = threading.Lock()
        self._fairies: list[Any] = []

    def read(self) -> AbstractContextManager[None]:
        if getattr(self._local, "conn", None) is not None:  # nested logical read: same snapshot
            return _NESTED  # most reads are nested in a command's or a pass's snapshot
        return self._snapshot()

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        # An explicit read transaction on a DBAPI connection: SQLite's held per thread,
        # PostgreSQL's lent for the snapshot by the process's idle connections (most
        # recently used first); a pooled SQLAlchemy checkout plus its BEGIN events cost
        # more than most of these queries.
        conn: Any = None if self._writer is None else self._writer.idle_connection()
        # Inside the writer's deferred batch the reads see its commands; it is already a
        # transaction (never ended here: a ROLLBACK would drop the batch). On PostgreSQL
        # the writer's connection is lent only inside its batch.
        own = conn is not None and (self._pg or conn.in_transaction)
        lent: Any = None  # PostgreSQL: the connection this snapshot took (given back after)
        if conn is None and self.db.idle is not None:
            with self.db.translating("connecting to read"):
                lent = self.db.idle.take()
            conn = lent.driver_connection
        if conn is None:
            fairy: Any = getattr(self._local, "fairy", None)
            if fairy is None:
                with self.db.translating("connecting to read"):
                    fairy = self.db.reader.raw_connection()
                self._local.fairy = fairy
                with self._lock:
                    self._fairies.append(fairy)
            conn = fairy.driver_connection
        broken = False
        try:
            if not self._pg and not own:
                conn.execute("BEGIN")  # deferred: a WAL snapshot from the first read
            # The cursor is made by the first query (``_cursor``): most commands read
            # nothing their line does not hold already.
            self._local.conn = conn
            self._local.own = own
            yield
        except Exception as exc:
            # Driver errors only (a damaged page, a server gone away); a command's own
            # errors pass through unchanged.
            translated = self.db.translate(exc, "reading")
            if translated is exc:
                raise
            broken = isinstance(translated, StorageUnavailableError) and not own
            raise translated from exc
        finally:
            cur = getattr(self._local, "cur", None)
            self._local.cur = self._local.conn = None
            self._local.own = False
            try:
                if self._pg and own:
                    # A failed statement aborted the batch on the server. (IDLE is not a
                    # failure: a flush committed the batch while an async builder awaited
                    # inside this snapshot, e.g. a drive ending; the reads after it saw
                    # the same rows, as only this writer writes the session.)
                    if conn.info.transaction_status in _PG_BROKEN and self._writer is not None:
                        self._writer.batch_aborted(RuntimeError("a read failed inside it"))
                elif self._pg:
                    status = conn.info.transaction_status
                    if status != 0:  # a query opened the transaction
                        conn.rollback()
                        if status in _PG_BROKEN:  # a failed string: its PREPAREs unknown
                            _forget_prepared(conn)
                elif not own and conn.in_transaction:
                    conn.execute("ROLLBACK")
            except Exception:
                if not broken:
                    raise
            finally:
                if cur is not None:
                    cur.close()
                if lent is not None:
                    # The read transaction is opened explicitly, in one round trip with
                    # its first query (``_rows``), and ended above: the connection is
                    # idle again (a broken one is dropped, not lent again).
                    if broken:
                        lent.invalidate()
                    else:
                        self.db.idle.give(lent)  # type: ignore[union-attr]
            if broken and lent is None:
                self._drop_connection()  # the next read connects afresh

    def _drop_connection(self) -> None:
        fairy: Any = getattr(self._local, "fairy", None)
        if fairy is None:
            return
        self._local.fairy = None
        with self._lock:
            if fairy in self._fairies:
                self._fairies.remove(fairy)
        fairy.invalidate()

    def close(self) -> None:
        with self._lock:
            fairies, self._fairies = self._fairies, []
        for fairy in fairies:
            try:
                fairy.close()
            except Exception:
                fairy.invalidate()

    def _rows(self, statement: str, params: Sequence[Any]) -> list[Any]:
        cur: Any = getattr(self._local, "cur", None)
        if cur is None:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                raise RuntimeError("SqlReadStore primitives run inside read()")
            cur = self._local.cur = self._client_cursor(conn) if self._pg else conn.cursor()
        if not self._pg:
            cur.execute(statement, tuple(params))
            rows: list[Any] = cur.fetchall()
            return rows
        # PostgreSQL: one simple-query string, as the writer's (``_ClientBatch``): the
        # statement prepared once per connection and sent as EXECUTE with client-made
        # literals; the read's first query carries the BEGIN of its snapshot (taken by
        # the query). (Never on the writer's connection, own: a batch flushed under a
        # snapshot leaves it IDLE, and a BEGIN there would open a transaction the next
        # write transaction runs into.)
        conn = cur.connection
        parts: list[str] = []
        if conn.info.transaction_status == 0 and not getattr(self._local, "own", False):
            parts.append(self._begin)
        parts.append(
            _executed(
                _PREPARED.setdefault(conn, {}),
                parts,
                _psycopg_style(statement),
                params,
                lambda: cur,
                limit=_READ_PREPARED,
            )
        )
        rows = _run_string(cur, parts).fetchall()
        return rows

    @staticmethod
    def _client_cursor(conn: Any) -> Any:
        from psycopg import ClientCursor  # loaded already: conn is psycopg's

        return ClientCursor(conn)

    def _one(self, statement: str, params: Sequence[Any]) -> Any:
        rows = self._rows(statement, params)
        return rows[0] if rows else None

    @staticmethod
    def _marks(n: int) -> str:
        return ", ".join("?" * n)

    def _id_page(
        self,
        head: str,
        where: list[str],
        params: list[Any],
        filters: Sequence[tuple[str, Any]],
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[Any]:
        """One page in id order of ``head`` for this session: the fixed ``where`` clauses,
        each filter whose value is not None, the open id window; filters before the limit."""
        clauses, values = ["session_id = ?", *where], [self.sid, *params]
        for clause, value in (*filters, ("id > ?", gt), ("id < ?", lt)):
            if value is not None:
                clauses.append(clause)
                values.append(value)
        direction = "ASC" if order == "asc" else "DESC"
        return self._rows(
            f"{head} WHERE {' AND '.join(clauses)} ORDER BY id {direction} LIMIT ?",
            (*values, limit),
        )

    _CHUNK = 500  # ids per IN list: below every backend's bound-parameter limit

    def _rows_in(self, head: str, column: str, ids: Sequence[int], tail: str = "") -> list[Any]:
        """``head WHERE session_id = ? AND column IN (ids) tail`` for the distinct ids, in
        ascending chunks: one statement per 500 ids, never one per id."""
        unique = sorted(set(ids))
        rows: list[Any] = []
        for k in range(0, len(unique), self._CHUNK):
            chunk = unique[k : k + self._CHUNK]
            rows += self._rows(
                f"{head} WHERE session_id = ? AND {column} IN ({self._marks(len(chunk))}) {tail}",
                (self.sid, *chunk),
            )
        return rows

    def meta(self) -> SessionMeta | None:
        row = self._one(
            "SELECT head, main_head, root_id, owner FROM pico_sessions WHERE session_id = ?",
            (self.sid,),
        )
        return None if row is None else SessionMeta(self.sid, row[0], row[1], row[2], row[3])

    def is_main_boundary(self, position: int) -> bool:
        row = self._one(
            "SELECT scope FROM pico_commits WHERE session_id = ? AND last = ?", (self.sid, position)
        )
        return row is not None and row[0] == "main"

    _CONV = (
        "SELECT id, created_seq, source_conversation_id, source_as_of, inherit_state, "
        "owner_task_id, prefix_revision, deleted_seq FROM pico_conversations "
    )

    @staticmethod
    def _conv(r: Any) -> ConvRow:
        return ConvRow(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6], r[7])

    def conversation_rows(self, ids: Sequence[int]) -> dict[int, ConvRow]:
        return {r[0]: self._conv(r) for r in self._rows_in(self._CONV, "id", ids)}

    def context_tail(
        self, conversation_id: int, after_position: int | None
    ) -> tuple[int, list[tuple[int, int]]] | None:
        row = self._one(
            "SELECT prefix_revision FROM pico_conversations WHERE session_id = ? AND id = ?",
            (self.sid, conversation_id),
        )
        if row is None:
            return None
        if after_position is None:
            rows = self._rows(
                "SELECT position, entry_id FROM pico_context_elements WHERE "
                "session_id = ? AND conversation_id = ? ORDER BY position",
                (self.sid, conversation_id),
            )
        else:
            rows = self._rows(
                "SELECT position, entry_id FROM pico_context_elements WHERE "
                "session_id = ? AND conversation_id = ? AND position > ? "
                "ORDER BY position",
                (self.sid, conversation_id, after_position),
            )
        return int(row[0]), [(int(p), int(e)) for p, e in rows]

    def current_contexts(self, ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {i: [] for i in ids}
        for cid, eid in self._rows_in(
            "SELECT conversation_id, entry_id FROM pico_context_elements",
            "conversation_id",
            ids,
            "ORDER BY conversation_id, position",
        ):
            out[cid].append(eid)
        return {k: tuple(v) for k, v in out.items()}

    def scan_conversation_rows(
        self,
        *,
        source: int | None,
        owner: int | None,
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[ConvRow]:
        filters = (("source_conversation_id = ?", source), ("owner_task_id = ?", owner))
        rows = self._id_page(self._CONV, [], [], filters, gt, lt, order, limit)
        return [self._conv(r) for r in rows]

    def _entry_cols(self, content: bool) -> str:
        cols = "id, conversation_id, kind, key, metadata, by_task_id, commit_end"
        return cols + (", content" if content else "")

    @staticmethod
    def _entry(r: Any, content: bool) -> EntryRow:
        return EntryRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7] if content else None)

    def entry_rows(self, ids: Sequence[int], *, content: bool) -> dict[int, EntryRow]:
        head = f"SELECT {self._entry_cols(content)} FROM pico_entries"
        return {r[0]: self._entry(r, content) for r in self._rows_in(head, "id", ids)}

    def entry_range(
        self,
        conversation_id: int,
        *,
        gt: int | None,
        le: int | None,
        order: Order,
        limit: int,
        kind: str | None,
        key: str | None,
        content: bool,
    ) -> list[EntryRow]:
        where = ["session_id = ?", "conversation_id = ?"]
        params: list[Any] = [self.sid, conversation_id]
        for clause, value in (
            ("kind = ?", kind),
            ("key = ?", key),
            ("id > ?", gt),
            ("id <= ?", le),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        direction = "ASC" if order == "asc" else "DESC"
        rows = self._rows(
            f"SELECT {self._entry_cols(content)} FROM pico_entries WHERE "
            f"{' AND '.join(where)} ORDER BY id {direction} LIMIT ?",
            (*params, limit),
        )
        return [self._entry(r, content) for r in rows]

    _EDIT = "SELECT conversation_id, seq, op, ids, removed, revision FROM pico_context_edits "

    @staticmethod
    def _edit(r: Any) -> EditRow:
        return EditRow(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], r[5])

    def last_base_edit(self, conversation_id: int, position: int) -> EditRow | None:
        row = self._one(
            self._EDIT + "WHERE session_id = ? AND conversation_id = ? AND "
            "base = ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
            (self.sid, conversation_id, True, position),
        )
        return None if row is None else self._edit(row)

    def edits_between(self, conversation_id: int, gt: int, le: int) -> list[EditRow]:
        rows = self._rows(
            self._EDIT + "WHERE session_id = ? AND conversation_id = ? AND "
            "seq > ? AND seq <= ? ORDER BY seq",
            (self.sid, conversation_id, gt, le),
        )
        return [self._edit(r) for r in rows]

    def revision_as_of(self, conversation_id: int, position: int) -> int:
        row = self._one(
            "SELECT revision FROM pico_context_edits WHERE session_id = ? AND "
            "conversation_id = ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
            (self.sid, conversation_id, position),
        )
        return 0 if row is None else int(row[0])

    # ------------------------------------------------------------------ state reads
    def address_policy(self, scope_kind: str, kind: str, namespace: str, key: str) -> bool | None:
        row = self._one(
            "SELECT rewind FROM pico_addresses WHERE session_id = ? AND "
            "scope_kind = ? AND kind = ? AND namespace = ? AND key = ?",
            (self.sid, scope_kind, kind, namespace, key),
        )
        return None if row is None else bool(row[0])

    def current_value(self, scope: str, namespace: str, key: str) -> tuple[int, str] | None:
        row = self._one(
            "SELECT seq, value FROM pico_values WHERE session_id = ? AND "
            "scope = ? AND namespace = ? AND key = ?",
            (self.sid, scope, namespace, key),
        )
        return None if row is None else (int(row[0]), str(row[1]))

    def conversation_chain(self, conversation_id: int) -> list[ConvRow]:
        """The conversation and its historical sources, nearest first, in one query."""
        rows = self._rows(
            "WITH RECURSIVE chain(id, depth) AS ("
            " SELECT CAST(? AS BIGINT), 0"
            " UNION ALL"
            " SELECT c.source_conversation_id, chain.depth + 1 FROM pico_conversations c"
            " JOIN chain ON c.id = chain.id"
            " WHERE c.session_id = ? AND c.source_conversation_id IS NOT NULL)"
            " SELECT p.id, p.created_seq, p.source_conversation_id, p.source_as_of,"
            " p.inherit_state, p.owner_task_id, p.prefix_revision, p.deleted_seq"
            " FROM chain JOIN pico_conversations p ON p.session_id = ? AND p.id = chain.id"
            " ORDER BY chain.depth",
            (conversation_id, self.sid, self.sid),
        )
        return [self._conv(r) for r in rows]

    def value_versions(
        self, levels: Sequence[tuple[int, int]], namespace: str, key: str
    ) -> list[tuple[int, str | None] | None]:
        """The newest version at or before each level's cutoff: one round trip, one
        indexed ``ORDER BY seq DESC LIMIT 1`` per level."""
        parts, params = [], []
        for i, (conversation, cutoff) in enumerate(levels):
            parts.append(
                f"SELECT * FROM (SELECT {i} AS level, seq, value FROM "
                "pico_value_versions WHERE session_id = ? AND conversation_id = ? AND "
                "namespace = ? AND key = ? AND seq <= ? ORDER BY seq DESC LIMIT 1) "
                f"AS l{i}"
            )
            params.extend([self.sid, conversation, namespace, key, cutoff])
        out: list[tuple[int, str | None] | None] = [None] * len(levels)
        for level, seq, value in self._rows(" UNION ALL ".join(parts), params):
            out[int(level)] = (int(seq), value)
        return out

    def last_clears(
        self, levels: Sequence[tuple[str, int]], namespace: str, key: str
    ) -> list[int | None]:
        parts, params = [], []
        for i, (scope, cutoff) in enumerate(levels):
            parts.append(
                f"SELECT * FROM (SELECT {i} AS level, seq FROM pico_list_clears "
                "WHERE session_id = ? AND scope = ? AND namespace = ? AND key = ? AND "
                f"seq <= ? ORDER BY seq DESC LIMIT 1) AS c{i}"
            )
            params.extend([self.sid, scope, namespace, key, cutoff])
        out: list[int | None] = [None] * len(levels)
        for level, seq in self._rows(" UNION ALL ".join(parts), params):
            out[int(level)] = int(seq)
        return out

    def list_ranges(
        self,
        segments: Sequence[tuple[str, int | None, int]],
        namespace: str,
        key: str,
        *,
        order: Order,
        limit: int,
    ) -> list[tuple[int, str]]:
        """Elements of disjoint id ranges of several scopes, one page: each segment reads
        at most ``limit`` rows through the primary key, whatever the list's length."""
        direction = "ASC" if order == "asc" else "DESC"
        parts, params = [], []
        for i, (scope, lower, upper) in enumerate(segments):
            parts.append(
                f"SELECT * FROM (SELECT id, value FROM pico_list_elements WHERE "
                "session_id = ? AND scope = ? AND namespace = ? AND key = ? AND "
                f"id > ? AND id <= ? ORDER BY id {direction} LIMIT ?) AS s{i}"
            )
            params.extend([self.sid, scope, namespace, key, lower or 0, upper, limit])
        rows = self._rows(
            f"SELECT id, value FROM ({' UNION ALL '.join(parts)}) AS u "
            f"ORDER BY id {direction} LIMIT ?",
            (*params, limit),
        )
        return [(int(r[0]), str(r[1])) for r in rows]

    def scan_values(
        self, scope: str, *, namespace: str | None, after: tuple[str, str] | None, limit: int
    ) -> list[tuple[str, str, int, str]]:
        where = ["session_id = ?", "scope = ?"]
        params: list[Any] = [self.sid, scope]
        if namespace is not None:
            where.append("namespace = ?")
            params.append(namespace)
        if after is not None:
            # A row-value comparison seeks the key index to the cursor; the equivalent OR
            # form made SQLite walk the scope from its first value on every page.
            where.append("(namespace, key) > (?, ?)")
            params.extend(after)
        rows = self._rows(
            f"SELECT namespace, key, seq, value FROM pico_values WHERE "
            f"{' AND '.join(where)} ORDER BY namespace, key LIMIT ?",
            (*params, limit),
        )
        return [(str(r[0]), str(r[1]), int(r[2]), str(r[3])) for r in rows]

    # ------------------------------------------------------------------ task reads
    _TASK = (
        "SELECT id, conversation_id, kind, status, role, state, after, foreground, "
        "spawned_by, owned_conversation_id, not_before, required_permit, abort_requested, "
        "updated_seq FROM pico_tasks "
    )

    _TASK_LIVE = _TASK + "INDEXED BY pico_tasks_live "
    _TASK_LIVE_BY_CONVERSATION = _TASK + "INDEXED BY pico_tasks_live_conversation "

    @staticmethod
    def _task(r: Any) -> TaskRow:
        return TaskRow(
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            () if r[6] == "[]" else tuple(json.loads(r[6])),  # most tasks depend on none
            bool(r[7]),
            r[8],
            r[9],
            r[10],
            r[11],
            bool(r[12]),
            r[13],
        )

    def task_rows(self, ids: Sequence[int]) -> dict[int, TaskRow]:
        return {r[0]: self._task(r) for r in self._rows_in(self._TASK, "id", ids)}

    def scan_task_rows(
        self,
        *,
        conversation_ids: Sequence[int] | None,
        live: bool | None,
        role: str | None,
        kind: str | None,
        foreground: bool | None,
        abort_requested: bool | None,
        gt: int | None,
        lt: int | None,
        order: Order,
        limit: int,
    ) -> list[TaskRow]:
        where: list[str] = []
        params: list[Any] = []
        if conversation_ids is not None:
            if not conversation_ids:
                return []
            where.append(f"conversation_id IN ({self._marks(len(conversation_ids))})")
            params.extend(conversation_ids)
        head = self._TASK
        if live is True:
            where.append("role <> 'terminal'")  # the partial index's predicate
            if not self._pg:
                # Without statistics SQLite rates the full (conversation, id) index as good
                # as the partial one and would walk a conversation's whole task history.
                head = self._TASK_LIVE_BY_CONVERSATION if conversation_ids else self._TASK_LIVE
        elif live is False:
            where.append("role = 'terminal'")
        filters = (
            ("role = ?", role),
            ("kind = ?", kind),
            ("foreground = ?", foreground),
            ("abort_requested = ?", abort_requested),
        )
        rows = self._id_page(head, where, params, filters, gt, lt, order, limit)
        return [self._task(r) for r in rows]

    def owned_conversations(self, conversation_id: int) -> list[int]:
        rows = self._rows(
            "SELECT owned_conversation_id FROM pico_tasks WHERE session_id = ? "
            "AND conversation_id = ? AND owned_conversation_id IS NOT NULL "
            "ORDER BY id",
            (self.sid, conversation_id),
        )
        return [int(r[0]) for r in rows]


def _body(value: Any) -> bytes:
    """A stored body as bytes. A body rewritten behind pico's back as SQLite TEXT (e.g. by
    ``replace()``) reads as its UTF-8 bytes, so decoding and the hash chain report it
    instead of the driver's type error escaping."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
