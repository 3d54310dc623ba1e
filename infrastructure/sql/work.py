"""Workers and inboxes on PostgreSQL (issue 16, docs/workers.md): ``pico_work``,
``pico_inbox`` and ``pico_leases`` behind ``application/worker.py``'s ``WorkQueue`` and
the API process's ``Inbox``.

Lock order, kept by every writer of these tables: a ``pico_work`` row before a
``pico_leases`` row (a pick, a release); a submit locks only the work row, a dead-lease
pick and a renewal only the lease row. So no two of them deadlock.

- **Pick** (``PICK_DUE``): due work rows, ``FOR UPDATE SKIP LOCKED`` (concurrent workers
  take disjoint rows and never wait for each other), deleted, and their leases inserted
  or taken over iff free or expired, in ONE statement. A row whose session is still
  leased is dropped: its owner is awake (notified, and polling its inboxes) and
  advertises what remains when it releases.
- **Dead owners** (``PICK_DEAD``): leases expired on the database's clock (a clean
  release deletes its row, so an expired row means its owner died or lost it), taken
  over with the same ``SKIP LOCKED``.
- **Submit** (``Inbox``): the work row set due now, the command inserted (or the one
  with the same request key found and compared), ``pg_notify('pico_work', session)``,
  in one transaction: the notification is delivered at COMMIT, never for a rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pico.application.harness import Harness
from pico.application.inbox import KINDS, InboxItem, check, raise_or_value
from pico.application.lease import Lease
from pico.application.worker import Worker
from pico.domain.errors import (
    ClosedError,
    ConfigurationError,
    InvalidArgumentError,
    PicoError,
    ReplyTimeoutError,
    RequestKeyConflictError,
    StorageUnavailableError,
    UnknownSessionError,
)
from pico.domain.ids import check_choice
from pico.domain.json import JsonValue, dumps, loads
from pico.infrastructure.settings import mask_url
from pico.infrastructure.sql.lease import release_advertising
from pico.infrastructure.sql.notify import conninfo as conninfo_for
from pico.infrastructure.sql.store import translate_error

__all__ = ["WORK_CHANNEL", "Inbox", "SqlWorkQueue", "Submitted", "open_worker"]

log = logging.getLogger("pico.worker")

#: Notified with a session id when work for it is submitted or advertised.
WORK_CHANNEL = "pico_work"
#: Notified with an inbox command's id when its reply is stored.
REPLY_CHANNEL = "pico_inbox"

PICK_DUE = """
WITH due AS (
    SELECT session_id FROM pico_work
     WHERE due_at <= now() AND session_id LIKE %(prefix)s
     ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM pico_work w USING due WHERE w.session_id = due.session_id
    RETURNING w.session_id
)
INSERT INTO pico_leases AS l (session_id, owner, expires_at, renewed_at)
SELECT session_id, %(owner)s, now() + make_interval(secs => %(ttl)s), now() FROM taken
ON CONFLICT (session_id) DO UPDATE
   SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at
 WHERE l.expires_at < now()
