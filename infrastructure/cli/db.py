"""``pico db``: the SQL schema's revisions (Alembic) for operators and DBAs.

    pico db upgrade URL [--revision head]   create, adopt or upgrade, in one transaction
    pico db current URL                     the revision, and whether it is head (exit 1 if not)
    pico db sql [--from REV] [--to head] [--dialect sqlite|postgresql]
                                            the upgrade as SQL to review and apply yourself
    pico db history                         every revision, oldest first

Only SQLite and PostgreSQL URLs have a schema. Errors are one line ``pico: ...`` on stderr
with exit code 2 (the app's convention, kept here too so the group behaves the same
wherever it is mounted).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from pico.domain.errors import InvalidArgumentError, PicoError
from pico.infrastructure.cli.common import UrlArgument, UrlOption, location, one_line
from pico.infrastructure.settings import check_storage_url, mask_url
from pico.infrastructure.sql import schema
from pico.infrastructure.sql.store import SqlDatabase

__all__ = ["register"]

T = TypeVar("T")


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except PicoError as exc:
        print(f"pico: {one_line(str(exc))}", file=sys.stderr)
        raise typer.Exit(2) from None


def _open(url: str, *, read_only: bool) -> SqlDatabase:
    """The database at ``url`` without judging its schema (that is what ``pico db`` is
    for); a URL without a SQL schema is ``InvalidArgumentError``."""
    url = check_storage_url(url)
    if url.startswith("sqlite:///"):
        return SqlDatabase(url, read_only=read_only, manage_schema=False)
    if url.startswith(("postgresql", "postgres://")):
        sql_url = "postgresql+psycopg://" + url.split("://", 1)[1]
        return SqlDatabase(
            sql_url, read_only=read_only, location=mask_url(url), manage_schema=False
        )
    raise InvalidArgumentError(
        f"{mask_url(url)} has no SQL schema (only sqlite:/// and postgresql:// URLs do); "
        "memory and JSONL storage need no upgrade"
    )


def _with(url: str, *, read_only: bool, work: Callable[[SqlDatabase], T]) -> T:
    db = _open(url, read_only=read_only)
    try:
        return work(db)
    finally:
        db.close()


def register(app: typer.Typer) -> None:
    """Add the ``db`` command group to ``app``."""
    db = typer.Typer(
        name="db",
        help="The SQL schema: upgrade a database, show its revision, write the upgrade as "
        "SQL for a DBA, list the revisions.",
        no_args_is_help=True,
    )
    app.add_typer(db, name="db")
    out = Console(highlight=False, soft_wrap=True)

    @db.command("upgrade")
    def upgrade_command(
        url: UrlArgument = None,
        url_option: UrlOption = None,
        revision: Annotated[
            str, typer.Option("--revision", help="The revision to reach (pico db history).")
        ] = "head",
    ) -> None:
        """Create, adopt or upgrade the database's pico schema to a revision, in one
        transaction (a failure changes nothing). A database stamped by the pre-Alembic
        pico_schema table is adopted first."""
        with _errors():
            chosen = location(url, url_option)
            found, reached = _with(chosen, read_only=False, work=lambda d: d.migrate(revision))
        if found.revision == reached:
            out.print(f"already at revision {reached}; nothing to do")
        else:
            out.print(f"upgraded from {found.describe()} to revision {reached}")

    @db.command("current")
    def current_command(url: UrlArgument = None, url_option: UrlOption = None) -> None:
        """Print the database's revision and whether it is this pico's head (exit code 1
        when it is not). Reads only."""
        with _errors():
            chosen = location(url, url_option)
            state = _with(chosen, read_only=True, work=lambda d: d.schema_state())
        head = schema.head_revision()
        if state.revision == head:
            out.print(f"{head} (head)")
            return
        out.print(f"{state.describe()}; this pico's head is {head}")
        raise typer.Exit(1)

    @db.command("sql")
    def sql_command(
        start: Annotated[
            str | None,
            typer.Option(
                "--from",
                help="The revision the database is at (pico db current); omit for an empty "
                "database.",
                show_default=False,
            ),
        ] = None,
        target: Annotated[str, typer.Option("--to", help="The revision to reach.")] = "head",
        dialect: Annotated[
            str, typer.Option("--dialect", help="sqlite or postgresql.")
        ] = "postgresql",
        legacy: Annotated[
            bool,
            typer.Option(
                "--legacy",
                help="The database predates Alembic (pico_schema, no pico_alembic_version): "
                "stamp it at --from first (pico_schema version N is revision 000N).",
            ),
        ] = False,
    ) -> None:
        """Write the upgrade as one SQL script (BEGIN ... COMMIT, the version table
        included) for a DBA to review and apply; connects to nothing."""
        with _errors():
            text = schema.offline_sql(start, target, dialect, legacy=legacy)
        sys.stdout.write(text)

    @db.command("history")
    def history_command() -> None:
        """List every revision, oldest first; the last is this pico's head."""
        table = Table("revision", "revises", "what it does", box=None, pad_edge=False)
        head = schema.head_revision()
        for rev, down, doc in schema.history():
            table.add_row(f"{rev} (head)" if rev == head else rev, down or "-", doc)
        out.print(table)
