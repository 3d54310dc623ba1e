"""Workers: the table of unowned sessions with work due, and the inbox.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-20

``pico_work`` has one row per session that no worker owns and that has work due at
``due_at`` (the database's clock): a worker picks due rows with ``FOR UPDATE SKIP
LOCKED`` and takes their leases in the same transaction. ``pico_inbox`` carries commands
(accept, steer, decide_approval, ...) from processes that do not own a session to the
worker that does, keyed by a request key unique within the session. An index on
``pico_leases.expires_at`` finds sessions whose owner died (docs/workers.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "pico_work",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("pico_work_by_due", "pico_work", ["due_at"])
    op.create_table(
        "pico_inbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("session_id", sa.String(200), nullable=False),
        sa.Column("request_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True)),
        sa.Column("result", sa.Text()),
        sa.UniqueConstraint("session_id", "request_key", name="pico_inbox_request_key"),
    )
    op.create_index(
        "pico_inbox_pending",
        "pico_inbox",
        ["session_id", "id"],
        sqlite_where=sa.text("done_at IS NULL"),
        postgresql_where=sa.text("done_at IS NULL"),
    )
    op.create_index("pico_leases_by_expiry", "pico_leases", ["expires_at"])


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
