"""The dependency-injector container: the only importer of ``dependency_injector``.

One wiring of storage, model provider, tools, hooks, clock and telemetry (issue 17). An
embedding service declares ``pico.Container`` in its own container
(``providers.Container(pico.Container, config=config.pico)``), overrides any provider (a
test double, a ``FakeClock``, its own tracer) and opens with ``await container.harness()``.
``open_storage`` is what ``Harness.open(url, ...)`` calls (registered by the ``pico``
package): the same container's ``storage`` provider, so both paths open storage alike.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dependency_injector import containers, providers

from pico.application.clock import SystemClock
from pico.application.flows.job import default_job_directory
from pico.application.harness import Harness
from pico.application.hooks import Hooks
from pico.application.ports import Storage
from pico.application.telemetry import Telemetry
from pico.application.tools import Tool
from pico.domain.errors import ConfigurationError, PicoError, UnknownSessionError
from pico.infrastructure.jsonl.snapshots import JsonlSnapshotRecorder
from pico.infrastructure.jsonl.store import JsonlRecorder, JsonlStore
from pico.infrastructure.memory import MemoryRecorder, named_database
from pico.infrastructure.settings import PicoSettings, mask_url, settings_for
from pico.infrastructure.storage import EventSourcedStorage

if TYPE_CHECKING:
    from pico.infrastructure.sql.store import SqlDatabase

__all__ = ["Container", "open_harness", "open_storage"]

_databases: dict[tuple[str, str, bool], tuple[SqlDatabase, int]] = {}


def _sql_url(url: str) -> str:
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _open_sql(
    url: str,
    durability: str,
    read_only: bool,
    *,
    shown: str,
    upgrade_schema: bool = False,
    pool_max_size: int = 100,
    pool_timeout: float = 30.0,
) -> tuple[SqlDatabase, Any]:
    """One engine pair per URL per process and mode, shared by its sessions, closed with
    the last. A read-only database is opened apart (read-only connections, no DDL)."""
    from pico.infrastructure.sql.store import SqlDatabase

    key = (url, durability, read_only)
    db, count = _databases.get(key, (None, 0))
    if db is None:
        db = SqlDatabase(
            url,
            durability=durability,
            read_only=read_only,
            location=shown,
            upgrade_schema=upgrade_schema,
            pool_max_size=pool_max_size,
            pool_timeout=pool_timeout,
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
    # SQL storage only: SQLAlchemy (and the SQL adapters) load with the first SQL session,
    # so a service on memory or JSONL storage does not import them (half of `import pico`).
    from pico.infrastructure.sql import schema
    from pico.infrastructure.sql.lease import SqlLeaseStore
    from pico.infrastructure.sql.notify import conninfo
    from pico.infrastructure.sql.store import SqlReadStore, SqlRecorder

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
        pool_max_size=settings.pg_pool_max_size,
        pool_timeout=settings.pg_pool_timeout,
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
        # SQLite: snapshots are written on the events' connection, after the batch they
        # cover (storage.py ``save``). A commit from another connection would move its
        # ``PRAGMA data_version`` (the owner's mirrors would all be read again, as after
        # another writer's change) and empty its page cache.
        snapshots=SqlRecorder(
            db,
            table=schema.snapshots,
            writer=events.writer if db.dialect == "sqlite" else None,
        ),
        # Reads on the writing thread share the writer's warm connection (SQLite).
        read_store=SqlReadStore(db, sid, writer=events.writer),
        on_close=release,
        location=db.location,
        read_only=settings.read_only,
        leases=leases,
    )


def _settings(
    storage_url: object, session: object, durability: object, read_only: object
) -> PicoSettings:
    """The container's settings from its ``config`` (unset keys take ``Harness.open``'s
    defaults), checked by the one configuration gate."""
    return settings_for(
        "sqlite:///pico.db" if storage_url is None else storage_url,
        session="main" if session is None else session,
        durability=durability,
        read_only=False if read_only is None else read_only,
    )


def _options(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"the container's options (config.options) must be a mapping of Harness.open "
            f"keyword options, not {type(value).__name__}"
        )
    return dict(value)


# Harness.open's options that the container's own providers wire; ``options`` holds the rest.
_WIRED = frozenset(
    {"storage", "session", "durability", "read_only", "provider", "tools", "hooks", "clock"}
    | {"telemetry"}
)


def _resolve(name: str, provider: Callable[[], Any]) -> Any:
    """Call one of the container's providers; a failure names the provider."""
    try:
        return provider()
    except PicoError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"the container's {name!r} provider failed ({type(exc).__name__}: {exc}); check "
            f"what overrides container.{name}"
        ) from exc


def _wrong(name: str, value: object, wanted: str) -> ConfigurationError:
    return ConfigurationError(
        f"the container's {name!r} provider gave {type(value).__name__} ({value!r:.80}); "
        f"override container.{name} with {wanted}"
    )


