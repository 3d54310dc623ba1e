"""The read store (SQLite and PostgreSQL): the ``ReadStore`` primitives as indexed SQL.

Reads run in one read transaction per logical query (a consistent snapshot: WAL on SQLite,
REPEATABLE READ on PostgreSQL), on the writer's own connection where it has one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pico.domain.errors import (
    StorageUnavailableError,
)
from pico.domain.values import Order, SessionMeta
from pico.infrastructure.sql.bodies import stored_text
from pico.infrastructure.sql.writer import (
    _PG_BROKEN,
    _PREPARED,
    _READ_PREPARED,
    RawWriter,
    _executed,
    _forget_prepared,
    _psycopg_style,
    _run_string,
)
from pico.projections.queries import ConvRow, EditRow, EntryRow, TaskRow

if TYPE_CHECKING:
    from pico.infrastructure.sql.store import SqlDatabase


log = logging.getLogger("pico.storage")


#: The context of a read inside an open snapshot: it adds nothing (nullcontext is reusable).
_NESTED: AbstractContextManager[None] = nullcontext()

#: A snapshot entered whose first query has not run: it has no connection yet.
_UNOPENED: Any = object()


class _Snapshot(AbstractContextManager[None]):
    """One logical read's snapshot (``SqlReadStore.read``): a class, not a generator
    context manager (a turn enters ~16, and a generator's machinery cost ~0.8 us each).
    On SQLite it is opened by its first query (``_rows``), not on entry: most snapshots (a
    command's, a scheduler pass's) run no query, as their line holds what they read, and
    the connection (this thread's own) is chosen where the deferred BEGIN takes the
    snapshot anyway. On PostgreSQL on entry: a snapshot is lent one of the pool's
    connections, and a pool with none free refuses the command there, before it builds
    anything (later, its save would be uncertain). Driver errors inside it are translated
    (a command's own errors pass through)."""

    __slots__ = ("_store",)

    def __init__(self, store: SqlReadStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        store = self._store
        if store._pg:
            store._open_snapshot()
        else:
            store._local.conn = _UNOPENED

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        store = self._store
        local = store._local
        opened = local.conn is not _UNOPENED
        translated: BaseException | None = None
        broken = False
        try:
            if isinstance(exc, Exception):
                # Driver errors only (a damaged page, a server gone away).
                translated = store.db.translate(exc, "reading")
                if translated is exc:
                    translated = None
                else:
                    broken = (
                        isinstance(translated, StorageUnavailableError) and opened and not local.own
                    )
        finally:
            # Always, even when the translation itself fails (an error whose text does
            # not render): a snapshot left open would pin every later read to it.
            if opened:
                try:
                    store._close_snapshot(local.conn, local.own, local.lent, broken)
                except Exception as ending:  # the server went away since the last read
                    failed = store.db.translate(ending, "ending a read")
                    if failed is ending:
                        raise
                    if translated is None and exc is None:
                        raise failed from ending
            else:
                local.conn = None
        if translated is not None:
            raise translated from exc


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
        return _Snapshot(self)

    def _open_snapshot(self) -> Any:
        """Open the entered snapshot (its first query): its connection, kept with whether
        it is the writer's open transaction (``own``) and the PostgreSQL connection it
        took from the idle ones (``lent``, or None) in this thread's state."""
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
        # The cursor and (SQLite) the BEGIN are made by the first query (``_rows``): most
        # commands and many scheduler passes read nothing their line does not hold
        # already, and a deferred BEGIN takes its WAL snapshot at the first read anyway.
        local = self._local
        local.conn = conn
        local.own = own
        local.lent = lent
        local.began = False
        return conn

    def _close_snapshot(self, conn: Any, own: bool, lent: Any, broken: bool) -> None:
        """Leave a snapshot (``broken``: a driver error made its connection unusable)."""
        local = self._local
        cur = getattr(local, "cur", None)
        began = getattr(local, "began", False)
        local.cur = local.conn = local.lent = None
        local.own = local.began = False
        try:
            if self._pg and own:
                # A failed statement aborted the batch on the server. (IDLE is not a
                # failure: a flush committed the batch while an async builder awaited
                # inside this snapshot, e.g. a drive ending; the reads after it saw the
                # same rows, as only this writer writes the session.)
                if conn.info.transaction_status in _PG_BROKEN and self._writer is not None:
                    self._writer.batch_aborted(RuntimeError("a read failed inside it"))
            elif self._pg:
                status = conn.info.transaction_status
                if status != 0:  # a query opened the transaction
                    conn.rollback()
                    if status in _PG_BROKEN:  # a failed string: its PREPAREs unknown
                        _forget_prepared(conn)
            elif began and conn.in_transaction:
                # Only the read transaction this snapshot began (a write transaction begun
                # meanwhile on the same connection is its writer's to end).
                conn.execute("ROLLBACK")
        except Exception:
            if not broken:
                raise
        finally:
            if cur is not None:
                cur.close()
            if lent is not None:
                # The read transaction is opened explicitly, in one round trip with its
                # first query (``_rows``), and ended above: the connection is idle again
                # (a broken one is dropped, not lent again).
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
            if conn is _UNOPENED:
                conn = self._open_snapshot()
            cur = self._local.cur = self._client_cursor(conn) if self._pg else conn.cursor()
        if not self._pg:
            if not cur.connection.in_transaction and not getattr(self._local, "own", False):
                cur.execute("BEGIN")  # the snapshot's read transaction, from this read on
                self._local.began = True
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
        # Content and metadata deflated (bodies.encode_text).
        return EntryRow(
            r[0],
            r[1],
            r[2],
            r[3],
            None if r[4] is None else stored_text(r[4]),
            r[5],
            r[6],
            stored_text(r[7]) if content else None,
        )

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
            # ``base`` as the partial index's own predicate (a ``base = ?`` would not
            # prove it, so the index could not be used).
            self._EDIT + "WHERE session_id = ? AND conversation_id = ? AND "
            "base AND seq <= ? ORDER BY seq DESC LIMIT 1",
            (self.sid, conversation_id, position),
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
            stored_text(r[5]),  # deflated (bodies.encode_text)
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
