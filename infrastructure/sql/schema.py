"""The schema: the append-only event log, snapshots, and the §7.6 query tables.

Every key starts with the session id, so many sessions share one database. Schema changes
are an ordered ``MIGRATIONS`` list applied by ``setup()``, recorded in ``pico_schema``.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Connection

__all__ = ["SCHEMA_VERSION", "metadata", "setup"]

metadata = MetaData()

# SQLite's rowid alias must be INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
_Id = BigInteger().with_variant(Integer(), "sqlite")

events = Table(
    "pico_events",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("session_id", String(200), nullable=False),
    Column("originator_id", String(32), nullable=False),
    Column("originator_version", Integer, nullable=False),
    Column("topic", Text, nullable=False),
    Column("state", LargeBinary, nullable=False),
    UniqueConstraint("originator_id", "originator_version", name="pico_events_stream"),
    Index("pico_events_session", "session_id", "id"),
)

snapshots = Table(
    "pico_snapshots",
    metadata,
    Column("originator_id", String(32), primary_key=True),
    Column("originator_version", Integer, primary_key=True),
    Column("topic", Text, nullable=False),
    Column("state", LargeBinary, nullable=False),
)

sessions = Table(
    "pico_sessions",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("head", BigInteger, nullable=False),
    Column("main_head", BigInteger, nullable=False),
    Column("root_id", BigInteger),
    Column("owner", String(64)),
)

commits = Table(
    "pico_commits",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("last", BigInteger, primary_key=True),
    Column("first", BigInteger, nullable=False),
    Column("scope", String(200), nullable=False),
    # One row per command: on SQLite the key IS the table (no separate key index to
    # write on every commit; v4).
    sqlite_with_rowid=False,
)

conversations = Table(
    "pico_conversations",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("created_seq", BigInteger, nullable=False),
    Column("source_conversation_id", BigInteger),
    Column("source_as_of", BigInteger),
    Column("inherit_state", Boolean, nullable=False),
    Column("owner_task_id", BigInteger),
    Column("prefix_revision", Integer, nullable=False),
    Column("deleted_seq", BigInteger),
    Index("pico_conversations_source", "session_id", "source_conversation_id", "id"),
    Index("pico_conversations_owner", "session_id", "owner_task_id", "id"),
)

entries = Table(
    "pico_entries",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("conversation_id", BigInteger, nullable=False),
    Column("kind", String(200), nullable=False),
    Column("key", Text),
    Column("content", Text, nullable=False),
    Column("metadata", Text),
    Column("by_task_id", BigInteger),
    Column("commit_end", BigInteger, nullable=False),
    Index("pico_entries_conversation", "session_id", "conversation_id", "id"),
    Index("pico_entries_kind", "session_id", "conversation_id", "kind", "id"),
    Index("pico_entries_key", "session_id", "conversation_id", "key", "id"),
)

context_elements = Table(
    "pico_context_elements",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("position", BigInteger, primary_key=True),
    Column("entry_id", BigInteger, nullable=False),
)

context_edits = Table(
    "pico_context_edits",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("op", String(16), nullable=False),
    Column("base", Boolean, nullable=False),
    Column("ids", Text, nullable=False),
    Column("removed", Integer, nullable=False),
    Column("revision", Integer, nullable=False),
    Index("pico_context_edits_base", "session_id", "conversation_id", "base", "seq"),
)

# -- v2: scoped state (§4, §7.6)
addresses = Table(
    "pico_addresses",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope_kind", String(16), primary_key=True),
    Column("kind", String(8), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("rewind", Boolean, nullable=False),
)

values = Table(
    "pico_values",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("value", Text, nullable=False),
)

value_versions = Table(
    "pico_value_versions",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("value", Text),  # NULL records a deletion (absence)
)

list_elements = Table(
    "pico_list_elements",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("value", Text, nullable=False),
)

list_clears = Table(
    "pico_list_clears",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
)

# -- v3: durable tasks (§5.1, §6.1, §7.6)
tasks = Table(
    "pico_tasks",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("conversation_id", BigInteger, nullable=False),
    Column("kind", String(200), nullable=False),
    Column("status", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    Column("state", Text, nullable=False),
    Column("after", Text, nullable=False),
    Column("foreground", Boolean, nullable=False),
    Column("spawned_by", BigInteger),
    Column("owned_conversation_id", BigInteger),
    Column("not_before", Float),
    Column("required_permit", String(200)),
    Column("abort_requested", Boolean, nullable=False),
    Column("updated_seq", BigInteger, nullable=False),
    # No full index carries the role (v4): a status change then rewrites only the table
    # row and the small live indexes, not entries in ever-growing history indexes. Scans by
    # a live role go through the live indexes; scans of terminal history filter by role.
    Index("pico_tasks_by_conversation", "session_id", "conversation_id", "id"),
    # Live scans never sort or touch terminal history.
    Index(
        "pico_tasks_live",
        "session_id",
        "id",
        sqlite_where=text("role <> 'terminal'"),
        postgresql_where=text("role <> 'terminal'"),
    ),
    Index(
        "pico_tasks_live_conversation",
        "session_id",
        "conversation_id",
        "id",
        sqlite_where=text("role <> 'terminal'"),
        postgresql_where=text("role <> 'terminal'"),
    ),
)

schema_versions = Table(
    "pico_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("description", Text, nullable=False),
)


def _create(*names: str) -> Callable[[Connection], None]:
    def apply(conn: Connection) -> None:
        metadata.create_all(conn, tables=[metadata.tables[n] for n in names])

    return apply


def _v4(conn: Connection) -> None:
    # Idempotent: a database created by an older migration 3 has the role-carrying task
    # indexes and a rowid commit table; one created from this metadata already has neither.
    conn.execute(text("DROP INDEX IF EXISTS pico_tasks_role"))
    conn.execute(text("DROP INDEX IF EXISTS pico_tasks_conversation"))
    conn.execute(
        text(
            "CREATE INDEX IF NOT EXISTS pico_tasks_by_conversation "
            "ON pico_tasks (session_id, conversation_id, id)"
        )
    )
    if conn.dialect.name != "sqlite":
        return
    ddl = conn.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'pico_commits'")
    ).scalar_one()
    if "WITHOUT ROWID" in ddl.upper():
        return
    conn.execute(text("ALTER TABLE pico_commits RENAME TO pico_commits_v3"))
    commits.create(conn)
    conn.execute(
        text(
            "INSERT INTO pico_commits (session_id, last, first, scope) "
            "SELECT session_id, last, first, scope FROM pico_commits_v3"
        )
    )
    conn.execute(text("DROP TABLE pico_commits_v3"))


#: Ordered, append-only: a migration, once released, is never edited; add the next one.
MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (
        1,
        "events, snapshots and the §7.6 query tables",
        _create(
            "pico_events",
            "pico_snapshots",
            "pico_sessions",
            "pico_commits",
            "pico_conversations",
            "pico_entries",
            "pico_context_elements",
            "pico_context_edits",
        ),
    ),
    (
        2,
        "scoped state: addresses, current values, value versions, list elements and clears",
        _create(
            "pico_addresses",
            "pico_values",
            "pico_value_versions",
            "pico_list_elements",
            "pico_list_clears",
        ),
    ),
    (3, "durable tasks with partial indexes over live work", _create("pico_tasks")),
    (4, "fewer pages written per command: role-free task indexes; keyed commit rows", _v4),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def setup(conn: Connection) -> None:
    """Apply every migration not yet recorded, in order, inside the caller's transaction."""
    schema_versions.create(conn, checkfirst=True)
    done = {row[0] for row in conn.execute(schema_versions.select())}
    for version, description, apply in MIGRATIONS:
        if version not in done:
            apply(conn)
            conn.execute(schema_versions.insert().values(version=version, description=description))
