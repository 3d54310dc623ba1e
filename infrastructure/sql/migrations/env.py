"""Alembic's entry point for pico's schema: online on the caller's connection and
transaction, or offline (``--sql``) for a DBA who applies the SQL themselves.

pico passes its open connection as ``config.attributes["connection"]`` (inside the
transaction that holds the schema lock); the migrations then run in that transaction and
commit or roll back with it. Without one (a developer's ``alembic`` command line), the URL
comes from ``-x url=...`` or ``sqlalchemy.url``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context

from pico.infrastructure.sql.schema import VERSION_TABLE, include_name, metadata


def _options(dialect: str) -> dict[str, Any]:
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "include_name": include_name,
        # SQLite cannot ALTER most things: batch mode copies the table.
        "render_as_batch": dialect == "sqlite",
        # SQLite's DDL is transactional too: one BEGIN ... COMMIT around the whole script
        # (offline) and no implicit commit between revisions (online).
        "transactional_ddl": True,
    }


def run_offline() -> None:
    dialect = context.config.attributes.get("dialect", "sqlite")
    context.configure(dialect_name=dialect, literal_binds=True, **_options(dialect))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    conn: sa.Connection | None = context.config.attributes.get("connection")
    if conn is not None:
        context.configure(connection=conn, **_options(conn.dialect.name))
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("pass the database with -x url=sqlite:///scratch.db")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as own:
        context.configure(connection=own, **_options(own.dialect.name))
        context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
