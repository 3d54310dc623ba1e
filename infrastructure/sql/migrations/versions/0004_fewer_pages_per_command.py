"""Fewer pages written per command: role-free task indexes; keyed commit rows (schema
version 4 of the pre-Alembic list).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

A status change then rewrites only the task row and the small live indexes, not entries
in ever-growing history indexes; on SQLite ``pico_commits`` is rebuilt WITHOUT ROWID
(the key IS the table: no separate key index to write on every commit).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.drop_index("pico_tasks_role", table_name="pico_tasks")
    op.drop_index("pico_tasks_conversation", table_name="pico_tasks")
    op.create_index(
        "pico_tasks_by_conversation", "pico_tasks", ["session_id", "conversation_id", "id"]
    )
    if op.get_context().dialect.name != "sqlite":
        return
    # SQLite cannot change a table's storage in place: batch mode copies the rows into a
    # keyed table and renames it. ``copy_from`` (0001's layout) lets the same steps run
    # offline (``pico db sql``), where nothing can be reflected.
    old = sa.Table(
        "pico_commits",
        sa.MetaData(),
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("last", sa.BigInteger, primary_key=True),
        sa.Column("first", sa.BigInteger, nullable=False),
        sa.Column("scope", sa.String(200), nullable=False),
    )
    with op.batch_alter_table(
        "pico_commits",
        copy_from=old,
        recreate="always",
        table_kwargs={"sqlite_with_rowid": False},
    ):
        pass


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
