"""The session inspector's ASGI app (issue 15; seed 003 §9.4, §9.5): read-only JSON
endpoints over a session's read model, a Server-Sent Events stream of ``harness.watch``
events, and the static page in ``static/`` (no build step).

``create_app(harness)`` serves the ONE open session of an embedding service (or a test);
``create_app_for_url(url)`` opens a read-only handle per session name on demand (``pico
serve``). Nothing is written unless ``allow_decisions`` is set, and then only an approval
decision. Every failure is JSON ``{"error": <sentence>, "type": <error class>}``: 400 for
bad input, 401 without the bearer token, 403 for a refused decision, 404 for unknown ids,
never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from pico.application.audit import audit_records
from pico.application.harness import Harness
from pico.application.watch import (
    MAX_WATCH_LIMIT,
    WatchSignal,
    conversation_json,
    entry_json,
    task_json,
)
from pico.domain.errors import (
    ClosedError,
    CommandRejectedError,
    ConfigurationError,
    HandleFaultedError,
    InvalidArgumentError,
    PicoError,
    ReadOnlyError,
    StorageUnavailableError,
    UnknownConversationError,
    UnknownEntryError,
    UnknownSessionError,
    UnknownTaskError,
)
from pico.domain.ids import check_id, check_limit, check_position
from pico.domain.json import JsonValue
from pico.infrastructure.settings import check_session_name, check_storage_url, mask_url

__all__ = [
    "DecisionsNotAllowedError",
    "UnauthorizedError",
    "create_app",
    "create_app_for_url",
    "list_sessions",
]

STATIC = Path(__file__).parent / "static"
#: The largest page any list endpoint returns.
MAX_PAGE = 1000
#: Seconds between SSE keep-alive comments (proxies drop silent connections).
PING_SECONDS = 15


class UnauthorizedError(PicoError):
    """A request to a token-protected inspector without ``Authorization: Bearer <token>``
    (or, on the SSE endpoint only, ``?token=``)."""


class DecisionsNotAllowedError(PicoError):
    """An approval decision posted to an inspector started without ``allow_decisions``;
    nothing was written."""


# ---------------------------------------------------------------------- JSON shapes
def _error(exc: Exception, status: int) -> JSONResponse:
    return JSONResponse({"error": str(exc), "type": type(exc).__name__}, status_code=status)


def _status(exc: PicoError) -> int:
    if isinstance(exc, UnauthorizedError):
        return 401
    if isinstance(exc, (DecisionsNotAllowedError, ReadOnlyError)):
        return 403
    if isinstance(
        exc, (UnknownConversationError, UnknownTaskError, UnknownEntryError, UnknownSessionError)
    ):
        return 404
    if isinstance(exc, (CommandRejectedError, ConfigurationError)):
        return 400
    if isinstance(exc, (StorageUnavailableError, ClosedError, HandleFaultedError)):
        return 503
    return 409


# ---------------------------------------------------------------------- query parsing
def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw, 10)
    except ValueError:
        raise InvalidArgumentError(
            f"query parameter {name} must be an integer, got {raw[:40]!r}; e.g. ?{name}=10"
        ) from None


def _position(request: Request, name: str) -> int | None:
    value = _int(request, name)
    return None if value is None else check_position(value, name)


def _limit(request: Request, default: int, maximum: int = MAX_PAGE) -> int:
    value = _int(request, "limit")
    return default if value is None else check_limit(value, maximum=maximum)


def _bool(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise InvalidArgumentError(
        f"query parameter {name} must be true or false, got {raw[:40]!r}; e.g. ?{name}=true"
    )


def _path_id(request: Request, name: str) -> int:
    raw = request.path_params[name]
    try:
        value = int(raw, 10)
    except ValueError:
        raise InvalidArgumentError(
            f"{name} must be an integer id from 1, got {raw[:40]!r} in the path"
        ) from None
    return check_id(value, name)


# ---------------------------------------------------------------------- where sessions are
class _Sessions(Protocol):
    mode: str

    async def names(self) -> list[str]: ...
    async def get(self, name: str) -> Harness: ...
    async def decide(self, name: str, task_id: int, decision: str) -> int: ...
    async def close(self) -> None: ...


class _One:
    """The one open session of an embedding service."""

    mode = "harness"

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    async def names(self) -> list[str]:
        return [self.harness.session_id]

    async def get(self, name: str) -> Harness:
        if name != self.harness.session_id:
            raise UnknownSessionError(name)
        return self.harness

    async def decide(self, name: str, task_id: int, decision: str) -> int:
        return await (await self.get(name)).decide_approval(task_id, decision)

    async def close(self) -> None:
        """The embedder owns the harness: nothing to close."""


Writer = Callable[[str, str], Awaitable[Harness]]


class _ByUrl:
    """Read-only handles on the sessions of one storage URL, opened on first use."""

    mode = "url"

    def __init__(self, url: str, writer: Writer | None) -> None:
        self.url = url
        self.writer = writer
        self.open: dict[str, Harness] = {}
        self.lock = asyncio.Lock()

    async def names(self) -> list[str]:
        found = set(list_sessions(self.url)) | set(self.open)
        return sorted(found)

    async def get(self, name: str) -> Harness:
        check_session_name(name)
        async with self.lock:
            harness = self.open.get(name)
            if harness is None or harness.faulted is not None:
                if harness is not None:  # faulted: release its connections first
                    with contextlib.suppress(Exception):
                        await harness.close()
                harness = await Harness.open(self.url, session=name, read_only=True)
                self.open[name] = harness
            return harness

    async def decide(self, name: str, task_id: int, decision: str) -> int:
        await self.get(name)  # an unknown session is a 404 before anything is opened
        if self.writer is not None:
            harness = await self.writer(self.url, name)
        else:
            harness = await Harness.open(self.url, session=name)
        try:
            return await harness.decide_approval(task_id, decision)
        finally:
            await harness.close()

    async def close(self) -> None:
        for harness in self.open.values():
            await harness.close()
        self.open.clear()


def list_sessions(url: str) -> list[str]:
    """The session names stored at ``url`` (at most ``MAX_PAGE``), read without opening a
    session: SQL ``pico_sessions``, a JSONL directory's ``*.jsonl`` files; a memory URL
    lists none (its sessions live in the process that made them).

    Raises ``ConfigurationError`` (a bad URL) and ``StorageUnavailableError`` (the database
    cannot be read)."""
    check_storage_url(url)
    try:
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///") :])
            if not path.exists():
                return []
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'pico_sessions'"
                ).fetchall()
                if not rows:
                    return []
                return [
                    str(r[0])
                    for r in con.execute(
                        "SELECT session_id FROM pico_sessions ORDER BY session_id LIMIT ?",
                        (MAX_PAGE,),
                    )
                ]
            finally:
                con.close()
        if url.startswith(("postgresql://", "postgres://")):
            return _postgres_sessions(url)
        if url.startswith("jsonl:///"):
            directory = Path(url[len("jsonl:///") :])
            if not directory.is_dir():
                return []
            return sorted(unquote(p.stem) for p in directory.glob("*.jsonl"))[:MAX_PAGE]
    except (OSError, sqlite3.Error) as exc:
        raise StorageUnavailableError(
            f"cannot list the sessions in {mask_url(url)} ({type(exc).__name__}: {exc}); "
            "check that the database exists and is readable"
        ) from None
    return []


def _postgres_sessions(url: str) -> list[str]:
    import sqlalchemy

    engine = sqlalchemy.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    try:
        with engine.connect() as con:
            if not sqlalchemy.inspect(con).has_table("pico_sessions"):
                return []
            rows = con.execute(
                sqlalchemy.text(
                    "SELECT session_id FROM pico_sessions ORDER BY session_id LIMIT :n"
                ),
                {"n": MAX_PAGE},
            )
            return [str(r[0]) for r in rows]
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise StorageUnavailableError(
            f"cannot list the sessions in {mask_url(url)} ({type(exc).__name__}); check that "
            "the server is reachable and the database exists"
        ) from None
    finally:
        engine.dispose()


# ---------------------------------------------------------------------- the bearer token
class _TokenGate:
    """With a token, every ``/api`` request needs ``Authorization: Bearer <token>``; the
    SSE endpoint also takes ``?token=`` (EventSource cannot set headers). The page and its
    static files hold no session data and are served to anyone who can reach the port."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["path"]).startswith("/api"):
            request = Request(scope)
            given = ""
            header = request.headers.get("authorization", "")
            if header.lower().startswith("bearer "):
                given = header[7:].strip()
            elif str(scope["path"]).endswith("/watch"):
                given = request.query_params.get("token", "")
            if not hmac.compare_digest(given.encode(), self.token):
                response = _error(
                    UnauthorizedError(
                        "this inspector needs its token: send the header 'Authorization: "
                        "Bearer <token>' (the page takes it once from ?token=<token>)"
                    ),
                    401,
                )
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------- the app
def _same_origin(request: Request) -> None:
    """A decision is a JSON POST from the inspector's own page. Refused, writing nothing:
    another content type (a cross-site form or ``no-cors`` fetch can send only simple ones
    without a preflight), an ``Origin`` that is not this server, a browser's
    ``Sec-Fetch-Site`` other than same-origin."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise InvalidArgumentError(
            f"a decision must be sent as application/json, got {kind or 'no content type'!r}; "
            "nothing was written"
        )
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        raise DecisionsNotAllowedError(
            f"a decision from another origin ({origin[:80]!r}) is refused; nothing was "
            "written. Decide from the inspector's own page"
        )
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise DecisionsNotAllowedError(
            f"a cross-site decision (Sec-Fetch-Site: {site[:40]}) is refused; nothing was written"
        )


#: The host names ``pico serve`` answers by default: loopback only, so a page on another
#: site cannot reach the inspector through a DNS name rebound to 127.0.0.1.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def _build(sessions: _Sessions, *, allow_decisions: bool, token: str | None) -> ASGIApp:
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigurationError("the inspector token must be a non-empty string, or None")

    Handler = Callable[[Request], Awaitable[Response]]

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except PicoError as exc:
                return _error(exc, _status(exc))

        return run

    async def harness_of(request: Request) -> Harness:
        return await sessions.get(request.path_params["session"])

    async def conversation_of(request: Request) -> tuple[Harness, int]:
        h = await harness_of(request)
        cid = _path_id(request, "conversation_id")
        if cid not in await h.get_conversations([cid]):
            raise UnknownConversationError(cid)
        return h, cid

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def config(request: Request) -> Response:
        return JSONResponse({"allow_decisions": allow_decisions, "mode": sessions.mode})

    async def session_list(request: Request) -> Response:
        items: list[JsonValue] = []
        for name in await sessions.names():
            items.append({"name": name})
        return JSONResponse({"items": items})

    async def session_one(request: Request) -> Response:
        h = await harness_of(request)
        meta = h.meta()
        return JSONResponse(
            {
                "name": h.session_id,
                "head": h.head(),
                "main_head": h.main_head(),
                "root_id": None if meta is None else meta.root_id,
                "owner": None if meta is None else meta.owner,
            }
        )

    async def conversations(request: Request) -> Response:
        h = await harness_of(request)
        page = await h.conversations(
            after=_position(request, "after"),
            before=_position(request, "before"),
            limit=_limit(request, 100),
        )
        return JSONResponse(
            {
                "items": [conversation_json(c) for c in page.items],
                "as_of": page.as_of,
                "next": page.next,
                "root_id": None if (meta := h.meta()) is None else meta.root_id,
            }
        )

    async def conversation(request: Request) -> Response:
        h, cid = await conversation_of(request)
        found = await h.get_conversations([cid])
        return JSONResponse(conversation_json(found[cid]))

    async def entries(request: Request) -> Response:
        h, cid = await conversation_of(request)
        page = await h.entries(
            cid,
            after=_position(request, "after"),
            before=_position(request, "before"),
            limit=_limit(request, 100),
            as_of=_position(request, "as_of"),
        )
        return JSONResponse(
            {"items": [entry_json(e) for e in page.items], "as_of": page.as_of, "next": page.next}
        )

    async def context(request: Request) -> Response:
        h, cid = await conversation_of(request)
        as_of = _position(request, "as_of")
        handle = await h.conversation(cid)
        assert handle is not None  # conversation_of checked it exists
        if as_of is None:
            snap = await handle.snapshot()
            ids = snap.context
            as_of = h.main_head()
        else:
            ids = await handle.context_as_of(as_of)
        return JSONResponse({"conversation_id": cid, "as_of": as_of, "context": list(ids)})

    async def tasks(request: Request) -> Response:
        h = await harness_of(request)
        cid = _int(request, "conversation_id")
        page = await h.tasks(
            conversation_ids=None if cid is None else [check_id(cid, "conversation_id")],
            live=_bool(request, "live"),
            kind=request.query_params.get("kind") or None,
            after=_position(request, "after"),
            limit=_limit(request, 100),
        )
        return JSONResponse(
            {"items": [task_json(t) for t in page.items], "as_of": page.as_of, "next": page.next}
        )

    async def task(request: Request) -> Response:
        h = await harness_of(request)
        tid = _path_id(request, "task_id")
        found = await h.task(tid)
        if found is None:
            raise UnknownTaskError(tid)
        return JSONResponse(task_json(found))

    async def approvals(request: Request) -> Response:
        h = await harness_of(request)
        cid = _int(request, "conversation_id")
        pending = await h.pending_approvals(
            None if cid is None else check_id(cid, "conversation_id")
        )
        return JSONResponse(
            {"items": [task_json(t) for t in pending], "allow_decisions": allow_decisions}
        )

    async def decide(request: Request) -> Response:
        if not allow_decisions:
            raise DecisionsNotAllowedError(
                "this inspector is read-only: approval decisions are refused and nothing was "
                "written; start it with --allow-decisions (create_app(..., "
                "allow_decisions=True)) to grant or deny"
            )
        _same_origin(request)
        name = request.path_params["session"]
        tid = _path_id(request, "task_id")
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None
        decision = body.get("decision") if isinstance(body, dict) else None
        if decision not in ("grant", "deny"):
            raise InvalidArgumentError(
                f'the request body must be JSON {{"decision": "grant"}} or '
                f'{{"decision": "deny"}}, got {(await request.body())[:80]!r}; nothing '
                "was written"
            )
        approval = await sessions.decide(name, tid, str(decision))
        return JSONResponse({"approval": approval, "decision": decision})

    async def audit(request: Request) -> Response:
        h = await harness_of(request)
        after = _position(request, "after") or 0
        limit = _limit(request, 100)
        records = list(itertools.islice(audit_records(h, after=after, page=limit + 1), limit + 1))
        more = len(records) > limit
        records = records[:limit]
        return JSONResponse(
            {
                "items": [r.to_json() for r in records],
                "next": records[-1].position if more and records else None,
            }
        )

    async def watch(request: Request) -> Response:
        h, cid = await conversation_of(request)
        limit = _limit(request, 50, maximum=MAX_WATCH_LIMIT)
        stream = h.watch(cid, limit=limit)  # the base is read and registered now

        async def events() -> AsyncIterator[dict[str, str]]:
            try:
                async for event in stream:
                    body = event.to_json()
                    yield {"event": str(body["type"]), "data": json.dumps(body)}
                    if isinstance(event, WatchSignal) and event.kind in (
                        "rebind",
                        "fault",
                        "closed",
                    ):
                        return  # the client reconnects for a fresh base
            finally:
                stream.close()

        return EventSourceResponse(events(), ping=PING_SECONDS)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        detail = exc.detail if isinstance(exc, HTTPException) else "not found"
        return JSONResponse(
            {"error": f"{detail}: {request.method} {request.url.path}", "type": "HTTPException"},
            status_code=status,
        )

    async def unexpected(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            {
                "error": f"unexpected {type(exc).__name__} while answering {request.url.path}; "
                "see the server log",
                "type": "InternalError",
            },
            status_code=500,
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await sessions.close()

    s = "/api/sessions/{session}"
    c = s + "/conversations/{conversation_id}"
    routes = [
        Route("/", index),
        Route("/api/config", guarded(config)),
        Route("/api/sessions", guarded(session_list)),
        Route(s, guarded(session_one)),
        Route(s + "/conversations", guarded(conversations)),
        Route(c, guarded(conversation)),
        Route(c + "/entries", guarded(entries)),
        Route(c + "/context", guarded(context)),
        Route(c + "/watch", guarded(watch)),
        Route(s + "/tasks", guarded(tasks)),
        Route(s + "/tasks/{task_id}", guarded(task)),
        Route(s + "/approvals", guarded(approvals)),
        Route(s + "/approvals/{task_id}", guarded(decide), methods=["POST"]),
        Route(s + "/audit", guarded(audit)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    exception_handlers: dict[Any, Any] = {HTTPException: not_found, Exception: unexpected}
    app: ASGIApp = Starlette(
        routes=routes, exception_handlers=exception_handlers, lifespan=lifespan
    )
    if token is not None:
        app = _TokenGate(app, token)
    return app


def _hosts(app: ASGIApp, allowed_hosts: Sequence[str] | None) -> ASGIApp:
    if allowed_hosts is None:
        return app
    return TrustedHostMiddleware(app, allowed_hosts=list(allowed_hosts))


def create_app(
    harness: Harness,
    *,
    allow_decisions: bool = False,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> ASGIApp:
    """The inspector for ONE open harness (an embedding service mounts it beside its own
    routes). The caller keeps owning the harness: the app never closes it, and writes
    through it only a decision, only when ``allow_decisions``, only as a same-origin JSON
    POST. ``allowed_hosts`` (e.g. ``LOOPBACK_HOSTS``) refuses any other ``Host`` header
    (400), against DNS rebinding; None leaves that to the embedding service.

    Raises ``ConfigurationError`` for an empty token."""
    app = _build(_One(harness), allow_decisions=allow_decisions, token=token)
    return _hosts(app, allowed_hosts)


def create_app_for_url(
    url: str,
    *,
    allow_decisions: bool = False,
    token: str | None = None,
    writer: Writer | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> ASGIApp:
    """The inspector for every session at a storage URL (``pico serve``): each session is
    opened READ-ONLY on first use and closed when the app shuts down. With
    ``allow_decisions`` a decision opens a writing handle for that one command —
    ``writer(url, session)`` if given (an embedder passes its provider, tools and hooks),
    else ``Harness.open(url, session=...)`` — and closes it; a writing open claims the
    session, so a running owner is fenced (decide through the owner's own app instead).

    Raises ``ConfigurationError`` for a malformed URL or an empty token."""
    check_storage_url(url)
    app = _build(_ByUrl(url, writer), allow_decisions=allow_decisions, token=token)
    return _hosts(app, allowed_hosts)
