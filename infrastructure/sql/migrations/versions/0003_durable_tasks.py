"""Durable tasks with partial indexes over live work (schema version 3 of the pre-Alembic
list).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

The indexes release 3 created, frozen here: two full indexes carry the role (0004 drops
them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_LIVE = "role <> 'terminal'"


def upgrade() -> None:
    op.create_table(
        "pico_tasks",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("conversation_id", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(200), nullable=False),
        sa.Column("status", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("after", sa.Text, nullable=False),
        sa.Column("foreground", sa.Boolean, nullable=False),
        sa.Column("spawned_by", sa.BigInteger),
        sa.Column("owned_conversation_id", sa.BigInteger),
        sa.Column("not_before", sa.Float),
        sa.Column("required_permit", sa.String(200)),
        sa.Column("abort_requested", sa.Boolean, nullable=False),
        sa.Column("updated_seq", sa.BigInteger, nullable=False),
    )
    op.create_index("pico_tasks_role", "pico_tasks", ["session_id", "role", "id"])
    op.create_index(
        "pico_tasks_conversation", "pico_tasks", ["session_id", "conversation_id", "role", "id"]
    )
    # Live scans never sort or touch terminal history.
    op.create_index(
        "pico_tasks_live",
        "pico_tasks",
        ["session_id", "id"],
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )
    op.create_index(
        "pico_tasks_live_conversation",
        "pico_tasks",
        ["session_id", "conversation_id", "id"],
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
