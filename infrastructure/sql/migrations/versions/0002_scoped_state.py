"""Scoped state: addresses, current values, value versions, list elements and clears
(schema version 2 of the pre-Alembic list).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def _scope_key() -> list[sa.Column[str]]:
    return [
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("scope", sa.String(300), primary_key=True),
        sa.Column("namespace", sa.String(300), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
    ]


def upgrade() -> None:
    op.create_table(
        "pico_addresses",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("scope_kind", sa.String(16), primary_key=True),
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("namespace", sa.String(300), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("rewind", sa.Boolean, nullable=False),
    )
    op.create_table(
        "pico_values",
        *_scope_key(),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "pico_value_versions",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("conversation_id", sa.BigInteger, primary_key=True),
        sa.Column("namespace", sa.String(300), primary_key=True),
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("value", sa.Text),  # NULL records a deletion (absence)
    )
    op.create_table(
        "pico_list_elements",
        *_scope_key(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "pico_list_clears",
        *_scope_key(),
        sa.Column("seq", sa.BigInteger, primary_key=True),
    )


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
