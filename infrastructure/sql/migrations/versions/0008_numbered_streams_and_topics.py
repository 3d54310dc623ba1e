"""Event rows name their session, stream and topic by number; smaller read-model rows.

Revision ID: 0008
Revises: 0007
Create Date: 2027-02-08

An event row held its session's id, its stream's 32-character id and its ~40-character
topic, most of the row, twice over in two indexes, and the stream index keyed on the
random-looking id put each command's events on scattered index pages (each a page write).
Now ``pico_session_numbers``, ``pico_streams`` and ``pico_topics`` number a session, a
stream and a topic at first use; the event row holds the three numbers, the unique index
is on (stream number, version) and the session index on (session number, position).
Bodies and positions are unchanged; ``schema.event_log`` joins the numbers back to what
they name, and ``schema.of_session`` selects a session's events by its number.
``pico_entries_key`` keeps only entries with a key and ``pico_context_edits_base`` only
the base edits (create, reset, replace): the rows their lookups can want.
``pico_tasks.state``, ``pico_entries.content`` and ``.metadata`` become binary: the writer
stores them deflated (``bodies.encode_text``); the rows already there keep their JSON.

The upgrade numbers the existing sessions, streams and topics in the order of their first
event, then rewrites ``pico_events``: on SQLite into a new table (SQLite cannot drop a
column that a unique constraint names), keeping every row's position; on PostgreSQL in
place, so the position sequence carries on. All in SQL: ``pico db sql`` prints it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

# SQLite's rowid alias must be INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "pico_topics",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.Text, nullable=False),
        sa.UniqueConstraint("topic", name="pico_topics_topic"),
    )
    op.create_table(
        "pico_streams",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("originator_id", sa.String(32), nullable=False),
        sa.UniqueConstraint("originator_id", name="pico_streams_originator"),
    )
    op.create_table(
        "pico_session_numbers",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.UniqueConstraint("session_id", name="pico_session_numbers_session"),
    )
    op.execute(
        "INSERT INTO pico_session_numbers (session_id) "
        "SELECT session_id FROM pico_events GROUP BY session_id ORDER BY min(id)"
    )
    op.execute(
        "INSERT INTO pico_topics (topic) "
        "SELECT topic FROM pico_events GROUP BY topic ORDER BY min(id)"
    )
    op.execute(
        "INSERT INTO pico_streams (originator_id) "
        "SELECT originator_id FROM pico_events GROUP BY originator_id ORDER BY min(id)"
    )
    if op.get_context().dialect.name == "sqlite":
        _rebuild_sqlite()
    else:
        _alter_postgresql()
    # The read model's JSON columns become binary (the writer deflates them from now on;
    # the rows already there keep their JSON, as bytes, which every reader takes as it is).
    # pico_entries_key keeps only entries with a key (the rows a lookup by key can want).
    if op.get_context().dialect.name == "sqlite":
        _rebuild_with_binary(_TASKS, ("state",), _TASK_INDEXES)
        _rebuild_with_binary(_ENTRIES, ("content", "metadata"), _ENTRY_INDEXES)
    else:
        for table, column in (
            ("pico_tasks", "state"),
            ("pico_entries", "content"),
            ("pico_entries", "metadata"),
        ):
            op.execute(
                f"ALTER TABLE {table} ALTER COLUMN {column} TYPE BYTEA "
                f"USING convert_to({column}, 'UTF8')"
            )
        op.drop_index("pico_entries_key", table_name="pico_entries")
        name, columns, where = _ENTRY_INDEXES[-1]
        op.create_index(name, "pico_entries", columns, postgresql_where=where)
    # Base context edits only (the appends, most rows, are never looked up by it).
    op.drop_index("pico_context_edits_base", table_name="pico_context_edits")
    op.create_index(
        "pico_context_edits_base",
        "pico_context_edits",
        ["session_id", "conversation_id", "seq"],
        sqlite_where=sa.text("base"),
        postgresql_where=sa.text("base"),
    )


def _rebuild_sqlite() -> None:
    # The new table is created under its own name (renaming one would store its DDL
    # with a quoted name, unlike a fresh database's), so the old one moves aside first.
    op.drop_index("pico_events_session", table_name="pico_events")
    op.rename_table("pico_events", "pico_events_0007")
    op.create_table(
        "pico_events",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("session_number", sa.BigInteger, nullable=False),
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("originator_version", sa.Integer, nullable=False),
        sa.Column("topic_id", sa.BigInteger, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("stream_id", "originator_version", name="pico_events_stream"),
    )
    op.execute(
        "INSERT INTO pico_events (id, session_number, stream_id, originator_version, "
        "topic_id, state) SELECT e.id, n.id, s.id, e.originator_version, p.id, e.state "
        "FROM pico_events_0007 e "
        "JOIN pico_session_numbers n ON n.session_id = e.session_id "
        "JOIN pico_streams s ON s.originator_id = e.originator_id "
        "JOIN pico_topics p ON p.topic = e.topic ORDER BY e.id"
    )
    op.drop_table("pico_events_0007")
    op.create_index("pico_events_session", "pico_events", ["session_number", "id"])


def _alter_postgresql() -> None:
    op.add_column("pico_events", sa.Column("session_number", sa.BigInteger))
    op.add_column("pico_events", sa.Column("stream_id", sa.BigInteger))
    op.add_column("pico_events", sa.Column("topic_id", sa.BigInteger))
    op.execute(
        "UPDATE pico_events e SET session_number = n.id, stream_id = s.id, topic_id = p.id "
        "FROM pico_session_numbers n, pico_streams s, pico_topics p "
        "WHERE n.session_id = e.session_id AND s.originator_id = e.originator_id "
        "AND p.topic = e.topic"
    )
    op.drop_constraint("pico_events_stream", "pico_events", type_="unique")
    op.drop_index("pico_events_session", table_name="pico_events")
    op.drop_column("pico_events", "session_id")
    op.drop_column("pico_events", "originator_id")
    op.drop_column("pico_events", "topic")
    for column in ("session_number", "stream_id", "topic_id"):
        op.alter_column("pico_events", column, nullable=False)
    op.create_unique_constraint(
        "pico_events_stream", "pico_events", ["stream_id", "originator_version"]
    )
    op.create_index("pico_events_session", "pico_events", ["session_number", "id"])


_KEYED = sa.text("key IS NOT NULL")
_LIVE = sa.text("role <> 'terminal'")
_TASKS = (
    "pico_tasks",
    sa.Column("session_id", sa.String(200), primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("conversation_id", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(200), nullable=False),
    sa.Column("status", sa.String(200), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("state", sa.LargeBinary, nullable=False),
    sa.Column("after", sa.Text, nullable=False),
    sa.Column("foreground", sa.Boolean, nullable=False),
    sa.Column("spawned_by", sa.BigInteger),
    sa.Column("owned_conversation_id", sa.BigInteger),
    sa.Column("not_before", sa.Float),
    sa.Column("required_permit", sa.String(200)),
    sa.Column("abort_requested", sa.Boolean, nullable=False),
    sa.Column("updated_seq", sa.BigInteger, nullable=False),
)
_TASK_INDEXES = (
    ("pico_tasks_by_conversation", ["session_id", "conversation_id", "id"], None),
    ("pico_tasks_live", ["session_id", "id"], _LIVE),
    ("pico_tasks_live_conversation", ["session_id", "conversation_id", "id"], _LIVE),
)
_ENTRIES = (
    "pico_entries",
    sa.Column("session_id", sa.String(200), primary_key=True),
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("conversation_id", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(200), nullable=False),
    sa.Column("key", sa.Text),
    sa.Column("content", sa.LargeBinary, nullable=False),
    sa.Column("metadata", sa.LargeBinary),
    sa.Column("by_task_id", sa.BigInteger),
    sa.Column("commit_end", sa.BigInteger, nullable=False),
)
_ENTRY_INDEXES = (
    ("pico_entries_conversation", ["session_id", "conversation_id", "id"], None),
    ("pico_entries_kind", ["session_id", "conversation_id", "kind", "id"], None),
    ("pico_entries_key", ["session_id", "conversation_id", "key", "id"], _KEYED),
)


def _rebuild_with_binary(
    table: tuple[Any, ...],
    binary: tuple[str, ...],
    indexes: tuple[tuple[str, list[str], Any], ...],
) -> None:
    """SQLite: rebuild ``table`` (its name, then its columns as the model has them) with
    the ``binary`` columns' rows cast to BLOB, and its ``indexes`` (name, columns, partial
    predicate) created again. The old table moves aside first, as ``_rebuild_sqlite``."""
    name, *columns = table
    for index, _, _ in indexes:
        op.drop_index(index, table_name=name)
    op.rename_table(name, f"{name}_0007")
    op.create_table(name, *columns)
    names = [f'"{c.name}"' for c in columns]
    values = [f"CAST({n} AS BLOB)" if n.strip('"') in binary else n for n in names]
    op.execute(
        f"INSERT INTO {name} ({', '.join(names)}) SELECT {', '.join(values)} FROM {name}_0007"
    )
    op.drop_table(f"{name}_0007")
    for index, cols, where in indexes:
        op.create_index(index, name, cols, sqlite_where=where)


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