async def open_harness(container: Any) -> Harness:
    """Open a harness from a ``pico.Container``'s providers (``await container.harness()``).

    Every provider is resolved and checked before storage is opened, so a bad override
    raises ``ConfigurationError`` naming the provider and opens nothing.
    """
    settings, storage, provider = container.settings, container.storage, container.model
    tools, hooks, clock = container.tools, container.hooks, container.clock
    telemetry, options = container.telemetry, container.options
    conf = _resolve("settings", settings)
    if not isinstance(conf, PicoSettings):
        raise _wrong("settings", conf, "a pico.PicoSettings")
    model = _resolve("model", provider)
    if model is not None and not (
        callable(getattr(model, "stream", None)) and callable(getattr(model, "poll", None))
    ):
        raise _wrong("model", model, "a pico.ModelProvider (stream() and poll())")
    offered = _resolve("tools", tools)
    if isinstance(offered, (str, bytes, Mapping)) or not isinstance(offered, Iterable):
        raise _wrong("tools", offered, "a list of pico.Tool")
    offered = list(offered)
    for tool in offered:
        if not isinstance(tool, Tool):
            raise _wrong("tools", tool, "a list of pico.Tool (one item is not a Tool)")
    hook_set = _resolve("hooks", hooks)
    if hook_set is not None and not isinstance(hook_set, Hooks):
        raise _wrong("hooks", hook_set, "a pico.Hooks")
    time = _resolve("clock", clock)
    if not (callable(getattr(time, "now", None)) and callable(getattr(time, "sleep_until", None))):
        raise _wrong("clock", time, "a pico.Clock (now() and sleep_until()), e.g. pico.FakeClock()")
    spans = _resolve("telemetry", telemetry)
    if spans is not None and not isinstance(spans, Telemetry):
        if not callable(getattr(spans, "start_as_current_span", None)):
            raise _wrong("telemetry", spans, "a pico Telemetry or an OpenTelemetry Tracer")
        spans = Telemetry(tracer=spans)  # an embedder's own tracer
    extra = _resolve("options", options)
    if not isinstance(extra, Mapping):
        raise _wrong("options", extra, "a dict of Harness.open keyword options")
    known = set(inspect.signature(Harness.open).parameters) - _WIRED - {"cls"}
    unknown = sorted(set(extra) - known)
    if unknown:
        wired = sorted(set(extra) & _WIRED)
        hint = f" ({', '.join(wired)} have providers of their own)" if wired else ""
        raise ConfigurationError(
            f"the container's 'options' provider names unknown Harness.open options "
            f"{unknown}{hint}; known: {sorted(known)}"
        )
    kwargs: dict[str, Any] = dict(extra)
    kwargs.setdefault("job_directory", default_job_directory(conf.storage_url, conf.session))
    if spans is not None:
        kwargs["telemetry"] = spans
    store = _resolve("storage", storage)
    if not all(hasattr(store, n) for n in ("session_id", "load", "save", "snapshot", "close")):
        raise _wrong("storage", store, "a pico.Storage (build_storage(settings) makes one)")
    try:
        return await Harness.open(
            store,
            read_only=conf.read_only,
            provider=model,
            tools=offered,
            hooks=hook_set,
            clock=time,
            **kwargs,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            store.close()  # idempotent: Harness.open closes it too once it got that far
        raise


class Container(containers.DeclarativeContainer):
    """pico's wiring. ``config`` keys: ``storage_url``, ``session``, ``durability``,
    ``read_only`` (``Harness.open``'s defaults when unset) and ``options`` (any other
    ``Harness.open`` keyword: ``model``, ``system``, ``max_attempts``, ...).

    Providers to override: ``settings`` (a ``PicoSettings``), ``storage`` (a ``Storage``
    built from the settings), ``model`` (a ``ModelProvider``; none by default),
    ``tools`` (a list of ``Tool``), ``hooks``, ``clock`` (``SystemClock``), ``telemetry``
    (a ``Telemetry`` or an OpenTelemetry ``Tracer``; default: the global tracer provider)
    and ``options``. ``harness`` opens a ``Harness`` from them (``await
    container.harness()``); a wrong override is a ``ConfigurationError`` naming it.
    """

    # The container itself (its copy, when declared inside an embedder's container):
    # ``harness`` reads each provider when it runs, so an override made later counts.
    __self__ = providers.Self()
    config = providers.Configuration()
    settings = providers.Factory(
        _settings, config.storage_url, config.session, config.durability, config.read_only
    )
    storage = providers.Factory(build_storage, settings=settings)
    # Named ``model``, not ``provider``: every dependency-injector provider has a
    # ``.provider`` attribute, which would shadow it inside an embedder's container.
    model: providers.Object[Any] = providers.Object(None)
    tools = providers.Object(())
    hooks: providers.Object[Any] = providers.Object(None)
    clock = providers.Singleton(SystemClock)
    telemetry: providers.Object[Any] = providers.Object(None)
    options = providers.Callable(_options, config.options)
    harness = providers.Coroutine(open_harness, __self__)


def open_storage(url: str, *, session: str, durability: str | None, read_only: bool) -> Storage:
    """The storage of one session; a bad configuration raises ``ConfigurationError``, a
    database that cannot be reached or opened ``StorageUnavailableError``, a damaged one
    ``StorageCorruptError``, each with one sentence that stands alone (passwords masked)."""
    settings = settings_for(url, session=session, durability=durability, read_only=read_only)
    container = Container(settings=settings)
    storage: Storage = container.storage()
    return storage
