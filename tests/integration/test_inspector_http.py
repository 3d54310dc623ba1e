"""The session inspector over HTTP (issue 15): every JSON endpoint against a real harness
(httpx's ASGI transport), bad input (400), unknown ids (404), the bearer token (401),
decisions refused without the flag (403, nothing written) and applied with it, and the
Server-Sent Events stream and the page over real HTTP (uvicorn on a free port)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject
from pico.infrastructure.inspector import create_app, create_app_for_url, list_sessions
from tests.backends import Backend

SCHEMA: JsonObject = {"type": "object", "properties": {"path": {"type": "string"}}}


def client(app: ASGIApp, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://inspector", headers=headers
    )


async def _session(h: pico.Harness) -> tuple[int, int, int, int]:
    """A root with three entries and a compaction, and a fork at the first entry."""
    c = await h.root()
    q = await c.append("user", "Inspect the parser")
    await c.append("assistant", "The parser has two problems")
    s = await c.compact("Summary of the first exchange", through=q)
    alt = await c.fork(at_entry=q)
    return c.id, q, s, alt.id


async def test_every_read_endpoint_answers_from_the_harness(backend: Backend) -> None:
    h = await backend.open()
    try:
        root, q, summary, fork = await _session(h)
        async with client(create_app(h)) as http:
            # Check the page and its script are served.
            page = await http.get("/")
            assert page.status_code == 200 and 'data-testid="transcript"' in page.text
            assert (await http.get("/static/app.js")).status_code == 200
            assert (await http.get("/api/config")).json() == {
                "allow_decisions": False,
                "mode": "harness",
            }
            assert (await http.get("/api/sessions")).json() == {
                "items": [{"name": backend.session}]
            }
            s = f"/api/sessions/{backend.session}"
            one = (await http.get(s)).json()
            assert one["root_id"] == root and one["main_head"] == h.main_head()

            # Check the fork tree: the fork names its source and as_of.
            convs = (await http.get(f"{s}/conversations")).json()
            by_id = {c["id"]: c for c in convs["items"]}
            assert set(by_id) == {root, fork} and convs["root_id"] == root
            assert by_id[root]["source"] is None
            assert by_id[fork]["source"]["conversation_id"] == root
            assert (await http.get(f"{s}/conversations/{fork}")).json()["id"] == fork

            # Check transcript pages: limit and the cursor.
            first = (await http.get(f"{s}/conversations/{root}/entries?limit=2")).json()
            assert first["items"][0]["id"] == q and first["next"] is not None
            rest = (
                await http.get(f"{s}/conversations/{root}/entries?after={first['next']}")
            ).json()
            kinds = [e["kind"] for e in first["items"] + rest["items"]]
            assert "summary" in kinds and rest["next"] is None
            assert summary in [e["id"] for e in rest["items"]]

            # Check the context now and at an earlier position.
            now = (await http.get(f"{s}/conversations/{root}/context")).json()
            snap = await (await h.root()).snapshot()
            assert now["context"] == list(snap.context) and summary in now["context"]
            q_end = await h.entry(q)
            assert q_end is not None
            then = (
                await http.get(f"{s}/conversations/{root}/context?as_of={q_end.commit_end}")
            ).json()
            assert then["context"] == [q] and then["as_of"] == q_end.commit_end

            # Check tasks (none live here), approvals, audit pages.
            assert (await http.get(f"{s}/tasks?live=true")).json()["items"] == []
            assert (await http.get(f"{s}/approvals")).json()["items"] == []
            a1 = (await http.get(f"{s}/audit?limit=3")).json()
            assert [r["position"] for r in a1["items"]] == sorted(
                r["position"] for r in a1["items"]
            )
            assert len(a1["items"]) == 3 and a1["next"] == a1["items"][-1]["position"]
            a2 = (await http.get(f"{s}/audit?after={a1['next']}&limit=1000")).json()
            assert a2["next"] is None
            assert a2["items"][0]["position"] > a1["next"]
            assert len(a1["items"]) + len(a2["items"]) == h.audit_count()
    finally:
        await h.close()


async def _agent(backend: Backend) -> tuple[pico.Harness, list[JsonObject]]:
    """A harness whose ``read`` tool is held for approval by ``before_tool``."""
    invoked: list[JsonObject] = []

    async def read(args: JsonObject, ctx: ToolContext) -> str:
        invoked.append(args)
        return f"contents of {args['path']}"

    async def before(call: pico.ToolCall) -> pico.ToolDecision:
        return pico.ToolDecision("hold", "reads need a person")

    h = await backend.open(
        provider=FauxProvider([FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "done"]),
        tools=[pico.Tool("read", "Read", SCHEMA, read)],
        hooks=pico.Hooks(before_tool=before),
    )
    c = await h.root()
    await c.accept("read it")
    assert await asyncio.wait_for(c.drive(), timeout=10) == "suspended"
    return h, invoked


async def test_tasks_and_pending_approvals_are_listed_and_a_task_is_read_by_id(
    backend: Backend,
) -> None:
    h, _ = await _agent(backend)
    try:
        (approval,) = await h.pending_approvals()
        async with client(create_app(h)) as http:
            s = f"/api/sessions/{backend.session}"
            live = (await http.get(f"{s}/tasks?live=true")).json()["items"]
            assert approval.id in [t["id"] for t in live]
            only = (await http.get(f"{s}/tasks?kind=approval&live=true")).json()["items"]
            assert [t["id"] for t in only] == [approval.id]
            got = (await http.get(f"{s}/tasks/{approval.id}")).json()
            assert got["kind"] == "approval" and got["status"] == "pending" and got["live"]
            pending = (await http.get(f"{s}/approvals")).json()
            assert [t["id"] for t in pending["items"]] == [approval.id]
            assert pending["allow_decisions"] is False
    finally:
        await h.close()


@pytest.mark.parametrize(
    "path",
    [
        "conversations?limit=0",
        "conversations?limit=abc",
        "conversations?limit=1001",
        "conversations?after=-1",
        "conversations/x/entries",
        "conversations/0/entries",
        "conversations/{root}/entries?before=1.5",
        "conversations/{root}/context?as_of=soon",
        "tasks?live=maybe",
        "tasks?conversation_id=0",
        "tasks/abc",
        "audit?after=-5",
        "audit?limit=0",
        "conversations/{root}/watch?limit=0",
    ],
)
async def test_bad_input_is_a_400_with_the_error_sentence_and_writes_nothing(
    tmp_path: Path, path: str
) -> None:
    async with await pico.Harness.open(f"sqlite:///{tmp_path / 'x.db'}") as h:
        root = (await h.root()).id
        before = h.head()
        async with client(create_app(h)) as http:
            r = await http.get(f"/api/sessions/main/{path.format(root=root)}")
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["type"] == "InvalidArgumentError" and "must be" in body["error"]
        assert "Traceback" not in r.text
        assert h.head() == before


async def test_unknown_sessions_conversations_tasks_and_routes_are_404(tmp_path: Path) -> None:
    async with (
        await pico.Harness.open(f"sqlite:///{tmp_path / 'x.db'}") as h,
        client(create_app(h)) as http,
    ):
        for path, kind in [
            ("/api/sessions/other/conversations", "UnknownSessionError"),
            ("/api/sessions/main/conversations/999", "UnknownConversationError"),
            ("/api/sessions/main/conversations/999/entries", "UnknownConversationError"),
            ("/api/sessions/main/conversations/999/context", "UnknownConversationError"),
            ("/api/sessions/main/conversations/999/watch", "UnknownConversationError"),
            ("/api/sessions/main/tasks/999", "UnknownTaskError"),
            ("/api/nothing-here", "HTTPException"),
        ]:
            r = await http.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["type"] == kind and r.json()["error"]


async def test_a_token_guards_every_api_request_and_the_page_takes_it_once(
    tmp_path: Path,
) -> None:
    async with await pico.Harness.open(f"sqlite:///{tmp_path / 'x.db'}") as h:
        app = create_app(h, token="s3cret")
        async with client(app) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = await http.get("/api/sessions", headers=headers)
                assert r.status_code == 401 and r.json()["type"] == "UnauthorizedError"
                assert r.headers["www-authenticate"] == "Bearer"
            # Check ?token= is taken by the SSE endpoint only.
            assert (await http.get("/api/sessions?token=s3cret")).status_code == 401
            ok = await http.get("/api/sessions", headers={"Authorization": "Bearer s3cret"})
            assert ok.status_code == 200 and ok.json()["items"] == [{"name": "main"}]
            # The page itself holds no data: it loads and asks for the token.
            assert (await http.get("/")).status_code == 200
            bad = await http.get("/api/sessions/main/conversations/1/watch?token=wrong")
            assert bad.status_code == 401


async def test_a_decision_is_refused_without_the_flag_and_nothing_is_written(
    backend: Backend,
) -> None:
    h, invoked = await _agent(backend)
    try:
        (approval,) = await h.pending_approvals()
        before = h.head()
        async with client(create_app(h)) as http:
            r = await http.post(
                f"/api/sessions/{backend.session}/approvals/{approval.id}",
                json={"decision": "grant"},
            )
        assert r.status_code == 403 and r.json()["type"] == "DecisionsNotAllowedError"
        assert "--allow-decisions" in r.json()["error"]
        assert h.head() == before
        assert [t.id for t in await h.pending_approvals()] == [approval.id] and invoked == []
    finally:
        await h.close()


async def test_an_allowed_grant_is_applied_and_the_tool_runs(backend: Backend) -> None:
    h, invoked = await _agent(backend)
    try:
        (approval,) = await h.pending_approvals()
        async with client(create_app(h, allow_decisions=True)) as http:
            s = f"/api/sessions/{backend.session}"
            assert (await http.get("/api/config")).json()["allow_decisions"] is True
            # Check a malformed body or decision is a 400 that writes nothing.
            before = h.head()
            for body in (b"not json", b'{"decision": "maybe"}', b"[]"):
                r = await http.post(f"{s}/approvals/{approval.id}", content=body)
                assert r.status_code == 400 and r.json()["type"] == "InvalidArgumentError"
            r = await http.post(f"{s}/approvals/999", json={"decision": "grant"})
            assert r.status_code == 404 and r.json()["type"] == "UnknownTaskError"
            assert h.head() == before

            r = await http.post(f"{s}/approvals/{approval.id}", json={"decision": "grant"})
            assert r.status_code == 200 and r.json() == {
                "approval": approval.id,
                "decision": "grant",
            }
            task = await h.task(approval.id)
            assert task is not None and task.status == "granted"
            assert await asyncio.wait_for((await h.root()).drive(), timeout=10) == "idle"
            assert invoked == [{"path": "a.py"}]
            # Check a late decision is refused with the reason, nothing written.
            late = await http.post(f"{s}/approvals/{approval.id}", json={"decision": "deny"})
            assert late.status_code == 400 and "granted" in late.json()["error"]
    finally:
        await h.close()


# ---------------------------------------------------------------------- real HTTP
@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free loopback port, in this event loop."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    started = asyncio.Event()
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        started.set()

    server.startup = startup  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        sock.close()


async def _events(response: httpx.Response) -> AsyncIterator[JsonObject]:
    """The JSON data of each SSE event of a streaming response."""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            yield json.loads(line[5:].strip())


async def _next(events: AsyncIterator[JsonObject]) -> JsonObject:
    return await asyncio.wait_for(anext(events), timeout=10)


async def test_the_sse_stream_delivers_the_base_then_a_commit_made_from_python(
    tmp_path: Path,
) -> None:
    async with await pico.Harness.open(f"sqlite:///{tmp_path / 'x.db'}") as h:
        c = await h.root()
        first = await c.append("user", "before the watch")
        async with (
            serving(create_app(h, token="t")) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=10) as http,
        ):
            url = f"/api/sessions/main/conversations/{c.id}/watch?token=t"
            async with http.stream("GET", url) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                events = _events(r)
                base = await _next(events)
                assert base["type"] == "base"
                entries: Any = base["entries"]
                assert [e["id"] for e in entries] == [first]
                # Check a commit from Python arrives, whole, with the new entry.
                added = await c.append("assistant", "after the watch")
                commit = await _next(events)
                assert commit["type"] == "commit"
                changes: Any = commit["changes"]
                appended = [
                    ch["payload"]["seq"]
                    for ch in changes
                    if ch["event"] == "Conversation.EntryAppended"
                ]
                assert appended == [added]


async def test_pico_serve_app_over_real_http_follows_another_owner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'served.db'}"
    async with await pico.Harness.open(url, session="alpha") as owner:
        async with await pico.Harness.open(url, session="beta"):
            pass
        c = await owner.root()
        await c.append("user", "hello")
        assert list_sessions(url) == ["alpha", "beta"]
        async with (
            serving(create_app_for_url(url)) as base_url,
            httpx.AsyncClient(base_url=base_url, timeout=10) as http,
        ):
            page = await http.get("/")
            assert page.status_code == 200 and "pico inspector" in page.text
            assert (await http.get("/api/sessions")).json() == {
                "items": [{"name": "alpha"}, {"name": "beta"}]
            }
            assert (await http.get("/api/config")).json()["mode"] == "url"
            entries = (await http.get(f"/api/sessions/alpha/conversations/{c.id}/entries")).json()
            assert [e["content"] for e in entries["items"]] == ["hello"]
            # Check the read-only handle follows the owner's commit through the stream.
            async with http.stream("GET", f"/api/sessions/alpha/conversations/{c.id}/watch") as r:
                events = _events(r)
                assert (await _next(events))["type"] == "base"
                await c.append("assistant", "from the owner")
                commit = await _next(events)
                assert commit["type"] == "commit"
            after = (await http.get(f"/api/sessions/alpha/conversations/{c.id}/entries")).json()
            assert [e["content"] for e in after["items"]] == ["hello", "from the owner"]
            # Check a decision is refused on a read-only server, nothing written.
            head = owner.head()
            r2 = await http.post("/api/sessions/alpha/approvals/1", json={"decision": "grant"})
            assert r2.status_code == 403 and owner.head() == head


async def test_a_cross_site_or_non_json_decision_is_refused_and_nothing_is_written(
    backend: Backend,
) -> None:
    """CSRF: a page on another site can POST a simple request (text/plain, no preflight)
    to a loopback inspector; with decisions allowed that must still write nothing."""
    h, invoked = await _agent(backend)
    try:
        (approval,) = await h.pending_approvals()
        before = h.head()
        path = f"/api/sessions/{backend.session}/approvals/{approval.id}"
        body = b'{"decision": "grant"}'
        async with client(create_app(h, allow_decisions=True)) as http:
            plain = await http.post(path, content=body, headers={"content-type": "text/plain"})
            assert plain.status_code == 400 and "application/json" in plain.json()["error"]
            other = await http.post(
                path,
                content=body,
                headers={"content-type": "application/json", "origin": "https://evil.example"},
            )
            assert other.status_code == 403 and other.json()["type"] == "DecisionsNotAllowedError"
            site = await http.post(
                path,
                content=body,
                headers={"content-type": "application/json", "sec-fetch-site": "cross-site"},
            )
            assert site.status_code == 403
            assert h.head() == before and invoked == []
            # The page's own request (same origin, JSON) is applied.
            own = await http.post(
                path,
                content=body,
                headers={"content-type": "application/json", "origin": "http://inspector"},
            )
            assert own.status_code == 200, own.text
    finally:
        await h.close()


async def test_allowed_hosts_refuse_a_rebound_host_name(backend: Backend) -> None:
    h = await backend.open()
    try:
        app = create_app(h, allowed_hosts=["inspector", "127.0.0.1"])
        async with client(app) as http:
            assert (await http.get("/api/config")).status_code == 200
            evil = await http.get("/api/config", headers={"host": "evil.example"})
            assert evil.status_code == 400
    finally:
        await h.close()
