"""Deflated event bodies, no table changes: a stored event body may be raw deflate with a
preset dictionary (``infrastructure/sql/bodies.py``).

Revision ID: 0007
Revises: 0006
Create Date: 2027-02-01

A pico at 0006 reads every body as JSON and would call a deflated one corrupt; the stamp
makes it refuse the database instead ("Upgrade pico"). Existing rows stay JSON and read as
before: a body's first byte tells the two forms apart (``{`` for JSON, ``0x01`` for
deflate), so the upgrade rewrites nothing.
"""

from __future__ import annotations

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    pass  # the stamp is the change


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
