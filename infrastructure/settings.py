"""Configuration: one pydantic settings model. Environment variables (``PICO_*``) are read
only when a ``PicoSettings`` is constructed, never at import time.

Every rule is checked here, once, and a violation raises ``ConfigurationError`` with one
sentence naming the value (passwords masked) and the accepted forms, never a pydantic
``ValidationError``.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pico.domain.errors import ConfigurationError

__all__ = [
    "DURABILITIES",
    "MAX_SESSION_NAME",
    "PicoSettings",
    "check_durability",
    "check_session_name",
    "check_storage_url",
    "mask_url",
    "settings_for",
]

#: Session names are stored in ``String(200)`` key columns of every table.
MAX_SESSION_NAME = 200

DURABILITIES = ("process", "fsync")

_URL_FORMS = (
    "use sqlite:///relative/path.db or sqlite:////absolute/path.db, memory:// or "
    "memory://name, jsonl:///relative/dir or jsonl:////absolute/dir, or "
    "postgresql://user@host/database"
)
_PG_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and logs)."""
    if "://" not in url or "@" not in url:
        return url
    from sqlalchemy.engine import make_url  # SQL URLs only: memory and JSONL never load it

    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # unparsable: mask everything between the scheme and the host
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"


def check_storage_url(url: object) -> str:
    """The storage URL, if it has a form pico can open; ``ConfigurationError`` otherwise."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"the storage URL is empty or not a string ({url!r}); {_URL_FORMS}"
        )
    shown = mask_url(url)
    if url.startswith("memory://"):
        return url
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///"):
            raise ConfigurationError(
                f"storage URL {shown!r} has no file path: a SQLite URL takes three slashes "
                "before a relative path (sqlite:///pico.db) and four before an absolute one "
                "(sqlite:////var/lib/pico.db); use memory:// for a database in memory"
            )
        path = url[len("sqlite:///") :]
        if not path:
            raise ConfigurationError(
                f"storage URL {shown!r} names no file; write sqlite:///pico.db (relative) or "
                "sqlite:////var/lib/pico.db (absolute)"
            )
        if "?" in path or "\x00" in path:
            raise ConfigurationError(
                f"storage URL {shown!r} carries options or a NUL byte; pico takes a plain "
                "file path (pass read_only= and durability= to Harness.open instead)"
            )
        return url
    if url.startswith("jsonl:"):
        if not url.startswith("jsonl:///") or not url[len("jsonl:///") :]:
            raise ConfigurationError(
                f"storage URL {shown!r} names no directory: a JSONL URL takes three slashes "
                "before a relative path (jsonl:///sessions) and four before an absolute one "
                "(jsonl:////var/lib/pico)"
            )
        if "?" in url or "\x00" in url:
            raise ConfigurationError(
                f"storage URL {shown!r} carries options or a NUL byte; pico takes a plain "
                "directory path (pass read_only= and durability= to Harness.open instead)"
            )
        return url
    if url.startswith(_PG_SCHEMES):
        from sqlalchemy.engine import make_url

        try:
            parsed = make_url(url)
            parsed.port  # noqa: B018 - parsing the port validates it
        except Exception as exc:
            raise ConfigurationError(
                f"storage URL {shown!r} is malformed ({type(exc).__name__}: the host, port or "
                "database part does not parse); write postgresql://user:password@host:5432/db"
            ) from None
        return url
    raise ConfigurationError(f"unsupported storage URL {shown!r}; {_URL_FORMS}")


def check_session_name(name: object) -> str:
    """A session name: 1-200 characters, no control characters, no lone surrogates (it is
    a key in every table and must encode as UTF-8 on every backend)."""
    if not isinstance(name, str):
        raise ConfigurationError(
            f"the session name must be a string, not {type(name).__name__} ({name!r})"
        )
    if not name or len(name) > MAX_SESSION_NAME:
        raise ConfigurationError(
            f"the session name must be 1 to {MAX_SESSION_NAME} characters long, not "
            f"{len(name)}; pick a short name such as 'main'"
        )
    for i, ch in enumerate(name):
        category = unicodedata.category(ch)
        if category in ("Cc", "Cs"):
            what = "a control character" if category == "Cc" else "a lone surrogate"
            raise ConfigurationError(
                f"the session name {name!r} holds {what} ({ord(ch):#06x}) at index {i}; use "
                "printable characters only"
            )
    return name


def check_durability(durability: object) -> str:
    if durability not in DURABILITIES:
        raise ConfigurationError(
            f"unknown durability {durability!r}; use 'process' (survives a crash of this "
            "process, the default) or 'fsync' (flushes every commit, survives power loss)"
        )
    return str(durability)


class PicoSettings(BaseSettings):
    """Where and how a session is stored.

    Attributes:
        storage_url: ``sqlite:///path.db`` (default), ``memory://`` or ``memory://name``,
            ``jsonl:///dir`` (plain files),
            ``postgresql://user@host/db`` (psycopg 3).
        session: the session name (1-200 characters, no control characters); many
            sessions share one database.
        durability: ``process`` survives a crash of this process (SQLite WAL with
            synchronous=NORMAL); ``fsync`` flushes every commit (synchronous=FULL), which
            also survives power loss.
        read_only: open without claiming, for audits and reports.
        upgrade_schema: the embedder's opt-in (``PICO_UPGRADE_SCHEMA=1``) to upgrading a
            SQL database whose schema is older than this code's, on open; without it
            such an open is refused with ``SchemaOutdatedError`` and nothing changes
            (``pico db upgrade URL`` upgrades it explicitly). A new database is always
            created, and a pre-Alembic one at the last legacy version always adopted.
        notify_commits: PostgreSQL: every write transaction ends with a ``NOTIFY`` on
            the session's channel, which wakes watchers in other processes at once
            (``PICO_NOTIFY_COMMITS=0`` turns it off: they poll instead). PostgreSQL
            serializes the commits of NOTIFYing transactions cluster-wide, so a large
            fleet of workers whose sessions nobody watches live may turn it off
            (docs/workers.md).
        pg_pool_max_size: PostgreSQL: the most connections this process's pool of one
            database opens (``PICO_PG_POOL_MAX_SIZE``, default 100). An open writing session
            holds two while open (its writer's, its reader's), a leased one a third; past
            the limit an open waits up to ``pg_pool_timeout`` seconds for one
            (``PICO_PG_POOL_TIMEOUT``, default 30), then fails with StorageUnavailableError.
            The first open of a database in a process sizes its pool.
    """

    model_config = SettingsConfigDict(env_prefix="PICO_", extra="forbid")

    storage_url: str = "sqlite:///pico.db"
    session: str = "main"
    durability: str = "process"
    read_only: bool = False
    upgrade_schema: bool = False
    notify_commits: bool = True
    pg_pool_max_size: int = Field(default=100, ge=1)
    pg_pool_timeout: float = Field(default=30.0, gt=0, allow_inf_nan=False)

    # ``mode="before"``: the checks see the raw value, so a wrong type is a
    # ConfigurationError too (pydantic passes non-ValueError exceptions through).
    @field_validator("storage_url", mode="before")
    @classmethod
    def _storage_url(cls, value: Any) -> str:
        return check_storage_url(value)

    @field_validator("session", mode="before")
    @classmethod
    def _session(cls, value: Any) -> str:
        return check_session_name(value)

    @field_validator("durability", mode="before")
    @classmethod
    def _durability(cls, value: Any) -> str:
        return check_durability(value)


def settings_for(
    url: object,
    *,
    session: object,
    durability: object = None,
    read_only: object = False,
    upgrade_schema: object = None,
) -> PicoSettings:
    """The settings for one open, checked by the one configuration gate: a mistake is a
    ``ConfigurationError`` whatever rule it breaks (pydantic's own errors included).
    ``upgrade_schema=None`` takes ``PICO_UPGRADE_SCHEMA`` from the environment."""
    extra: dict[str, Any] = {} if upgrade_schema is None else {"upgrade_schema": upgrade_schema}
    try:
        return PicoSettings(
            storage_url=url,  # type: ignore[arg-type]  # checked by the validators
            session=session,  # type: ignore[arg-type]
            durability="process" if durability is None else durability,  # type: ignore[arg-type]
            read_only=read_only,  # type: ignore[arg-type]
            **extra,
        )
    except ValidationError as exc:  # a rule the checks do not cover (e.g. read_only="x")
        errors = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigurationError(f"invalid storage options ({errors})") from None
