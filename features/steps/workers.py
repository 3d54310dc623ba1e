"""Steps for workers and inboxes on PostgreSQL (§1.2 "One writer per session", §6.6,
§8.1; issue 16): sessions created with ``Harness.open``, workers from ``pico.open_worker``
running on the scenario's event loop, commands submitted through ``pico.Inbox`` as an API
process would, and what they did read back with read-only opens.

Every scenario gets its own session prefix, and its workers see only sessions with it
(the test database is shared). All workers of a scenario share one faux model, whose
script the scenario writes, and two tools: ``read`` (logs its arguments; held for
approval when the scenario says so) and ``rendezvous`` (waits until the scenario opens
it, so "held at once" is a state the scenario waits for, not a race it hopes to win).

SQL is used only where no public API reaches: to simulate an owner that died holding
its lease (a lease row in another owner's name, expired on the database's clock when the
scenario says so), and to read the lease and inbox rows a scenario asserts on.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from pytest_bdd import given, parsers, then, when

import pico
from features.steps.library import World, _names

#: Seconds a scenario waits for a worker to do something before it fails.
WAIT = 30.0
#: Worker timings: release after 0.3 s idle, look for work every 0.2 s (notifications
#: wake it sooner).
IDLE_AFTER = 0.3
POLL_EVERY = 0.2
#: The dead owner a scenario simulates.
DEAD_OWNER = "dead-host:4242:feature"

_HOW = {"ask": "accept", "asks": "accept", "steer with": "steer", "follow up with": "follow_up"}


@dataclass
class Pool:
    """What the worker steps keep between steps."""

    url: str
    prefix: str
    provider: pico.FauxProvider = field(default_factory=lambda: pico.FauxProvider([]))
    hold_tools: bool = False
    workers: dict[str, pico.Worker] = field(default_factory=dict)
    tasks: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    inbox: pico.Inbox | None = None
    sent: dict[str, list[pico.Submitted]] = field(default_factory=dict)
    replies: dict[str, Any] = field(default_factory=dict)
    ran_with: list[pico.JsonObject] = field(default_factory=list)
    arrived: list[str] = field(default_factory=list)  # rendezvous calls waiting
    rendezvous: asyncio.Event = field(default_factory=asyncio.Event)
    approval: int | None = None

    def sid(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def the_inbox(self) -> pico.Inbox:
        if self.inbox is None:
            self.inbox = pico.Inbox(self.url)
        return self.inbox

    def worker(self, name: str) -> pico.Worker:
        found = self.workers.get(name)
        if found is None:
            raise AssertionError(f"no worker is called {name!r} in this scenario")
        return found

    def tools(self) -> list[pico.Tool]:
        async def read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            self.ran_with.append(args)
            return f"read {args.get('path', 'everything')}"

        async def rendezvous(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
            self.arrived.append(ctx.call_id)
            await self.rendezvous.wait()
            return "met"

        schema: pico.JsonObject = {"type": "object"}
        return [
            pico.Tool("read", "Read a file", schema, read),
            pico.Tool("rendezvous", "Wait for the others", schema, rendezvous),
        ]

    def hooks(self) -> pico.Hooks | None:
        if not self.hold_tools:
            return None

        async def before(call: pico.ToolCall) -> pico.ToolDecision:
            return pico.ToolDecision("hold", "reading needs a person")

        return pico.Hooks(before_tool=before)

    def start(self, name: str, *, concurrency: int = 8, ttl: float = 10.0) -> None:
        """Start a worker on the running loop (it runs whenever a step runs the loop)."""
        if name in self.workers:
            raise AssertionError(f"worker {name!r} was started already")
        options: dict[str, Any] = {"provider": self.provider, "tools": self.tools()}
        hooks = self.hooks()
        if hooks is not None:
            options["hooks"] = hooks
        worker = pico.open_worker(
            self.url,
            concurrency=concurrency,
            lease=pico.Lease(ttl=ttl, renew_every=ttl / 4),
            idle_after=IDLE_AFTER,
            poll_every=POLL_EVERY,
            prefix=self.prefix,
            **options,
        )
        self.workers[name] = worker
        self.tasks[name] = asyncio.ensure_future(worker.run())

    async def shutdown(self) -> None:
        self.rendezvous.set()
        for worker in self.workers.values():
            worker.stop()
        tasks = list(self.tasks.values())
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=WAIT)
            for task in pending:
                task.cancel()
        if self.inbox is not None:
            await self.inbox.close()


def _pool(world: World) -> Pool:
    found: Pool | None = getattr(world, "pool", None)
    assert found is not None, "the scenario has no workers' pool (start with its Given steps)"
    return found


def _ensure_pool(world: World, request: pytest.FixtureRequest) -> Pool:
    found: Pool | None = getattr(world, "pool", None)
    if found is None:
        assert world.backend.name == "postgresql", "workers and inboxes need PostgreSQL"
        found = Pool(world.backend.url, f"wf-{uuid.uuid4().hex[:8]}-")
        world.pool = found  # type: ignore[attr-defined]
        pool = found
        request.addfinalizer(lambda: world.run(pool.shutdown()))
    return found


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT) -> Any:
    """Poll ``check`` (the workers run meanwhile) until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await check()
        if found:
            return found
        if loop.time() >= deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def _reading(url: str, session: str, read: Callable[[pico.Harness], Awaitable[Any]]) -> Any:
    """Read the session's durable state through a read-only open (no claim, no lease)."""
    h = await pico.Harness.open(url, session=session, read_only=True)
    try:
        return await read(h)
    finally:
        await h.close()


