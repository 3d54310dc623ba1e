"""Configuration: one pydantic settings model. Environment variables (``PICO_*``) are read
only when a ``PicoSettings`` is constructed, never at import time."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["PicoSettings"]


class PicoSettings(BaseSettings):
    """Where and how a session is stored.

    Attributes:
        storage_url: ``sqlite:///path.db`` (default), ``memory://`` or ``memory://name``,
            ``postgresql://user@host/db`` (psycopg 3).
        session: the session name; many sessions share one database.
        durability: ``process`` survives a crash of this process (SQLite WAL with
            synchronous=NORMAL); ``fsync`` flushes every commit (synchronous=FULL), which
            also survives power loss.
        read_only: open without claiming, for audits and reports.
    """

    model_config = SettingsConfigDict(env_prefix="PICO_", extra="forbid")

    storage_url: str = "sqlite:///pico.db"
    session: str = Field(default="main", min_length=1, max_length=200)
    durability: Literal["process", "fsync"] = "process"
    read_only: bool = False

    @field_validator("storage_url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith(
            ("sqlite://", "memory://", "postgresql://", "postgresql+psycopg://", "postgres://")
        ):
            raise ValueError(
                f"unsupported storage URL {value!r}: use sqlite:///path.db, memory://[name] "
                "or postgresql://user@host/database"
            )
        return value
