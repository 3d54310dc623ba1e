"""Events, snapshots and the §7.6 query tables (schema version 1 of the pre-Alembic list).

Revision ID: 0001
Revises:
Create Date: 2026-11-30

The DDL release 1 created, frozen here: ``pico_commits`` is a rowid table (0004 rebuilds
it keyed on SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

# SQLite's rowid alias must be INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "pico_events",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("originator_id", sa.String(32), nullable=False),
        sa.Column("originator_version", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("originator_id", "originator_version", name="pico_events_stream"),
    )
    op.create_index("pico_events_session", "pico_events", ["session_id", "id"])
    op.create_table(
        "pico_snapshots",
        sa.Column("originator_id", sa.String(32), primary_key=True),
        sa.Column("originator_version", sa.Integer, primary_key=True),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "pico_sessions",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("head", sa.BigInteger, nullable=False),
        sa.Column("main_head", sa.BigInteger, nullable=False),
        sa.Column("root_id", sa.BigInteger),
        sa.Column("owner", sa.String(64)),
    )
    op.create_table(
        "pico_commits",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("last", sa.BigInteger, primary_key=True),
        sa.Column("first", sa.BigInteger, nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
    )
    op.create_table(
        "pico_conversations",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("created_seq", sa.BigInteger, nullable=False),
        sa.Column("source_conversation_id", sa.BigInteger),
        sa.Column("source_as_of", sa.BigInteger),
        sa.Column("inherit_state", sa.Boolean, nullable=False),
        sa.Column("owner_task_id", sa.BigInteger),
        sa.Column("prefix_revision", sa.Integer, nullable=False),
        sa.Column("deleted_seq", sa.BigInteger),
    )
    op.create_index(
        "pico_conversations_source",
        "pico_conversations",
        ["session_id", "source_conversation_id", "id"],
    )
    op.create_index(
        "pico_conversations_owner", "pico_conversations", ["session_id", "owner_task_id", "id"]
    )
    op.create_table(
        "pico_entries",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("conversation_id", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("key", sa.Text),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text),
        sa.Column("by_task_id", sa.BigInteger),
        sa.Column("commit_end", sa.BigInteger, nullable=False),
    )
    op.create_index(
        "pico_entries_conversation", "pico_entries", ["session_id", "conversation_id", "id"]
    )
    op.create_index(
        "pico_entries_kind", "pico_entries", ["session_id", "conversation_id", "kind", "id"]
    )
    op.create_index(
        "pico_entries_key", "pico_entries", ["session_id", "conversation_id", "key", "id"]
    )
    op.create_table(
        "pico_context_elements",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("conversation_id", sa.BigInteger, primary_key=True),
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("entry_id", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "pico_context_edits",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("conversation_id", sa.BigInteger, primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("op", sa.String(16), nullable=False),
        sa.Column("base", sa.Boolean, nullable=False),
        sa.Column("ids", sa.Text, nullable=False),
        sa.Column("removed", sa.Integer, nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
    )
    op.create_index(
        "pico_context_edits_base",
        "pico_context_edits",
        ["session_id", "conversation_id", "base", "seq"],
    )


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