def _sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return list(cur.fetchall()) if cur.description is not None else []


async def _reply(pool: Pool, question: str) -> Any:
    if question not in pool.replies:
        sent = pool.sent.get(question)
        assert sent, f"nothing called {question!r} was submitted in this scenario"
        pool.replies[question] = await pool.the_inbox().reply(sent[0], timeout=WAIT)
    return pool.replies[question]


# ------------------------------------------------------------------ Given


@given(parsers.re(r'the sessions? "(?P<names>[^"]+)" exists?$'), target_fixture="world")
def sessions_exist(world: World, request: pytest.FixtureRequest, names: str) -> World:
    pool = _ensure_pool(world, request)

    async def create() -> None:
        for name in _names(names):
            h = await pico.Harness.open(pool.url, session=pool.sid(name))
            await h.close()

    world.run(create())
    return world


@given(parsers.re(r'the workers\' model will answer "(?P<text>[^"]+)"(?: (?P<n>\d+) times)?$'))
def workers_model_answers(
    world: World, request: pytest.FixtureRequest, text: str, n: str | None
) -> None:
    pool = _ensure_pool(world, request)
    pool.provider.script.extend([text] * int(n or 1))


@given(
    parsers.re(
        r'the workers\' model will call the tool "(?P<tool>[^"]+)"'
        r"(?: with (?P<args>\{.*\}))?(?: (?P<n>\d+) times)?$"
    )
)
def workers_model_calls(
    world: World, request: pytest.FixtureRequest, tool: str, args: str | None, n: str | None
) -> None:
    pool = _ensure_pool(world, request)
    arguments: pico.JsonObject = json.loads(args) if args else {}
    for _ in range(int(n or 1)):
        pool.provider.script.append(pico.FauxResponse(tool_calls=[(tool, arguments)]))


@given("the sessions' tool calls need approval")
def tools_need_approval(world: World, request: pytest.FixtureRequest) -> None:
    _ensure_pool(world, request).hold_tools = True


@given(parsers.parse('the owner of "{session}" died holding its lease'))
def owner_died(world: World, session: str) -> None:
    """A lease row in another owner's name, valid for an hour: what a killed worker
    leaves behind, until the database's clock passes its expiry."""
    pool = _pool(world)
    _sql(
        pool.url,
        "INSERT INTO pico_leases (session_id, owner, expires_at, renewed_at) "
        "VALUES (%s, %s, now() + interval '1 hour', now())",
        pool.sid(session),
        DEAD_OWNER,
    )


@given(parsers.parse('worker "{name}" is serving the sessions'))
@when(parsers.parse('worker "{name}" is serving the sessions'))
def worker_serving(world: World, request: pytest.FixtureRequest, name: str) -> None:
    pool = _ensure_pool(world, request)

    async def start() -> None:
        pool.start(name)

    world.run(start())


@given(parsers.parse('worker "{name}" is serving the sessions under leases of {ttl:d} seconds'))
def worker_serving_long(world: World, name: str, ttl: int) -> None:
    pool = _pool(world)

    async def start() -> None:
        pool.start(name, ttl=float(ttl))

    world.run(start())


# ------------------------------------------------------------------ When


