"""Date-neutral zstd dictionaries, no table changes: new bodies of the seven frequent event
types are written with dictionaries 19-25 (``infrastructure/sql/zstd_dictionaries.py``).

Revision ID: 0010
Revises: 0009
Create Date: 2027-03-01

The dictionaries of 0009 (ids 12-18) were trained on one afternoon's bodies and hold its
date: a body written on another day matched less of them, and the 2,000-turn workload's
database grew from 12.4 MiB on the training day to 13.1 MiB a month later. Dictionaries
19-25 were trained on bodies whose timestamps are spread over 2020-2045: 12.7 MiB on any
date. A pico at 0009 does not know these ids and would call such a body corrupt; the stamp
makes it refuse the database instead ("Upgrade pico"). Every body names its dictionary, so
existing rows read as before and the upgrade rewrites nothing.
"""

from __future__ import annotations

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    pass  # the stamp is the change


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
