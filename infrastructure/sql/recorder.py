"""The event recorder and the projection writer (SQLite and PostgreSQL).

``SqlRecorder.insert_events`` writes the stored events AND their projected read-model rows
in ONE transaction on the session's writer, so no reader ever sees half a commit and no
read lags a returned command; ``SqlProjectionWriter`` turns row ops into those statements.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

import sqlalchemy as sa
from eventsourcing.persistence import AggregateRecorder, StoredEvent

from pico.domain.ids import stream_hex
from pico.infrastructure.sql import bodies
from pico.infrastructure.sql import schema as t
from pico.infrastructure.sql.bodies import (
    ENTRY_CONTENT,
    ENTRY_METADATA,
    TASK_STATE,
    encode_text,
)
from pico.infrastructure.sql.notify import (
    CommitListener,
    channel_for,
    conninfo,
)
from pico.infrastructure.sql.writer import RawWriter
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

if TYPE_CHECKING:
    from pico.infrastructure.sql.store import SqlDatabase


log = logging.getLogger("pico.storage")


class SqlRecorder(AggregateRecorder):
    """An eventsourcing recorder whose inserts also apply read-model row ops.

    The write path is fixed-shape and hot, so it runs precompiled statements on one held
    DBAPI connection (the session has one writer); reads use SQLAlchemy Core.
    """

    def __init__(
        self, db: SqlDatabase, *, table: sa.Table = t.events, writer: RawWriter | None = None
    ) -> None:
        self.db = db
        self.table = table
        self.is_events = table is t.events
        #: ``writer``: another recorder's, shared (SQLite's snapshots write on the events'
        #: connection: see container.py).
        self._writer = db.raw_writer() if writer is None else writer
        #: PostgreSQL: every event batch ends its transaction with a NOTIFY on the
        #: session's channel (LISTEN/NOTIFY watch wakeups); False only to measure its cost.
        self.notify_commits = db.dialect == "postgresql" and self.is_events
        self._channels: dict[str, str] = {}
        self._listeners: list[CommitListener] = []
        #: The last context position of each conversation this writer has written or read,
        #: as of its last committed transaction (None: an empty context): the owner is the
        #: session's only writer, so an append needs no read of it (``_LAST_POSITION``).
        self._lasts: dict[tuple[str, int], int | None] = {}
        #: PostgreSQL: stream ids (hex) and sessions (``_SESSION_KEY`` + id) known to be
        #: rows of ``pico_streams`` and ``pico_session_numbers`` (committed), and topics
        #: known to be rows of ``pico_topics`` (numbered before the batch, committed: a few
        #: dozen, never forgotten); in ``_unconfirmed``, the streams and sessions this
        #: writer added in a batch not known to be committed yet (``_confirm``). A batch
        #: adds the rows its events lack.
        self._known: set[str] = set()
        self._topics: set[str] = set()
        self._unconfirmed: set[str] = set()
        #: SQLite: the numbers of the session, stream and topic rows this writer has read
        #: or added (keys as in ``_known``; topics under ``_TOPIC_KEY``), as its connection
        #: sees them: committed, or added in the open batch. An event row names them as
        #: literals (``_insert_numbered``) instead of by three index probes. Cleared by
        #: anything that may have rolled back a row it numbered (a failed transaction or
        #: flush, an abandoned batch, a claim): a number is learnt again by one probe.
        #: None on PostgreSQL, whose statements go to the server in one string a
        #: transaction (a number read back would cost a round trip).
        self._numbers: dict[str, int] | None = (
            {} if db.dialect == "sqlite" and self.is_events else None
        )

    def busy(self) -> bool:
        """Whether this recorder's writer has a transaction open (``RawWriter.busy``): the
        snapshot recorder shares the events' writer on SQLite, so a snapshot a load owes
        waits for the next save (storage.py ``load``)."""
        return self._writer.busy()

    @property
    def writer(self) -> RawWriter:
        return self._writer

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        session_id: str = kwargs.get("session_id", "")
        ops: Sequence[RowOp] = kwargs.get("ops", ())
        defer = bool(kwargs.get("defer"))
        if self._numbers is not None:
            self._insert_numbered(stored_events, session_id, ops, defer)
            return None
        # PostgreSQL's events, and either dialect's snapshots.
        new_streams: list[tuple[str]] = []
        new_session: list[tuple[str]] = []
        if self.is_events:
            sql = self._writer.sql(_INSERT_EVENT)
            encode = bodies.encode  # compressed with the topic's dictionary (bodies.py)
            rows: list[tuple[Any, ...]] = []
            known = self._known
            # Joining an open deferred batch: what its earlier commands numbered is in it
            # (a failure rolls them back with the batch and clears ``_unconfirmed``).
            added = self._unconfirmed if self._writer.pending else _NONE
            new_topics: list[str] = []
            session_key = _SESSION_KEY + session_id
            if stored_events and session_key not in known and session_key not in added:
                new_session.append((session_id,))
            for e in stored_events:
                oid = stream_hex(e.originator_id)
                topic = e.topic
                if oid not in known and oid not in added and (oid,) not in new_streams:
                    new_streams.append((oid,))
                if topic not in self._topics and topic not in new_topics:
                    new_topics.append(topic)
                rows.append((session_id, oid, e.originator_version, topic, encode(topic, e.state)))
            if new_topics:
                self._number_topics(new_topics)
        else:
            sql = self._writer.sql(_INSERT_SNAPSHOT)
            rows = [
                (stream_hex(e.originator_id), e.originator_version, e.topic, e.state)
                for e in stored_events
            ]

        def write(cur: Any) -> None:
            # Idempotent (a stale writer's duplicate first event: its event row then
            # conflicts, as before the numbering).
            if new_session:
                cur.executemany(self._writer.sql(_ADD_SESSION[self.db.dialect]), new_session)
            if new_streams:
                cur.executemany(self._writer.sql(_ADD_STREAM[self.db.dialect]), new_streams)
            if rows:
                cur.executemany(sql, rows)
            if not self.is_events:
                # Only the newest snapshot is ever read: older ones would grow storage with
                # every snapshot interval (a context can be long), so replace them.
                cur.executemany(self._writer.sql(_PRUNE_SNAPSHOTS), [(r[0], r[1]) for r in rows])

        self._transaction(session_id, ops, defer, write, notify=self.notify_commits and bool(rows))
        self._unconfirmed.update(o for (o,) in new_streams)
        self._unconfirmed.update(_SESSION_KEY + n for (n,) in new_session)
        if not defer:
            self._confirm()
        return None

    def _transaction(
        self,
        session_id: str,
        ops: Sequence[RowOp],
        defer: bool,
        rows: Callable[[Any], None],
        *,
        notify: bool = False,
    ) -> None:
        """One write transaction (or a command joining the open batch): ``rows(cur)`` (the
        batch's event or snapshot rows), then its read-model row ops, then (PostgreSQL) the
        commit's NOTIFY. A failure forgets what this writer knew of the database."""
        channel = self._channel(session_id) if notify else None
        projection = SqlProjectionWriter(
            None, self._writer.sql, session_id, self.db.dialect, lasts=self._lasts
        )

        def write(cur: Any) -> None:
            rows(cur)
            if ops:
                projection.apply(ops, cur)
            if channel is not None:
                # Last, in the same transaction: delivered at COMMIT, dropped by a rollback.
                cur.execute(self.db.notify_statement, (channel,))

        try:
            self._writer.transaction(write, defer=defer)
        except BaseException:
            # What the failed transaction read or wrote is not the database's: forget all
            # (a rolled-back deferred batch took earlier commands' rows with it).
            self._lasts.clear()
            self._unconfirmed.clear()
            self._forget_numbers()
            raise
        projection.settle()

    def _insert_numbered(
        self,
        stored_events: Sequence[StoredEvent],
        session_id: str,
        ops: Sequence[RowOp],
        defer: bool,
    ) -> None:
        """SQLite: the batch's event rows with their session, stream and topic numbers
        written as literals, each number looked up once by this writer (``_numbers``); a
        row it has not numbered yet is added (idempotently, as on PostgreSQL) in the same
        transaction, ahead of the event rows. Three index probes a row fewer than
        ``_INSERT_EVENT``'s subqueries (~2-3 us a row measured alone)."""
        numbers = self._numbers
        assert numbers is not None
        encode = bodies.encode  # compressed with the topic's dictionary (bodies.py)
        events = [
            (stream_hex(e.originator_id), e.originator_version, e.topic, encode(e.topic, e.state))
            for e in stored_events
        ]

        def write(cur: Any) -> None:
            def number(key: str, add: str, find: str, value: str) -> int:
                # Added if missing (INSERT OR IGNORE: another writer may have added it),
                # then read back unless this insert made it.
                cur.execute(add, (value,))
                if cur.rowcount == 1:
                    found = int(cur.lastrowid)
                else:
                    cur.execute(find, (value,))
                    found = int(cur.fetchone()[0])
                numbers[key] = found
                return found

            if not events:
                return
            key = _SESSION_KEY + session_id
            session = numbers.get(key) or number(
                key, _ADD_SESSION["sqlite"], _FIND_SESSION, session_id
            )
            rows: list[tuple[Any, ...]] = []
            for oid, version, topic, state in events:
                stream = numbers.get(oid) or number(oid, _ADD_STREAM["sqlite"], _FIND_STREAM, oid)
                key = _TOPIC_KEY + topic
                topic_no = numbers.get(key) or number(key, _ADD_TOPIC, _FIND_TOPIC, topic)
                rows.append((session, stream, version, topic_no, state))
            cur.executemany(_INSERT_NUMBERED_EVENT, rows)

        self._transaction(session_id, ops, defer, write)
        if len(numbers) > _KNOWN_LIMIT:
            numbers.clear()  # bounded: a number forgotten is one probe to learn again

    def _forget_numbers(self) -> None:
        if self._numbers is not None:
            self._numbers.clear()

    def _number_topics(self, topics: list[str]) -> None:
        """PostgreSQL: number new topics in a short transaction of their own, committed
        before the batch. A topic row is shared by every session: inserted inside a
        deferred batch it would hold its key until that batch commits, and another
        session's first event of the topic would wait for it (on this process's own
        thread: until the server ended the batch), or two batches would deadlock. A
        topic row is never deleted, so it is known from then on. (Session and stream
        rows are the session's own, under its write lock: they stay in the batch.)"""
        idle = self.db.idle
        assert idle is not None  # every PostgreSQL database has its idle connections
        # One of the process's idle connections, given back warm (as the writer's own).
        with self.db.translating("numbering event types"):
            lent = idle.take()
            try:
                conn = lent.driver_connection
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(_ADD_TOPIC_PG, [(topic,) for topic in topics])
            finally:
                idle.give(lent)
        self._topics.update(topics)

    def _confirm(self) -> None:
        """PostgreSQL: everything this writer wrote is committed: the sessions and streams
        it numbered are rows for good (none is ever deleted), so later batches need not add them.
        Until then (a deferred batch may yet roll back) each batch adds them again,
        idempotently. Bounded: past ``_KNOWN_LIMIT`` the writer starts over, and a stream
        it no longer knows costs one idempotent insert."""
        if self._unconfirmed:
            if len(self._known) + len(self._unconfirmed) > _KNOWN_LIMIT:
                self._known.clear()
            self._known.update(self._unconfirmed)
            self._unconfirmed.clear()

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
        if self.is_events:
            c_version = t.events.c.originator_version
            q = (
                sa.select(*t.event_columns)
                .select_from(t.event_log)
                .where(t.streams.c.originator_id == stream_hex(originator_id))
            )
        else:
            s = self.table.c
            c_version = s.originator_version
            q = sa.select(s.originator_id, c_version, s.topic, s.state).where(
                s.originator_id == stream_hex(originator_id)
            )
        if gt is not None:
            q = q.where(c_version > gt)
        if lte is not None:
            q = q.where(c_version <= lte)
        q = q.order_by(c_version.desc() if desc else c_version)
        if limit is not None:
            q = q.limit(limit)
        if self._writer.pending:  # the loader must see every command this session ran
            self._writer.flush()
        with (
            self.db.translating(f"reading the events of stream {stream_hex(originator_id)}"),
            self.db.loader.connect() as conn,
        ):
            if self.is_events:
                return [event_from_row(r)[1] for r in conn.execute(q)]
            return [StoredEvent(UUID(r[0]), r[1], r[2], _body(r[3])) for r in conn.execute(q)]

    def select_session_events(
        self, session_id: str, *, after: int, limit: int
    ) -> list[tuple[int, StoredEvent]]:
        c = t.events.c
        q = (
            sa.select(*t.event_columns)
            .select_from(t.event_log)
            .where(t.of_session(session_id), c.id > after)
            .order_by(c.id)
            .limit(limit)
        )
        if self._writer.pending:
            self._writer.flush()
        doing = f"reading the events of session {session_id!r} after position {after}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return [event_from_row(r) for r in conn.execute(q)]

    def last_session_position(self, session_id: str) -> int:
        """The position of the session's newest stored event (0: none): one index seek."""
        c = t.events.c
        q = sa.select(sa.func.max(c.id)).where(t.of_session(session_id))
        if self._writer.pending:
            self._writer.flush()
        doing = f"reading the newest event position of session {session_id!r}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return int(conn.execute(q).scalar_one() or 0)

    def count_session_events(self, session_id: str, *, after: int) -> int:
        c = t.events.c
        q = sa.select(sa.func.count()).where(t.of_session(session_id), c.id > after)
        if self._writer.pending:
            self._writer.flush()
        doing = f"counting the events of session {session_id!r} after position {after}"
        with self.db.translating(doing), self.db.loader.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def flush(self) -> None:
        try:
            self._writer.flush()
        except BaseException:
            self._unconfirmed.clear()
            self._forget_numbers()
            raise
        self._confirm()

    def abandon(self, reason: str) -> None:
        self._forget_numbers()
        self._writer.abandon(reason)

    def exclusive(self, session_id: str) -> Any:
        # A claim: another owner may have written since this one last did.
        self._lasts.clear()
        self._forget_numbers()
        return self._writer.exclusive(session_id)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        self._writer.close()


# The stream and the topic by number (schema.event_log): each a unique-index probe of a
# small, hot table, in the statement, so a command needs no round trip to learn them.
_INSERT_EVENT = (
    "INSERT INTO pico_events (session_number, stream_id, originator_version, topic_id, state) "
    "VALUES ((SELECT id FROM pico_session_numbers WHERE session_id = ?), "
    "(SELECT id FROM pico_streams WHERE originator_id = ?), ?, "
    "(SELECT id FROM pico_topics WHERE topic = ?), ?)"
)
#: SQLite (``SqlRecorder._insert_numbered``): the numbers as literals.
_INSERT_NUMBERED_EVENT = (
    "INSERT INTO pico_events (session_number, stream_id, originator_version, topic_id, state) "
    "VALUES (?, ?, ?, ?, ?)"
)
_FIND_SESSION = "SELECT id FROM pico_session_numbers WHERE session_id = ?"
_FIND_STREAM = "SELECT id FROM pico_streams WHERE originator_id = ?"
_FIND_TOPIC = "SELECT id FROM pico_topics WHERE topic = ?"
_NONE: frozenset[str] = frozenset()
#: A session's key among the writer's known numbers (no stream id or topic starts so).
_SESSION_KEY = "\x00session "
#: A topic's key among ``SqlRecorder._numbers`` (a stream id is 32 hex digits).
_TOPIC_KEY = "\x00topic "
_ADD_SESSION = {
    "sqlite": "INSERT OR IGNORE INTO pico_session_numbers (session_id) VALUES (?)",
    "postgresql": (
        "INSERT INTO pico_session_numbers (session_id) VALUES (?) ON CONFLICT DO NOTHING"
    ),
}
#: How many stream ids and topics a writer remembers as numbered (``_confirm``).
_KNOWN_LIMIT = 4096
_ADD_STREAM = {
    "sqlite": "INSERT OR IGNORE INTO pico_streams (originator_id) VALUES (?)",
    "postgresql": ("INSERT INTO pico_streams (originator_id) VALUES (?) ON CONFLICT DO NOTHING"),
}
_ADD_TOPIC_PG = "INSERT INTO pico_topics (topic) VALUES (%s) ON CONFLICT DO NOTHING"
_ADD_TOPIC = "INSERT OR IGNORE INTO pico_topics (topic) VALUES (?)"  # SQLite
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
        # SQLite's statements are ours as written: ``str`` hands each back unchanged, a C
        # call (not the writer's ``sql``, a Python call a statement).
        self.q: Callable[[str], str] = str if dialect == "sqlite" else sql
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
        # Each row op's statement: on SQLite run at once (one call; its driver gains nothing
        # from batching a few rows), on PostgreSQL buffered as above.
        self._x: Callable[[str, tuple[Any, ...]], None] = (
            self._execute if dialect == "sqlite" else self._buffer
        )

    def _execute(self, statement: str, params: tuple[Any, ...]) -> None:
        self.cur.execute(statement, params)

    def _buffer(self, statement: str, params: tuple[Any, ...]) -> None:
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
                after = _int_list(op.after)
                self._x(
                    _PATCH_TASK,
                    (
                        op.status,
                        op.role,
                        None if op.state is None else encode_text(TASK_STATE, op.state),
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
                        encode_text(TASK_STATE, op.state),
                        _int_list(op.after),
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
                        encode_text(ENTRY_CONTENT, op.content),
                        None if op.metadata is None else encode_text(ENTRY_METADATA, op.metadata),
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
            _int_list(ids),
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


def _int_list(values: Sequence[int]) -> str:
    """``json.dumps(list(values))``, the same text, without the encoder's machinery for a
    list of ints: a task's dependencies (most often none) and a context edit's ids, each
    row op of a turn has one."""
    if not values:
        return "[]"
    if len(values) == 1 and type(values[0]) is int:  # most context edits: one entry
        return f"[{values[0]}]"
    if all(type(v) is int for v in values):
        return "[" + ", ".join(map(str, values)) + "]"
    return json.dumps(list(values))


#: What an event row whose stream number names no ``pico_streams`` row reads as: the nil
#: stream, which no aggregate has, so the load or check that meets it reports it.
MISSING_STREAM = UUID(int=0)


def event_from_row(row: Any) -> tuple[int, StoredEvent]:
    """An ``event_columns`` row as (position, stored event) with its JSON body. A stream or
    topic number that names no row (a table edited behind pico's back) reads as the nil
    stream or as a topic that says so, which the event codec reports at the position
    (``StorageCorruptError`` on a load; ``pico check``/``verify`` list it)."""
    position, oid, version, topic, state, stream_no, topic_no = row
    if topic is None:
        topic = f"pico:missing-topic#{topic_no}"
    stream = MISSING_STREAM if oid is None else UUID(oid)
    if oid is None:
        log.error("event %d names stream number %s, which pico_streams lacks", position, stream_no)
    return position, StoredEvent(stream, version, topic, _body(state))


def _body(value: Any) -> bytes:
    """A stored body as the JSON bytes the codec above decodes (``bodies.readable``: a
    body that does not decompress, or one rewritten as TEXT, is reported there)."""
    return bodies.readable(value)