def _submit(world: World, how: str, text: str, session: str, key: str | None) -> None:
    pool = _pool(world)
    inbox = pool.the_inbox()
    method = getattr(inbox, _HOW[how])
    sent: pico.Submitted = world.run(method(pool.sid(session), text, request_id=key))
    pool.sent.setdefault(text, []).append(sent)


@when(
    parsers.re(
        r'an API process asks "(?P<text>[^"]+)" in "(?P<session>[^"]+)"'
        r'(?: with the request "(?P<key>[^"]+)")?(?: again)?$'
    )
)
def api_asks(world: World, text: str, session: str, key: str | None) -> None:
    _submit(world, "asks", text, session, key)


@when(parsers.parse('an API process asks "{text}" in each of "{sessions}"'))
def api_asks_each(world: World, text: str, sessions: str) -> None:
    pool = _pool(world)
    for session in _names(sessions):
        _submit(world, "asks", text, session, None)
        pool.sent[f"{text}@{session}"] = [pool.sent[text].pop()]


@when(
    parsers.re(
        r"an API process tries to (?P<how>ask|steer with|follow up with) "
        r'"(?P<text>[^"]+)" in "(?P<session>[^"]+)"(?: with the request "(?P<key>[^"]+)")?$'
    )
)
def api_tries(
    world: World, request: pytest.FixtureRequest, how: str, text: str, session: str, key: str | None
) -> None:
    pool = _ensure_pool(world, request)
    world.error = None
    try:
        submit = getattr(pool.the_inbox(), _HOW[how])
        sent = world.run(submit(pool.sid(session), text, request_id=key))
    except pico.PicoError as exc:
        world.error = exc
    else:
        pool.sent.setdefault(text, []).append(sent)


@when(
    parsers.re(
        r'workers "(?P<names>[^"]+)", each holding (?P<n>\d+) sessions? at a time, start '
        r"serving at the same moment"
    ),
    converters={"n": int},
)
def workers_start_together(world: World, names: str, n: int) -> None:
    pool = _pool(world)

    async def start() -> None:
        for name in _names(names):  # no await between them: both first pick concurrently
            pool.start(name, concurrency=n)

    world.run(start())


@when(parsers.parse('worker "{name}" stops'))
def worker_stops(world: World, name: str) -> None:
    pool = _pool(world)
    pool.worker(name).stop()
    world.run(asyncio.wait_for(pool.tasks[name], WAIT))


@when("the rendezvous opens")
def rendezvous_opens(world: World) -> None:
    _pool(world).rendezvous.set()


@when(parsers.parse('the dead owner\'s lease of "{session}" expires'))
def dead_lease_expires(world: World, session: str) -> None:
    pool = _pool(world)
    rows = _sql(
        pool.url,
        "UPDATE pico_leases SET expires_at = now() - interval '1 second' "
        "WHERE session_id = %s AND owner = %s RETURNING session_id",
        pool.sid(session),
        DEAD_OWNER,
    )
    assert len(rows) == 1, "the dead owner's lease row was gone before it expired"


@when(parsers.parse('an API process grants the waiting approval of "{session}"'))
def api_grants(world: World, session: str) -> None:
    pool = _pool(world)
    assert pool.approval is not None, "no approval was seen waiting"
    sent = world.run(pool.the_inbox().decide_approval(pool.sid(session), pool.approval, "grant"))
    pool.sent["the approval"] = [sent]


# ------------------------------------------------------------------ Then


@then(parsers.parse('the inbox replies with the input "{text}" stored in "{session}"'))
def replies_with_input(world: World, text: str, session: str) -> None:
    pool = _pool(world)
    input_id = world.run(_reply(pool, text))
    assert isinstance(input_id, int), input_id
    entry = world.run(_reading(pool.url, pool.sid(session), lambda h: h.entry(input_id)))
    assert entry is not None and entry.kind == "user" and entry.content == text, entry


async def _answer(pool: Pool, session: str, question: str, input_id: int) -> Any:
    async def done(h: pico.Harness) -> Any:
        root = await h.root()
        result = await pico.ConversationHandle(h, root.id).result(input_id)
        if result is None or result.status != "done" or result.entry_id is None:
            return None
        return await h.entry(result.entry_id)

    return await _until(
        lambda: _reading(pool.url, pool.sid(session), done), f"the answer to {question!r}"
    )


