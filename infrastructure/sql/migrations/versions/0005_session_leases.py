"""Session leases: one row per leased session, renewed on the database's clock.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-10

``pico_leases`` holds the owner of a session's write lease and when it expires
(``now() + ttl`` of the owner's last renewal, the database's clock). Opening with
``Harness.open(url, lease=Lease(...))`` on PostgreSQL acquires it before the claim; a
session opened without a lease never touches the table (docs/workers.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "pico_leases",
        sa.Column("session_id", sa.String(200), primary_key=True),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
