"""The dependency-injector container: the only importer of ``dependency_injector``.

``open_storage`` is what ``Harness.open(url, ...)`` calls (registered by the ``pico``
package); embedders who want to swap a piece override a provider instead.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from dependency_injector import containers, providers

from pico.application.ports import Storage
from pico.domain.errors import UnknownSessionError
from pico.infrastructure.jsonl.snapshots import JsonlSnapshotRecorder
from pico.infrastructure.jsonl.store import JsonlRecorder, JsonlStore
from pico.infrastructure.memory import MemoryRecorder, named_database
from pico.infrastructure.settings import PicoSettings, mask_url, settings_for
from pico.infrastructure.sql import schema
from pico.infrastructure.sql.lease import SqlLeaseStore
from pico.infrastructure.sql.notify import conninfo
from pico.infrastructure.sql.store import SqlDatabase, SqlReadStore, SqlRecorder
from pico.infrastructure.storage import EventSourcedStorage

__all__ = ["Container", "open_storage"]

_databases: dict[tuple[str, str, bool], tuple[SqlDatabase, int]] = {}


def _sql_url(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _open_sql(
    url: str, durability: str, read_only: bool, *, shown: str, upgrade_schema: bool = False
) -> tuple[SqlDatabase, Any]:
    """One engine pair per URL per process and mode, shared by its sessions, closed with
    the last. A read-only database is opened apart (read-only connections, no DDL)."""
    key = (url, durability, read_only)
    db, count = _databases.get(key, (None, 0))
    if db is None:
        db = SqlDatabase(
            url,
            durability=durability,
            read_only=read_only,
            location=shown,
            upgrade_schema=upgrade_schema,
        )
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
            location=url,
            read_only=settings.read_only,
        )
    if url.startswith("jsonl:///"):
        store = JsonlStore(
            Path(url[len("jsonl:///") :]),
            sid,
            durability=settings.durability,
            read_only=settings.read_only,
        )
        snapshots = JsonlSnapshotRecorder(store)
        storage = EventSourcedStorage(
            sid,
            events=JsonlRecorder(store),
            snapshots=snapshots,
            read_store=store.read_store,
            location=store.location,
            read_only=settings.read_only,
        )
        try:
            store.open(storage.mapper)
            snapshots.load()  # after the journal: no snapshot may be ahead of its stream
        except BaseException:
            store.close()
            snapshots.close()
            raise
        return storage
    if settings.read_only and url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        if not path.exists():
            raise UnknownSessionError(f"{sid} (no database file at {path})")
    db, release = _open_sql(
        _sql_url(url),
        settings.durability,
        settings.read_only,
        shown=mask_url(url),
        upgrade_schema=settings.upgrade_schema,
    )
    if not db.has_schema:  # read-only, and the database holds no pico tables
        release()
        raise UnknownSessionError(f"{sid} (no pico tables in {db.location})")
    events = SqlRecorder(db)
    events.notify_commits = events.notify_commits and settings.notify_commits
    # Leases (Harness.open(lease=...)): PostgreSQL writers only; nothing connects until used.
    leases = None
    if db.dialect == "postgresql" and not settings.read_only:
        leases = functools.partial(SqlLeaseStore, conninfo(db.writer.url), location=db.location)
    return EventSourcedStorage(
        sid,
        events=events,
        snapshots=SqlRecorder(db, table=schema.snapshots),
        # Reads on the writing thread share the writer's warm connection (SQLite).
        read_store=SqlReadStore(db, sid, writer=events.writer),
        on_close=release,
        location=db.location,
        read_only=settings.read_only,
        leases=leases,
    )


class Container(containers.DeclarativeContainer):
    settings = providers.Dependency(instance_of=PicoSettings)
    storage = providers.Factory(build_storage, settings=settings)


def open_storage(url: str, *, session: str, durability: str | None, read_only: bool) -> Storage:
    """The storage of one session; a bad configuration raises ``ConfigurationError``, a
    database that cannot be reached or opened ``StorageUnavailableError``, a damaged one
    ``StorageCorruptError``, each with one sentence that stands alone (passwords masked)."""
    settings = settings_for(url, session=session, durability=durability, read_only=read_only)
    container = Container(settings=settings)
    storage: Storage = container.storage()
    return storage