@then(parsers.parse('"{session}" answers "{question}" with "{text}"'))
def answers_with(world: World, session: str, question: str, text: str) -> None:
    pool = _pool(world)
    input_id = world.run(_reply(pool, question))
    entry = world.run(_answer(pool, session, question, input_id))
    assert entry.kind == "assistant" and entry.content == {"text": text}, entry


@then(parsers.parse('each of "{sessions}" answers "{question}" with "{text}"'))
def each_answers(world: World, sessions: str, question: str, text: str) -> None:
    for session in _names(sessions):
        answers_with(world, session, f"{question}@{session}", text)


@then(parsers.parse('worker "{name}" released "{session}" as idle'))
def released_idle(world: World, name: str, session: str) -> None:
    pool = _pool(world)
    worker, sid = pool.worker(name), pool.sid(session)

    async def released() -> bool:
        return (sid, "idle") in worker.finished

    world.run(_until(released, f"worker {name!r} releasing {session!r}"))
    assert [why for s, why in worker.finished if s == sid][-1] == "idle", worker.finished


@then(parsers.parse('no worker holds "{session}"'))
def nobody_holds(world: World, session: str) -> None:
    pool = _pool(world)
    rows = _sql(pool.url, "SELECT owner FROM pico_leases WHERE session_id = %s", pool.sid(session))
    assert rows == [], f"{session!r} is still leased: {rows}"
    assert all(pool.sid(session) not in w.sessions for w in pool.workers.values())


@then(parsers.parse('worker "{name}" took "{session}" {count:d} time'))
@then(parsers.parse('worker "{name}" took "{session}" {count:d} times'))
def took(world: World, name: str, session: str, count: int) -> None:
    pool = _pool(world)
    worker = pool.worker(name)
    ended = [why for s, why in worker.finished if s == pool.sid(session)]
    held = pool.sid(session) in worker.sessions
    assert len(ended) + held == count, (worker.finished, worker.sessions)


@then(parsers.parse('the inbox of "{session}" holds {count:d} command'))
@then(parsers.parse('the inbox of "{session}" holds {count:d} commands'))
def inbox_holds(world: World, session: str, count: int) -> None:
    pool = _pool(world)
    rows = _sql(
        pool.url, "SELECT count(*) FROM pico_inbox WHERE session_id = %s", pool.sid(session)
    )
    assert rows[0][0] == count, rows


@then(parsers.parse('the second submission of "{text}" is the first one'))
def second_is_first(world: World, text: str) -> None:
    first, second = _pool(world).sent[text][:2]
    assert not first.duplicate and second.duplicate, (first, second)
    assert second.id == first.id and second.request_key == first.request_key


@then(parsers.parse('every submission of "{text}" gets the same reply'))
def same_reply(world: World, text: str) -> None:
    pool = _pool(world)
    sent = pool.sent[text]
    assert len({s.id for s in sent}) == 1, sent
    replies = [world.run(pool.the_inbox().reply(s, timeout=WAIT)) for s in sent]
    assert len(replies) >= 2 and len(set(replies)) == 1, replies
    assert isinstance(replies[0], int)


@then(parsers.parse('the stored conversation of "{session}" is "{expected}"'))
def stored_conversation(world: World, session: str, expected: str) -> None:
    pool = _pool(world)

    async def read(h: pico.Harness) -> list[str]:
        root = await h.root()
        page = await pico.ConversationHandle(h, root.id).entries(limit=100)
        shown = []
        for e in page.items:
            text = e.content.get("text") if isinstance(e.content, dict) else e.content
            shown.append(f"{e.kind}: {text}")
        return shown

    shown = world.run(_reading(pool.url, pool.sid(session), read))
    assert "; ".join(shown) == expected, shown


@then(parsers.re(r"the workers' model was asked (?P<count>\d+) times?$"))
def workers_model_asked(world: World, count: str) -> None:
    assert _pool(world).provider.request_count == int(count)


@then(parsers.parse('"{session}" does not exist and nothing waits for it'))
def nothing_for(world: World, session: str) -> None:
    pool = _pool(world)
    sid = pool.sid(session)
    for table in ("pico_sessions", "pico_inbox", "pico_work", "pico_leases"):
        rows = _sql(pool.url, f"SELECT count(*) FROM {table} WHERE session_id = %s", sid)
        assert rows[0][0] == 0, f"{table} has {rows[0][0]} rows for {sid!r}"
    with pytest.raises(pico.UnknownSessionError):
        world.run(pico.Harness.open(pool.url, session=sid, read_only=True))


