"""The dependency-injector container: the only importer of ``dependency_injector``.

``open_storage`` is what ``Harness.open(url, ...)`` calls (registered by the ``pico``
package); embedders who want to swap a piece override a provider instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dependency_injector import containers, providers

from pico.application.ports import Storage
from pico.domain.errors import UnknownSessionError
from pico.infrastructure.memory import MemoryRecorder, named_database
from pico.infrastructure.settings import PicoSettings
from pico.infrastructure.sql import schema
from pico.infrastructure.sql.store import SqlDatabase, SqlReadStore, SqlRecorder
from pico.infrastructure.storage import EventSourcedStorage

__all__ = ["Container", "open_storage"]

_databases: dict[tuple[str, str], tuple[SqlDatabase, int]] = {}


def _sql_url(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _open_sql(url: str, durability: str) -> tuple[SqlDatabase, Any]:
    """One engine pair per URL per process, shared by its sessions, closed with the last."""
    key = (url, durability)
    db, count = _databases.get(key, (None, 0))
    if db is None:
        db = SqlDatabase(url, durability=durability)
    _databases[key] = (db, count + 1)

    def release() -> None:
        cur, n = _databases[key]
        if n <= 1:
            del _databases[key]
            cur.close()
        else:
            _databases[key] = (cur, n - 1)

    return db, release


def build_storage(settings: PicoSettings) -> Storage:
    url = settings.storage_url
    sid = settings.session
    if url.startswith("memory://"):
        mdb = named_database(url[len("memory://") :])
        return EventSourcedStorage(
            sid,
            events=MemoryRecorder(mdb),
            snapshots=MemoryRecorder(mdb, snapshots=True),
            read_store=mdb.read_store(sid),
        )
    if settings.read_only and url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not path.exists():
            raise UnknownSessionError(f"{sid} (no database file at {path})")
    db, release = _open_sql(_sql_url(url), settings.durability)
    events = SqlRecorder(db)
    return EventSourcedStorage(
        sid,
        events=events,
        snapshots=SqlRecorder(db, table=schema.snapshots),
        # Reads on the writing thread share the writer's warm connection (SQLite).
        read_store=SqlReadStore(db, sid, writer=events.writer),
        on_close=release,
    )


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=PicoSettings)
    storage = providers.Factory(build_storage, settings=settings)


def open_storage(url: str, *, session: str, durability: str | None, read_only: bool) -> Storage:
    settings = PicoSettings(
        storage_url=url,
        session=session,
        durability=durability or "process",  # type: ignore[arg-type]
        read_only=read_only,
    )
    container = Container(settings=settings)
    storage: Storage = container.storage()
    return storage