RETURNING l.session_id
"""

PICK_DEAD = """
WITH dead AS (
    SELECT session_id FROM pico_leases
     WHERE expires_at < now() AND session_id LIKE %(prefix)s
     ORDER BY expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE pico_leases l
   SET owner = %(owner)s, expires_at = now() + make_interval(secs => %(ttl)s), renewed_at = now()
  FROM dead WHERE l.session_id = dead.session_id
RETURNING l.session_id
"""

NEXT_DUE = """
SELECT greatest(extract(epoch FROM min(due_at) - now()), 0)::float8 FROM pico_work
 WHERE due_at < 'infinity' AND session_id LIKE %(prefix)s
"""

WAITING = """
SELECT DISTINCT session_id FROM pico_inbox
 WHERE done_at IS NULL AND session_id = ANY(%(sessions)s)
"""

PENDING = """
SELECT id, request_key, kind, payload FROM pico_inbox
 WHERE session_id = %(session)s AND done_at IS NULL ORDER BY id LIMIT 100
"""

REPLY = """
WITH done AS (
    UPDATE pico_inbox SET done_at = now(), result = %(reply)s
     WHERE id = %(id)s AND done_at IS NULL
       AND EXISTS (SELECT 1 FROM pico_leases
                    WHERE session_id = %(session)s AND owner = %(owner)s)
    RETURNING id
)
SELECT pg_notify('pico_inbox', id::text) FROM done
"""

MARK_DUE = """
INSERT INTO pico_work AS w (session_id, due_at) VALUES (%(session)s, now())
ON CONFLICT (session_id) DO UPDATE SET due_at = least(w.due_at, now())
"""

SESSION_EXISTS = "SELECT 1 FROM pico_sessions WHERE session_id = %(session)s"

SUBMIT = """
INSERT INTO pico_inbox (session_id, request_key, kind, payload, submitted_at)
VALUES (%(session)s, %(key)s, %(kind)s, %(payload)s, now())
ON CONFLICT (session_id, request_key) DO NOTHING
"""

SUBMITTED = """
SELECT id, kind, payload FROM pico_inbox WHERE session_id = %(session)s AND request_key = %(key)s
"""

NOTIFY_WORK = "SELECT pg_notify('pico_work', %(session)s)"

RESULT = "SELECT done_at IS NOT NULL, result FROM pico_inbox WHERE id = %(id)s"


def _conninfo(url: str) -> tuple[str, str]:
    """The libpq connection string and the masked location of a PostgreSQL URL; anything
    else is refused."""
    if not isinstance(url, str) or not url.startswith(
        ("postgresql://", "postgresql+", "postgres://")
    ):
        raise ConfigurationError(
            f"workers and inboxes need PostgreSQL (postgresql://user@host/db), not {url!r}: "
            "several processes share sessions through its lease and work tables; a SQLite "
            "file has one writer (docs/database.md)"
        )
    try:
        parsed = sa.make_url(url)
    except Exception as exc:
        raise ConfigurationError(f"{url!r} is not a database URL: {exc}") from exc
    return conninfo_for(parsed), mask_url(url)


class _Connection:
    """One lazily opened async autocommit connection; every failure is a PicoError and
    drops it (the next call reconnects)."""

    def __init__(self, conninfo: str, location: str, name: str) -> None:
        self.conninfo = conninfo
        self.location = location
        self.name = name
        self.conn: Any = None
        self.lock = asyncio.Lock()

    async def get(self) -> Any:
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, application_name=self.name, connect_timeout=10
            )
        return self.conn

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()

    def failed(self, exc: BaseException, doing: str) -> PicoError:
        self.drop()
        translated = translate_error(exc, self.location, doing, sqlite=False)
        if isinstance(translated, PicoError):
            return translated
        return StorageUnavailableError(
            f"PostgreSQL at {self.location} failed while {doing}: {exc}; check that the "
            "server is reachable and the schema is at head (pico db current)"
        )


class SqlWorkQueue:
    """A worker's side of the work tables (``application/worker.py``'s ``WorkQueue``):
    one connection for statements, one that LISTENs on ``pico_work``. ``prefix``: only
    sessions whose id starts with it (a pool of workers per tenant or application)."""

    def __init__(self, url: str, *, prefix: str = "") -> None:
        conninfo, location = _conninfo(url)
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise InvalidArgumentError(f"prefix must be text (a str), got {prefix!r}")
        self.location = location
        self.prefix = prefix
        self._like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        self._db = _Connection(conninfo, location, "pico-worker")
        self._listen = _Connection(conninfo, location, "pico-worker-listen")
        self._listening = False

    async def _rows(self, statement: str, params: dict[str, Any], doing: str) -> list[Any]:
        async with self._db.lock:
            try:
                conn = await self._db.get()
                cur = await conn.execute(statement, params)
                return list(await cur.fetchall()) if cur.description is not None else []
            except asyncio.CancelledError:
                self._db.drop()
                raise
            except Exception as exc:
                raise self._db.failed(exc, doing) from exc

    async def pick(self, owner: str, ttl: float, limit: int) -> list[str]:
        params = {"owner": owner, "ttl": float(ttl), "limit": limit, "prefix": self._like}
        taken = [r[0] for r in await self._rows(PICK_DUE, params, "picking due sessions")]
        if len(taken) < limit:
            params["limit"] = limit - len(taken)
            dead = await self._rows(PICK_DEAD, params, "taking over expired leases")
            taken.extend(r[0] for r in dead if r[0] not in taken)
        return taken

    async def next_due(self) -> float | None:
        rows = await self._rows(NEXT_DUE, {"prefix": self._like}, "reading when work is due")
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def waiting(self, session_ids: list[str] | Any) -> set[str]:
        params = {"sessions": list(session_ids)}
        return {r[0] for r in await self._rows(WAITING, params, "reading inboxes")}

    async def pending(self, session_id: str) -> list[InboxItem]:
        rows = await self._rows(PENDING, {"session": session_id}, "reading the session's inbox")
        items = []
        for command_id, key, kind, payload in rows:
            body = loads(payload)
            items.append(
                InboxItem(
                    int(command_id), session_id, key, kind, body if isinstance(body, dict) else {}
                )
            )
        return items

    async def reply(self, item: InboxItem, owner: str, reply: str) -> bool:
        params = {"id": item.id, "reply": reply, "session": item.session_id, "owner": owner}
        return bool(await self._rows(REPLY, params, "storing an inbox reply"))

    async def abandon(self, session_id: str, owner: str, due: float) -> None:
        params = {"session": session_id, "owner": owner, "due": float(due)}
        async with self._db.lock:
            try:
                await release_advertising(await self._db.get(), params)
            except Exception as exc:
                raise self._db.failed(exc, "giving a session back") from exc

    async def wait(self, timeout: float) -> set[str]:
        """Notifications on ``pico_work`` within ``timeout`` seconds (returns at the first
        batch); a connection problem sleeps the timeout instead (the poll is the
        fallback) and reconnects next time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        named: set[str] = set()
        try:
            conn = self._listen.conn
            if conn is None or conn.closed or not self._listening:
                conn = await asyncio.wait_for(self._listen.get(), max(timeout, 0.1))
                await conn.execute(f"LISTEN {WORK_CHANNEL}")
                self._listening = True
                return named  # freshly listening: the caller picks anyway
            remaining = deadline - loop.time()
            if remaining <= 0:
                return named
            async with contextlib.aclosing(conn.notifies(timeout=remaining)) as received:
                async for notify in received:
                    named.add(notify.payload)
                    break
            # Collect whatever else already arrived, without waiting.
            async with contextlib.aclosing(conn.notifies(timeout=0)) as more:
                async for notify in more:
                    named.add(notify.payload)
            return named
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("%s: LISTEN %s failed (%s); polling", self.location, WORK_CHANNEL, exc)
            self._listen.drop()
            self._listening = False
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            return named

    async def close(self) -> None:
        self._db.drop()
        self._listen.drop()