@then(parsers.parse("{wanted:d} sessions wait at the rendezvous at once"))
def all_at_rendezvous(world: World, wanted: int) -> None:
    pool = _pool(world)

    async def arrived() -> bool:
        return len(pool.arrived) >= wanted

    world.run(_until(arrived, f"{wanted} sessions reaching the rendezvous"))
    assert not pool.rendezvous.is_set()


@then(
    parsers.parse(
        '"{first}" and "{second}" each hold {n:d} of them under their own leases, none held by both'
    )
)
def each_holds(world: World, first: str, second: str, n: int) -> None:
    pool = _pool(world)
    a, b = pool.worker(first), pool.worker(second)
    held_a, held_b = set(a.sessions), set(b.sessions)
    assert len(held_a) == len(held_b) == n and not held_a & held_b, (held_a, held_b)
    rows = _sql(
        pool.url,
        "SELECT session_id, owner, now() < expires_at FROM pico_leases WHERE session_id LIKE %s",
        pool.prefix.replace("_", "\\_") + "%",
    )
    by_owner: dict[str, set[str]] = {}
    for sid, owner, live in rows:
        assert live, f"the lease of {sid!r} has expired while it is held"
        by_owner.setdefault(owner, set()).add(sid)
    assert by_owner == {a.owner: held_a, b.owner: held_b}, by_owner


@then(
    parsers.parse(
        'each of "{sessions}" was taken by exactly one worker, once, and released as idle'
    )
)
def taken_once(world: World, sessions: str) -> None:
    pool = _pool(world)
    wanted = {pool.sid(s) for s in _names(sessions)}

    async def released() -> bool:
        done = [s for w in pool.workers.values() for s, _ in w.finished]
        return set(done) >= wanted

    world.run(_until(released, "every session's release"))
    finished = [(s, why) for w in pool.workers.values() for s, why in w.finished]
    assert sorted(finished) == sorted((s, "idle") for s in wanted), finished
    assert sum(w.picked for w in pool.workers.values()) == len(wanted)


@then(parsers.parse('no worker replies to "{text}" within {seconds:d} seconds'))
def no_reply(world: World, text: str, seconds: int) -> None:
    pool = _pool(world)
    sent = pool.sent[text][0]
    with pytest.raises(pico.ReplyTimeoutError):
        world.run(pool.the_inbox().reply(sent, timeout=float(seconds)))
    rows = _sql(pool.url, "SELECT done_at FROM pico_inbox WHERE id = %s", sent.id)
    assert rows == [(None,)], "the command should still be waiting in the inbox"
    assert all(w.picked == 0 for w in pool.workers.values())


@then(parsers.parse('the lease of "{session}" still names the dead owner'))
def lease_dead_owner(world: World, session: str) -> None:
    pool = _pool(world)
    rows = _sql(
        pool.url,
        "SELECT owner, now() < expires_at FROM pico_leases WHERE session_id = %s",
        pool.sid(session),
    )
    assert rows == [(DEAD_OWNER, True)], rows


@then(parsers.parse('an approval waits for a decision in "{session}"'))
def approval_waits(world: World, session: str) -> None:
    pool = _pool(world)

    async def pending() -> list[Any]:
        found: list[Any] = await _reading(
            pool.url, pool.sid(session), lambda h: h.pending_approvals()
        )
        return found

    found = world.run(_until(pending, "an approval waiting"))
    assert len(found) == 1, found
    pool.approval = found[0].id


@then(parsers.parse('no approval waits in "{session}"'))
def no_approval(world: World, session: str) -> None:
    pool = _pool(world)
    found = world.run(_reading(pool.url, pool.sid(session), lambda h: h.pending_approvals()))
    assert found == [], found


@then("the inbox replies with the id of that approval")
def replies_with_approval(world: World) -> None:
    pool = _pool(world)
    assert world.run(_reply(pool, "the approval")) == pool.approval


@then("the workers ran no tool")
def ran_no_tool(world: World) -> None:
    assert _pool(world).ran_with == []


@then(parsers.parse('the workers ran the tool "read" with {arguments}'))
def ran_tool(world: World, arguments: str) -> None:
    assert _pool(world).ran_with == [json.loads(arguments)]
