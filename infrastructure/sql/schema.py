"""The schema: the append-only event log, snapshots, and the §7.6 query tables.

Every key starts with the session id, so many sessions share one database; the schema is
per database. ``metadata`` is the model of the newest revision; the revisions themselves
(``migrations/versions/``, Alembic) create and upgrade a database, on the caller's
connection and inside its transaction, recorded in ``pico_alembic_version``.
``ensure()`` is what an open runs: a fresh database is created at head, a database stamped
by the pre-Alembic ``pico_schema`` table is adopted, an older one is upgraded only when the
open opts in (``SchemaOutdatedError`` otherwise), and a newer one is refused.
"""

from __future__ import annotations

import functools
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection

from pico.domain.errors import ConfigurationError, InvalidArgumentError, SchemaOutdatedError

if TYPE_CHECKING:  # Alembic is imported only to change a schema (~150-400 ms to import)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = [
    "LEGACY_REVISIONS",
    "REVISIONS",
    "VERSION_TABLE",
    "SchemaState",
    "check",
    "ensure",
    "head_revision",
    "history",
    "include_name",
    "metadata",
    "offline_sql",
    "read_state",
    "script_revisions",
    "upgrade",
]

log = logging.getLogger("pico.storage")

metadata = MetaData()

# SQLite's rowid alias must be INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
_Id = BigInteger().with_variant(Integer(), "sqlite")


def _numbering(name: str, column: str, type_: Any, unique: str) -> Table:
    """A table numbering each distinct value of ``column`` at its first use (0008)."""
    return Table(
        name,
        metadata,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column(column, type_, nullable=False),
        UniqueConstraint(column, name=unique),
    )


# An event row names its stream and its topic by number (revision 0008): the 32-character
# stream id and the ~40-character topic were most of every row and, as random UUID keys,
# scattered each command's writes over the stream index. ``event_log`` joins them back.
topics = _numbering("pico_topics", "topic", Text, "pico_topics_topic")
streams = _numbering("pico_streams", "originator_id", String(32), "pico_streams_originator")
# The sessions of the event log, numbered at their first event: a session's events are
# read by (number, position), an index of a few bytes an event whatever the session's id.
session_numbers = _numbering(
    "pico_session_numbers", "session_id", String(200), "pico_session_numbers_session"
)

events = Table(
    "pico_events",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("session_number", BigInteger, nullable=False),
    Column("stream_id", BigInteger, nullable=False),
    Column("originator_version", Integer, nullable=False),
    Column("topic_id", BigInteger, nullable=False),
    Column("state", LargeBinary, nullable=False),
    UniqueConstraint("stream_id", "originator_version", name="pico_events_stream"),
    Index("pico_events_session", "session_number", "id"),
)


def of_session(session_id: str) -> Any:
    """The condition "the event is of session ``session_id``" on ``pico_events``: its
    number by a probe of ``pico_session_numbers``'s unique index, in the statement."""
    number = (
        select(session_numbers.c.id)
        .where(session_numbers.c.session_id == session_id)
        .scalar_subquery()
    )
    return events.c.session_number == number


#: The stored events as the recorder reads them: ``event_columns`` over ``event_log``.
#: Outer joins: an event whose stream or topic number names no row is still read, and
#: reported at its position (``recorder.event_from_row``), never silently skipped.
event_log = events.outerjoin(streams, streams.c.id == events.c.stream_id).outerjoin(
    topics, topics.c.id == events.c.topic_id
)
#: (position, stream id as hex, version, topic, body, stream number, topic number) of
#: an ``event_log`` row.
event_columns = (
    events.c.id,
    streams.c.originator_id,
    events.c.originator_version,
    topics.c.topic,
    events.c.state,
    events.c.stream_id,
    events.c.topic_id,
)

snapshots = Table(
    "pico_snapshots",
    metadata,
    Column("originator_id", String(32), primary_key=True),
    Column("originator_version", Integer, primary_key=True),
    Column("topic", Text, nullable=False),
    Column("state", LargeBinary, nullable=False),
)

# Read-model tables of small keyed rows are WITHOUT ROWID on SQLite (revision 0011;
# ``pico_commits`` since 0004): the key orders the table itself, not a second B-tree beside
# a rowid table, so a row is one B-tree insert, not two. Tables holding payloads of any
# size (entries, tasks, values, list elements) keep their rowid: an index B-tree keeps at
# most ~490 bytes of a row on a 2 KiB page and holds whole rows in its interior pages.
sessions = Table(
    "pico_sessions",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("head", BigInteger, nullable=False),
    Column("main_head", BigInteger, nullable=False),
    Column("root_id", BigInteger),
    Column("owner", String(64)),
    sqlite_with_rowid=False,
)