@dataclass(frozen=True)
class Submitted:
    """A command stored in a session's inbox: pass it to ``Inbox.reply`` for the owner's
    reply. ``duplicate`` is True when the request key named a command submitted before
    (this is that command, not a second one)."""

    id: int
    session_id: str
    request_key: str
    kind: str
    duplicate: bool = False


class Inbox:
    """Submit commands to sessions owned by workers (docs/workers.md): the API process's
    side of the one-writer rule. Each submission is durable when it returns; a worker
    that holds (or then takes) the session executes it in its own serialized command,
    idempotent by the request key, and stores the reply.

    ``async with pico.Inbox("postgresql://...") as inbox:``
    ``sent = await inbox.accept("s-42", "hello", request_id="req-1")``
    ``input_id = await inbox.reply(sent, timeout=30)``"""

    def __init__(self, url: str) -> None:
        conninfo, location = _conninfo(url)
        self.location = location
        self._db = _Connection(conninfo, location, "pico-inbox")
        self._listen = _Connection(conninfo, location, "pico-inbox-listen")
        self._listening = False
        self._closed = False

    async def __aenter__(self) -> Inbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        self._db.drop()
        self._listen.drop()

    # ------------------------------------------------------------------ commands
    async def accept(
        self,
        session: str,
        input: JsonValue,
        *,
        conversation_id: int | None = None,
        request_id: str | None = None,
    ) -> Submitted:
        """``ConversationHandle.accept`` on the owner (the root conversation unless
        ``conversation_id``); the reply is the input id."""
        return await self._input("accept", session, input, conversation_id, request_id)

    async def steer(
        self,
        session: str,
        input: JsonValue,
        *,
        conversation_id: int | None = None,
        request_id: str | None = None,
    ) -> Submitted:
        """``ConversationHandle.steer`` on the owner; the reply is the input id."""
        return await self._input("steer", session, input, conversation_id, request_id)

    async def follow_up(
        self,
        session: str,
        input: JsonValue,
        *,
        conversation_id: int | None = None,
        request_id: str | None = None,
    ) -> Submitted:
        """``ConversationHandle.follow_up`` on the owner; the reply is the input id."""
        return await self._input("follow_up", session, input, conversation_id, request_id)

    async def _input(
        self,
        kind: str,
        session: str,
        input: JsonValue,
        conversation_id: int | None,
        request_id: str | None,
    ) -> Submitted:
        payload = {"conversation_id": conversation_id, "input": input}
        return await self.submit(session, kind, payload, request_id)

    async def decide_approval(
        self, session: str, task_id: int, decision: str, *, request_id: str | None = None
    ) -> Submitted:
        """``Harness.decide_approval`` on the owner; the reply is the approval task id."""
        return await self.submit(
            session, "decide_approval", {"task_id": task_id, "decision": decision}, request_id
        )

    async def answer_tool_call(
        self,
        session: str,
        task_id: int,
        content: str,
        *,
        is_error: bool = False,
        request_id: str | None = None,
    ) -> Submitted:
        """``Harness.answer_tool_call`` on the owner; the reply is the result entry id."""
        return await self.submit(
            session,
            "answer_tool_call",
            {"task_id": task_id, "content": content, "is_error": is_error},
            request_id,
        )

    async def submit(
        self, session: str, kind: str, payload: dict[str, Any], request_id: str | None = None
    ) -> Submitted:
        """Store one command (``kind`` one of ``KINDS``) in the session's inbox and wake a
        worker. Validated first (``InvalidArgumentError``, nothing stored); an unknown
        session is ``UnknownSessionError`` (an inbox never creates a session); a request
        key already used for a different command is ``RequestKeyConflictError``."""
        if self._closed:
            raise ClosedError("", message="this inbox is closed; make a new pico.Inbox(url)")
        check_choice(kind, "an inbox command", KINDS)
        if not isinstance(session, str) or not session:
            raise InvalidArgumentError(f"session must be a session name (a str), got {session!r}")
        if not isinstance(payload, dict):
            raise InvalidArgumentError(f"payload must be a dict, got {type(payload).__name__}")
        body = check(kind, payload)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise InvalidArgumentError(
                f"request_id must be None or a non-empty str, got {request_id!r}"
            )
        key = request_id or f"inbox-{uuid.uuid4().hex}"
        params = {"session": session, "key": key, "kind": kind, "payload": dumps(body)}
        async with self._db.lock:
            try:
                conn = await self._db.get()
                async with conn.transaction():
                    if await (await conn.execute(SESSION_EXISTS, params)).fetchone() is None:
                        # An inbox never creates a session (a typo would make one).
                        raise UnknownSessionError(session)
                    await conn.execute(MARK_DUE, params)
                    inserted = (await conn.execute(SUBMIT, params)).rowcount == 1
                    row = await (await conn.execute(SUBMITTED, params)).fetchone()
                    if not inserted and (row[1] != kind or loads(row[2]) != body):
                        raise RequestKeyConflictError(key, f"for another command ({row[1]})")
                    await conn.execute(NOTIFY_WORK, params)
            except PicoError:
                raise
            except asyncio.CancelledError:
                self._db.drop()
                raise
            except Exception as exc:
                raise self._db.failed(exc, "submitting a command to the inbox") from exc
        return Submitted(int(row[0]), session, key, kind, duplicate=not inserted)

    async def reply(self, submitted: Submitted, *, timeout: float = 30.0) -> JsonValue:
        """The owner's reply: the command's value, or its error raised again (the same
        ``PicoError`` class with the owner's message). ``ReplyTimeoutError`` when no
        worker replied within ``timeout`` seconds (the command stays queued)."""
        if self._closed:
            raise ClosedError("", message="this inbox is closed; make a new pico.Inbox(url)")
        if not isinstance(submitted, Submitted):
            raise InvalidArgumentError(
                f"reply needs what submit returned (a Submitted), not {type(submitted).__name__}"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            done, text = await self._result(submitted.id)
            if done:
                return raise_or_value(text)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ReplyTimeoutError(submitted.session_id, submitted.id, timeout)
            await self._wait_reply(submitted.id, min(remaining, 1.0))

    async def _result(self, command_id: int) -> tuple[bool, str]:
        async with self._db.lock:
            try:
                conn = await self._db.get()
                row = await (await conn.execute(RESULT, {"id": command_id})).fetchone()
            except asyncio.CancelledError:
                self._db.drop()
                raise
            except Exception as exc:
                raise self._db.failed(exc, "reading an inbox reply") from exc
        if row is None:
            raise InvalidArgumentError(f"inbox command {command_id} does not exist")
        return bool(row[0]), row[1]

    async def _wait_reply(self, command_id: int, timeout: float) -> None:
        """Until a reply notification for ``command_id`` or ``timeout`` (the poll)."""
        try:
            conn = self._listen.conn
            if conn is None or conn.closed or not self._listening:
                conn = await asyncio.wait_for(self._listen.get(), max(timeout, 0.1))
                await conn.execute(f"LISTEN {REPLY_CHANNEL}")
                self._listening = True
                return  # re-read: the reply may have landed before LISTEN
            async with contextlib.aclosing(conn.notifies(timeout=timeout)) as received:
                async for notify in received:
                    if notify.payload == str(command_id):
                        return
        except asyncio.CancelledError:
            raise
        except Exception:
            self._listen.drop()
            self._listening = False
            await asyncio.sleep(timeout)


def open_worker(
    url: str,
    *,
    concurrency: int = 8,
    lease: Lease | None = None,
    idle_after: float = 2.0,
    poll_every: float = 2.0,
    permits: tuple[str, ...] = (),
    prefix: str = "",
    **options: Any,
) -> Worker:
    """A worker for the sessions of the PostgreSQL database at ``url`` (no I/O until
    ``await worker.run()``). ``options`` are ``Harness.open``'s for every session it
    takes (``provider=``, ``tools=``, ``hooks=``, ``definitions=``, ...); ``prefix``
    limits it to sessions whose id starts with it."""
    return Worker(
        url,
        SqlWorkQueue(url, prefix=prefix),
        opener=Harness.open,
        concurrency=concurrency,
        lease=lease,
        idle_after=idle_after,
        poll_every=poll_every,
        permits=permits,
        options=options,
    )
