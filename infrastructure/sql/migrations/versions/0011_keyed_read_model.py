"""Keyed read-model tables on SQLite: a table of small keyed rows IS its primary key
(WITHOUT ROWID).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

SQLite stored each keyed read-model table twice: the table ordered by a hidden rowid, and
an automatic unique index of its key pointing into it. Rebuilt WITHOUT ROWID, the key
orders the table itself (as ``pico_commits`` has been since 0004): one B-tree insert a
row instead of two. This revision keys the tables whose rows are small by construction
(ids, positions, names): sessions, conversations, context elements and edits, state
addresses and list clears. Tables holding payloads of any size (entries' content, task
states, values and list elements) keep their rowid: a WITHOUT ROWID row lives in an index
B-tree, whose pages keep at most ~490 bytes of a row (2 KiB pages) and whose interior
pages hold rows, not rowids, so large rows would make the tree deep and every read of one
touch overflow pages. On the 2,000-turn workload: 29.4 -> 27.2 pages a commit, the
database 12.75 -> 12.27 MiB. Rows and secondary indexes are unchanged; batch mode copies
each table into its keyed form and renames it. PostgreSQL has no rowid: nothing changes
there but the stamp.

The layouts below are the tables as revision 0010 left them (written out, not reflected,
so the same steps run offline: ``pico db sql``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def _sid() -> sa.Column[Any]:
    return sa.Column("session_id", sa.String(200), primary_key=True)


def _layouts() -> list[sa.Table]:
    """The keyed tables as 0010 left them, with their secondary indexes."""
    m = sa.MetaData()
    big, text, s = sa.BigInteger, sa.Text, sa.String
    return [
        sa.Table(
            "pico_sessions",
            m,
            _sid(),
            sa.Column("head", big, nullable=False),
            sa.Column("main_head", big, nullable=False),
            sa.Column("root_id", big),
            sa.Column("owner", s(64)),
        ),
        sa.Table(
            "pico_conversations",
            m,
            _sid(),
            sa.Column("id", big, primary_key=True),
            sa.Column("created_seq", big, nullable=False),
            sa.Column("source_conversation_id", big),
            sa.Column("source_as_of", big),
            sa.Column("inherit_state", sa.Boolean, nullable=False),
            sa.Column("owner_task_id", big),
            sa.Column("prefix_revision", sa.Integer, nullable=False),
            sa.Column("deleted_seq", big),
            sa.Index("pico_conversations_source", "session_id", "source_conversation_id", "id"),
            sa.Index("pico_conversations_owner", "session_id", "owner_task_id", "id"),
        ),
        sa.Table(
            "pico_context_elements",
            m,
            _sid(),
            sa.Column("conversation_id", big, primary_key=True),
            sa.Column("position", big, primary_key=True),
            sa.Column("entry_id", big, nullable=False),
        ),
        sa.Table(
            "pico_context_edits",
            m,
            _sid(),
            sa.Column("conversation_id", big, primary_key=True),
            sa.Column("seq", big, primary_key=True),
            sa.Column("op", s(16), nullable=False),
            sa.Column("base", sa.Boolean, nullable=False),
            sa.Column("ids", text, nullable=False),
            sa.Column("removed", sa.Integer, nullable=False),
            sa.Column("revision", sa.Integer, nullable=False),
            sa.Index(
                "pico_context_edits_base",
                "session_id",
                "conversation_id",
                "seq",
                sqlite_where=sa.text("base"),
            ),
        ),
        sa.Table(
            "pico_addresses",
            m,
            _sid(),
            sa.Column("scope_kind", s(16), primary_key=True),
            sa.Column("kind", s(8), primary_key=True),
            sa.Column("namespace", s(300), primary_key=True),
            sa.Column("key", s(300), primary_key=True),
            sa.Column("rewind", sa.Boolean, nullable=False),
        ),
        sa.Table(
            "pico_list_clears",
            m,
            _sid(),
            sa.Column("scope", s(300), primary_key=True),
            sa.Column("namespace", s(300), primary_key=True),
            sa.Column("key", s(300), primary_key=True),
            sa.Column("seq", big, primary_key=True),
        ),
    ]


def upgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    # SQLite cannot change a table's storage in place: batch mode copies the rows into a
    # keyed table, renames it, and creates the secondary indexes again (``copy_from``).
    for old in _layouts():
        with op.batch_alter_table(
            old.name,
            copy_from=old,
            recreate="always",
            table_kwargs={"sqlite_with_rowid": False},
        ):
            pass


def downgrade() -> None:
    raise NotImplementedError("pico schemas only move forward; restore a backup")