commits = Table(
    "pico_commits",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("last", BigInteger, primary_key=True),
    Column("first", BigInteger, nullable=False),
    Column("scope", String(200), nullable=False),
    # One row per command: on SQLite the key IS the table (no separate key index to
    # write on every commit; v4).
    sqlite_with_rowid=False,
)

conversations = Table(
    "pico_conversations",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("created_seq", BigInteger, nullable=False),
    Column("source_conversation_id", BigInteger),
    Column("source_as_of", BigInteger),
    Column("inherit_state", Boolean, nullable=False),
    Column("owner_task_id", BigInteger),
    Column("prefix_revision", Integer, nullable=False),
    Column("deleted_seq", BigInteger),
    Index("pico_conversations_source", "session_id", "source_conversation_id", "id"),
    Index("pico_conversations_owner", "session_id", "owner_task_id", "id"),
    sqlite_with_rowid=False,
)

entries = Table(
    "pico_entries",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("conversation_id", BigInteger, nullable=False),
    Column("kind", String(200), nullable=False),
    Column("key", Text),
    # Deflated JSON (0008; ``bodies.encode_text``), as the task states.
    Column("content", LargeBinary, nullable=False),
    Column("metadata", LargeBinary),
    Column("by_task_id", BigInteger),
    Column("commit_end", BigInteger, nullable=False),
    Index("pico_entries_conversation", "session_id", "conversation_id", "id"),
    Index("pico_entries_kind", "session_id", "conversation_id", "kind", "id"),
    # Only keyed entries (0008): most entries have no key, and a lookup by key (``key =
    # ?``, which implies NOT NULL) never needs the others.
    Index(
        "pico_entries_key",
        "session_id",
        "conversation_id",
        "key",
        "id",
        sqlite_where=text("key IS NOT NULL"),
        postgresql_where=text("key IS NOT NULL"),
    ),
)

