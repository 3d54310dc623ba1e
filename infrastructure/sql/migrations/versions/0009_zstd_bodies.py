"""zstd event bodies, no table changes: a stored event body may be one zstd frame with a
trained dictionary (``infrastructure/sql/bodies.py``, ``ZSTD``).

Revision ID: 0009
Revises: 0008
Create Date: 2027-02-15

A pico at 0008 reads a body as JSON or deflate and would call a zstd one corrupt; the stamp
makes it refuse the database instead ("Upgrade pico"). Existing rows read as before: a
body's first byte tells the forms apart (``{`` JSON, ``0x01`` deflate, ``0x02`` zstd), so
the upgrade rewrites nothing.
"""

from __future__ import annotations

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    pass  # the stamp is the change


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
