"""SQLite and PostgreSQL: the database (engines, pools, schema on open, error translation).

The session's writer is ``writer.RawWriter``; ``recorder.SqlRecorder.insert_events`` writes
the stored events AND their projected read-model rows in ONE transaction, so no reader ever
sees half a commit and no read lags a returned command; ``reader.SqlReadStore`` runs each
logical read in one read transaction (a consistent snapshot: WAL on SQLite, REPEATABLE READ
on PostgreSQL). Those three names are importable from here too.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from pico.domain.errors import (
    ConfigurationError,
    InvalidArgumentError,
    PicoError,
    StorageCorruptError,
    StorageUnavailableError,
)
from pico.infrastructure.settings import mask_url
from pico.infrastructure.sql import schema as t
from pico.infrastructure.sql.connections import IdleConnections
from pico.infrastructure.sql.notify import (
    NOTIFY_STATEMENT,
    SERIAL_SEQUENCE,
    conninfo,
    notify_statement,
)

# The writer, recorder and reader live in their own modules; these names are imported from
# here by the container and the tools.
from pico.infrastructure.sql.reader import SqlReadStore
from pico.infrastructure.sql.recorder import SqlProjectionWriter, SqlRecorder
from pico.infrastructure.sql.writer import SESSION_LOCK, RawWriter

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger("pico.storage")

__all__ = [
    "SESSION_LOCK",
    "RawWriter",
    "SqlDatabase",
    "SqlProjectionWriter",
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
    if isinstance(orig, psycopg.errors.DataError) and getattr(orig, "sqlstate", None) is None:
        # Raised by psycopg itself, before anything was sent: a value it cannot send (text
        # holding NUL), not damage. The names pico stores are refused before this.
        return InvalidArgumentError(
            f"PostgreSQL at {location} cannot take a value while {doing}: "
            f"{_mask_text(text)}; nothing was sent. Remove the character from the value"
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


def _pg_checkin(engine: Engine) -> None:
    """A writer's connection (``RawWriter.connection``: autocommit, transactions opened
    explicitly) goes back to the pool as SQLAlchemy lent it: not in autocommit, which would
    make every statement of a later ``engine.begin()`` (a schema upgrade) commit alone."""

    @sa_event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, _rec: Any) -> None:
        if dbapi_conn is not None and dbapi_conn.autocommit:
            dbapi_conn.autocommit = False


#: The page size of a SQLite file pico creates (an existing file keeps its own: SQLite
#: changes it only before the first table). A commit writes each page it changed whole
#: into the WAL, and an agent turn's commits change a few rows in many tables and indexes:
#: with 2 KiB pages the same statements, replayed alone, took 12% less (COMMIT 28% less)
#: than with SQLite's default 4 KiB, and the file is no larger (docs/benchmarks.md, eighth
#: pass). 1 KiB saved more but leaves an index entry 231 bytes before it spills to an
#: overflow page (488 at 2 KiB): long session ids and value keys stay inline.
SQLITE_PAGE_SIZE = 2048


def _sqlite_wal(engine: Engine) -> None:
    """Put the file in WAL mode at connect: a persistent change of its header, so only the
    writer does it (registered before ``_sqlite_pragmas``, whose listener then runs second).
    A new, empty file first takes pico's page size: once in WAL mode it could not change."""

    @sa_event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # a no-op on a used file
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