context_elements = Table(
    "pico_context_elements",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("position", BigInteger, primary_key=True),
    Column("entry_id", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)

context_edits = Table(
    "pico_context_edits",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("op", String(16), nullable=False),
    Column("base", Boolean, nullable=False),
    Column("ids", Text, nullable=False),
    Column("removed", Integer, nullable=False),
    Column("revision", Integer, nullable=False),
    # Only the base edits (0008: create, reset, replace), which a historical read starts
    # from; appends, one per context change, are read by range of the primary key.
    Index(
        "pico_context_edits_base",
        "session_id",
        "conversation_id",
        "seq",
        sqlite_where=text("base"),
        postgresql_where=text("base"),
    ),
    sqlite_with_rowid=False,
)

# -- v2: scoped state (§4, §7.6)
addresses = Table(
    "pico_addresses",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope_kind", String(16), primary_key=True),
    Column("kind", String(8), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("rewind", Boolean, nullable=False),
    sqlite_with_rowid=False,
)

values = Table(
    "pico_values",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("value", Text, nullable=False),
)

value_versions = Table(
    "pico_value_versions",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("conversation_id", BigInteger, primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("value", Text),  # NULL records a deletion (absence)
)

list_elements = Table(
    "pico_list_elements",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("value", Text, nullable=False),
)

list_clears = Table(
    "pico_list_clears",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("scope", String(300), primary_key=True),
    Column("namespace", String(300), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    sqlite_with_rowid=False,
)

# -- v3: durable tasks (§5.1, §6.1, §7.6)
tasks = Table(
    "pico_tasks",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("id", BigInteger, primary_key=True),
    Column("conversation_id", BigInteger, nullable=False),
    Column("kind", String(200), nullable=False),
    Column("status", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    # Deflated JSON (0008; ``bodies.encode_text``): a task's state repeats what its
    # events hold, in the same few shapes, so a dictionary makes it ~10x smaller.
    Column("state", LargeBinary, nullable=False),
    Column("after", Text, nullable=False),
    Column("foreground", Boolean, nullable=False),
    Column("spawned_by", BigInteger),
    Column("owned_conversation_id", BigInteger),
    Column("not_before", Float),
    Column("required_permit", String(200)),
    Column("abort_requested", Boolean, nullable=False),
    Column("updated_seq", BigInteger, nullable=False),
    # No full index carries the role (v4): a status change then rewrites only the table
    # row and the small live indexes, not entries in ever-growing history indexes. Scans by
    # a live role go through the live indexes; scans of terminal history filter by role.
    Index("pico_tasks_by_conversation", "session_id", "conversation_id", "id"),
    # Live scans never sort or touch terminal history.
    Index(
        "pico_tasks_live",
        "session_id",
        "id",
        sqlite_where=text("role <> 'terminal'"),
        postgresql_where=text("role <> 'terminal'"),
    ),
    Index(
        "pico_tasks_live_conversation",
        "session_id",
        "conversation_id",
        "id",
        sqlite_where=text("role <> 'terminal'"),
        postgresql_where=text("role <> 'terminal'"),
    ),
)

# -- v5: session leases (issue 16; infrastructure/sql/lease.py). Expiry is the database's
# clock only (``now() + ttl`` at each renewal); no worker's clock is ever written here.
leases = Table(
    "pico_leases",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("owner", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("renewed_at", DateTime(timezone=True), nullable=False),
)

# -- v6: workers (issue 16; infrastructure/sql/work.py, docs/workers.md). ``pico_work``
# holds one row per UNOWNED session with work due (its due time on the database's
# clock); a crashed owner's session is found through its expired lease instead. The
# inbox carries commands from processes that do not own a session to its owner, who
# executes each in its own serialized command, keyed by the row's request key.
work = Table(
    "pico_work",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("due_at", DateTime(timezone=True), nullable=False),
    Index("pico_work_by_due", "due_at"),
)

inbox = Table(
    "pico_inbox",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("session_id", String(200), nullable=False),
    Column("request_key", Text, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("payload", Text, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("done_at", DateTime(timezone=True)),
    Column("result", Text),
    UniqueConstraint("session_id", "request_key", name="pico_inbox_request_key"),
    Index(
        "pico_inbox_pending",
        "session_id",
        "id",
        sqlite_where=text("done_at IS NULL"),
        postgresql_where=text("done_at IS NULL"),
    ),
)

Index("pico_leases_by_expiry", leases.c.expires_at)

#: Alembic's version table, named for pico: a service that shares the database and keeps
#: its own schema with Alembic keeps its own ``alembic_version``.
VERSION_TABLE = "pico_alembic_version"

#: Every revision, oldest first; the last is head. Opening a database compares against
#: this list without importing Alembic; a test proves it equals the scripts' history, so
#: a revision added without extending it fails CI.
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011")

# The version table exactly as Alembic creates it (``alembic stamp``), written by pico
# itself when it creates or adopts a database, so that a fresh open needs no Alembic.
_versions = Table(
    VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
)

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"

# Legacy: before Alembic, an ordered list of migrations recorded its versions here. It is
# read only to adopt such a database (``LEGACY_REVISIONS``) and left in place, unchanged.
_legacy = MetaData()
legacy_versions = Table(
    "pico_schema",
    _legacy,
    Column("version", Integer, primary_key=True),
    Column("description", Text, nullable=False),
)

#: Pre-Alembic schema version -> the revision whose layout it is. Version 4 (the last) is
#: revision 0004 exactly, so adopting it writes the stamp; the revisions after 0004 (0005:
#: leases) are then an upgrade like any other, behind the same opt-in.
LEGACY_REVISIONS = {1: "0001", 2: "0002", 3: "0003", 4: "0004"}

_PACKAGE = "pico-harness"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Autogenerate compares pico's own tables only (a shared database holds others'),
    never the legacy ``pico_schema``."""
    if type_ == "table":
        return bool(name) and str(name).startswith("pico_") and name != "pico_schema"
    return True


@dataclass(frozen=True)
class SchemaState:
    """What a database holds: an Alembic stamp, a pre-Alembic ``pico_schema`` version
    (unstamped), or neither (no pico schema yet)."""

    revision: str | None = None
    legacy: int | None = None

    @property
    def fresh(self) -> bool:
        return self.revision is None and self.legacy is None

    @property
    def effective(self) -> str | None:
        """The revision whose layout the database has (a legacy version's, if unstamped)."""
        if self.revision is not None:
            return self.revision
        return LEGACY_REVISIONS.get(self.legacy) if self.legacy is not None else None

    def describe(self) -> str:
        if self.revision is not None:
            return self.revision
        if self.legacy is not None:
            mapped = LEGACY_REVISIONS.get(self.legacy, "unknown")
            return f"{mapped} (pre-Alembic pico_schema version {self.legacy}, not yet stamped)"
        return "none (no pico schema yet)"


def _config(output_buffer: io.StringIO | None = None, **attributes: Any) -> Config:
    """Alembic's configuration, built in code (no alembic.ini at runtime)."""
    from alembic.config import Config

    cfg = Config(output_buffer=output_buffer)
    cfg.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
    cfg.attributes.update(attributes)
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def script_revisions() -> tuple[str, ...]:
    """The scripts' revisions, oldest first (the history is one line): ``REVISIONS``."""
    return tuple(reversed([s.revision for s in _script().walk_revisions()]))


def head_revision() -> str:
    """The newest revision this code knows: what every database it opens must be at."""
    return REVISIONS[-1]


def history() -> list[tuple[str, str | None, str]]:
    """``(revision, down_revision, what it does)`` for every revision, oldest first."""
    found = []
    for rev in REVISIONS:
        script = _script().get_revision(rev)
        assert script is not None
        down = script.down_revision
        # The docstring's first paragraph, as one line.
        doc = " ".join((script.doc or "").strip().split("\n\n")[0].split())
        found.append((rev, down if isinstance(down, str) else None, doc))
    return found


def state_from(has_table: Any, rows: Any) -> SchemaState:
    """The state from ``has_table(name) -> bool`` and ``rows(sql) -> list of tuples`` (a
    SQLAlchemy connection or a raw read-only sqlite3 one)."""
    if has_table(VERSION_TABLE):
        found = [str(r[0]) for r in rows(f"SELECT version_num FROM {VERSION_TABLE}")]
        if len(found) > 1:
            raise ConfigurationError(
                f"{VERSION_TABLE} holds {len(found)} revisions ({', '.join(sorted(found))}); "
                "pico's history is one line, so someone branched it by hand. Restore the "
                "table to the single revision the database is at"
            )
        if found:
            return SchemaState(revision=found[0])
    if has_table("pico_schema"):
        top = rows("SELECT max(version) FROM pico_schema")
        if top and top[0][0] is not None:
            return SchemaState(legacy=int(top[0][0]))
    return SchemaState()


def read_state(conn: Connection) -> SchemaState:
    """What the database on ``conn`` holds (read inside the caller's transaction)."""
    insp = inspect(conn)
    return state_from(insp.has_table, lambda sql: list(conn.execute(text(sql))))


def _newer(location: str, revision: str) -> ConfigurationError:
    return ConfigurationError(
        f"the pico schema of {location} is at revision {revision}, which this pico does not "
        f"know (its newest is {head_revision()}): a newer pico upgraded it; nothing was "
        f"changed. Upgrade pico (pip install -U {_PACKAGE}) to open it"
    )


def check(
    state: SchemaState, *, upgrade: bool, read_only: bool, location: str, url: str, dialect: str
) -> bool:
    """Whether an open must change the schema (create, adopt or upgrade it), or raise why
    it may not: ``SchemaOutdatedError`` for an older schema without the opt-in (or on a
    read-only open), ``ConfigurationError`` for one newer than this code."""
    head = head_revision()
    if state.fresh:
        return not read_only
    current = state.effective
    if current is None or current not in REVISIONS:
        raise _newer(location, state.revision or f"pico_schema version {state.legacy}")
    if current == head:
        return state.revision is None and not read_only  # a legacy stamp to write
    if read_only:
        how = f"A read-only open never changes it: upgrade it first with `pico db upgrade {url}`"
    elif upgrade:
        return True
    else:
        how = (
            f"Upgrade it with `pico db upgrade {url}` (review the SQL first with "
            f"`pico db sql --from {current} --dialect {dialect}`), or open it with "
            "PICO_UPGRADE_SCHEMA=1 in the environment to upgrade it on open"
        )
    raise SchemaOutdatedError(location, state.describe(), head, how)


def _stamp(conn: Connection, revision: str) -> None:
    """Create the version table holding ``revision`` on ``conn`` (a database without
    one): what ``alembic stamp`` writes, without importing Alembic."""
    _versions.create(conn, checkfirst=True)
    conn.execute(_versions.insert().values(version_num=revision))


def _migrate(conn: Connection, state: SchemaState, target: str, location: str) -> None:
    if state.fresh and target == head_revision():
        # The model IS head (the tests prove autogenerate finds no difference, and the
        # same DDL on SQLite); creating it and stamping costs what the pre-Alembic setup
        # did (~20 ms on SQLite) against ~45 ms for replaying every revision through
        # Alembic (docs/database.md).
        log.info("creating the pico schema in %s at revision %s", location, target)
        metadata.create_all(conn)
        _stamp(conn, target)
        return
    if state.fresh:
        log.info("creating the pico schema in %s up to revision %s", location, target)
    elif state.revision is None:
        assert state.legacy is not None
        stamp = LEGACY_REVISIONS[state.legacy]
        log.info(
            "adopting %s: its pre-Alembic pico_schema version %d is revision %s; "
            "stamping %s (no table changes)",
            location,
            state.legacy,
            stamp,
            VERSION_TABLE,
        )
        _stamp(conn, stamp)
        if stamp == target:
            return
    if state.effective is not None:
        log.info(
            "upgrading the pico schema of %s from revision %s to %s",
            location,
            state.effective,
            target,
        )
    from alembic import command

    command.upgrade(_config(connection=conn), target)


def ensure(
    conn: Connection, *, upgrade: bool, location: str, url: str, dialect: str
) -> SchemaState:
    """Bring the database on ``conn`` to head inside the caller's transaction (which must
    hold the schema lock): create a fresh one, adopt a pre-Alembic one at version 4, and
    upgrade an older one only when ``upgrade`` (``SchemaOutdatedError`` otherwise). Returns
    the state found."""
    state = read_state(conn)
    if check(state, upgrade=upgrade, read_only=False, location=location, url=url, dialect=dialect):
        _migrate(conn, state, head_revision(), location)
    return state


def _resolve(revision: str, what: str) -> str:
    if revision == "head":
        return head_revision()
    if revision in REVISIONS:
        return revision
    raise InvalidArgumentError(
        f"{what} {revision!r} is not a pico schema revision; pick one of "
        f"{', '.join(REVISIONS)} or 'head' (pico db history lists them)"
    )


def upgrade(conn: Connection, target: str, *, location: str) -> tuple[SchemaState, str]:
    """Upgrade (or create, or adopt) the database on ``conn`` to ``target`` inside the
    caller's transaction; returns the state found and the revision it is at now. A target
    older than the database is ``InvalidArgumentError`` (pico never downgrades)."""
    goal = _resolve(target, "the target revision")
    state = read_state(conn)
    current = state.effective
    if current is not None and current not in REVISIONS:
        raise _newer(location, state.revision or f"pico_schema version {state.legacy}")
    if current is not None and REVISIONS.index(goal) < REVISIONS.index(current):
        raise InvalidArgumentError(
            f"the target revision {goal} is older than {location}'s revision {current}; "
            "pico schemas only move forward (restore a backup to go back)"
        )
    if state.revision != goal:
        _migrate(conn, state, goal, location)
    return state, goal


def _stamp_sql(revision: str, dialect: str) -> str:
    """``_stamp`` as SQL text: the version table and its one row."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.schema import CreateTable

    name = "sqlite://" if dialect == "sqlite" else "postgresql+psycopg://"
    compiled = CreateTable(_versions).compile(dialect=make_url(name).get_dialect()())
    return (
        f"{str(compiled).strip()};\n\n"
        f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{revision}');\n\n"
    )


def offline_sql(start: str | None, target: str, dialect: str, *, legacy: bool = False) -> str:
    """The SQL that upgrades a database at ``start`` (``None``: an empty one) to
    ``target``, for ``dialect`` (``sqlite`` or ``postgresql``), as one script a DBA
    reviews and applies, version-table updates included (Alembic's offline mode).
    ``legacy``: the database predates Alembic (``pico_schema`` at the version of
    ``start``, no version table), so the script stamps it at ``start`` first."""
    if dialect not in ("sqlite", "postgresql"):
        raise InvalidArgumentError(f"unknown SQL dialect {dialect!r}; use 'sqlite' or 'postgresql'")
    if legacy and start is None:
        raise InvalidArgumentError(
            "--legacy needs --from: the revision of the database's pico_schema version "
            f"(version N is revision 000N; {', '.join(LEGACY_REVISIONS.values())})"
        )
    if legacy and start not in LEGACY_REVISIONS.values():
        raise InvalidArgumentError(
            f"--legacy --from {start} names no pre-Alembic version; use one of "
            f"{', '.join(LEGACY_REVISIONS.values())} (pico_schema version N is 000N)"
        )
    goal = _resolve(target, "the target revision")
    if start is not None:
        begin = _resolve(start, "the starting revision")
        if REVISIONS.index(goal) < REVISIONS.index(begin):
            raise InvalidArgumentError(
                f"the target revision {goal} is older than the starting revision {begin}; "
                "pico schemas only move forward"
            )
        stamp = _stamp_sql(begin, dialect) if legacy else ""
        if begin == goal:
            return f"BEGIN;\n\n{stamp}COMMIT;\n" if stamp else ""
    from alembic import command

    buf = io.StringIO()
    cfg = _config(output_buffer=buf, dialect=dialect)
    command.upgrade(cfg, f"{begin}:{goal}" if start is not None else goal, sql=True)
    script = buf.getvalue()
    if start is not None and stamp:
        # Inside the script's one transaction, before the first revision's UPDATE.
        opening = "BEGIN;\n\n"
        assert script.startswith(opening), script[:40]
        script = opening + stamp + script[len(opening) :]
    return script
