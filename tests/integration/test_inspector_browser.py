"""The session inspector's page in a real browser (issue 15): headless Debian Chromium
driven by selenium against a real uvicorn server for ``create_app(harness)`` around a real
SQLite harness. The server runs as a task of the test's event loop — the loop that owns
the harness — and selenium runs in threads (tests/browser.py).

Element ids are those of docs/inspector.md: ``#session-select``, ``#conversation-<id>``,
``#transcript`` with ``#entry-<id>`` items, ``#live-status[data-state=live]`` once the
watch's base arrived, ``#approvals`` with ``#approval-<id>`` and, only when decisions are
allowed, ``#grant-<id>``/``#deny-<id>``."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pico
from pico import FauxProvider, FauxResponse, ToolContext
from pico.domain.json import JsonObject
from pico.infrastructure.inspector import create_app, create_app_for_url
from tests.backends import make_backend
from tests.browser import Page, chromium, serve

SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


@dataclasses.dataclass
class Agent:
    """A SQLite session whose ``read`` tool is held by ``before_tool`` for a person."""

    invoked: list[JsonObject] = dataclasses.field(default_factory=list)

    async def open(self, tmp_path: Path) -> pico.Harness:
        async def read(args: JsonObject, ctx: ToolContext) -> str:
            self.invoked.append(args)
            return f"contents of {args['path']}"

        async def before(call: pico.ToolCall) -> pico.ToolDecision:
            return pico.ToolDecision("hold", "reads need a person")

        provider = FauxProvider(
            [FauxResponse(tool_calls=[("read", {"path": "a.py"})]), "a.py holds the parser"]
        )
        return await make_backend("sqlite", tmp_path).open(
            provider=provider,
            tools=[pico.Tool("read", "Read a file", SCHEMA, read)],
            hooks=pico.Hooks(before_tool=before),
        )


async def _follow(page: Page, url: str, h: pico.Harness, conversation_id: int) -> None:
    """Open the page, pick the session and the conversation, wait until it is live."""
    await page.open(url + "/")
    await page.wait_for("body[data-ready='true']", visible=False)
    await page.select("#session-select", value=h.session_id)
    # The page may already follow the root: forget that stream's state, so the wait
    # below sees the base of the stream opened by this click.
    await page.script("document.getElementById('live-status').dataset.state = 'picked'")
    await page.click(f"#conversation-{conversation_id}")
    await page.wait_for_text("#transcript-title", f"conversation {conversation_id}")
    # The watch's base arrived: the stream is registered, so a commit from now on is
    # delivered to the page (and the first load is done: the stream opens after it).
    await page.wait_for("#live-status[data-state='live']", visible=False)


async def test_the_page_shows_a_transcript_and_a_new_commit_appears_without_a_reload(
    tmp_path: Path,
) -> None:
    h = await make_backend("sqlite", tmp_path).open()
    try:
        c = await h.root()
        first = await c.append("user", "first words")
        async with serve(create_app(h)) as url, chromium(tmp_path, name="inspector") as page:
            await _follow(page, url, h, c.id)
            # Check the transcript: the stored entry, marked as in the context.
            await page.wait_for_text(f"#entry-{first}", "first words")
            assert (
                await page.script(
                    "return document.getElementById(arguments[0]).dataset.inContext",
                    f"entry-{first}",
                )
                == "true"
            )
            await page.wait_for("#decisions-mode[data-allow-decisions='false']", visible=False)
            # A marker on the window: a reload (or navigation) would drop it.
            await page.script("window.picoMarker = 'same page'")
            assert await page.script("return document.body.dataset.commits") is None

            # Commit from Python, in the loop that also runs the server.
            second = await c.append("user", "hello from python")
            text = await page.wait_for_text("#transcript", "hello from python")
            assert text.index("first words") < text.index("hello from python")

            # Check it came over the stream into the same page, with no reload.
            assert await page.script("return window.picoMarker") == "same page"
            assert int(await page.script("return document.body.dataset.commits || '0'")) >= 1
            assert await page.count("#transcript [data-testid='entry']") == 2
            await page.wait_for(f"#entry-{second}[data-in-context='true']", visible=False)
            await page.screenshot("live-commit")
    finally:
        await h.close()


async def test_grant_in_the_page_runs_the_held_tool_and_its_result_appears(
    tmp_path: Path,
) -> None:
    agent = Agent()
    h = await agent.open(tmp_path)
    try:
        c = await h.root()
        await c.accept("read a.py")
        assert await asyncio.wait_for(c.drive(), timeout=30) == "suspended"
        (approval,) = await h.pending_approvals()
        assert isinstance(approval.state, dict)
        tool_id = approval.state["tool_task"]
        assert isinstance(tool_id, int) and agent.invoked == []

        app = create_app(h, allow_decisions=True)
        async with serve(app) as url, chromium(tmp_path, name="inspector-grant") as page:
            await _follow(page, url, h, c.id)
            await page.wait_for_text(f"#approval-{approval.id}", "reads need a person")
            await page.wait_for(f"#deny-{approval.id}")
            assert await page.text(f"#grant-{approval.id}") == "Grant"
            await page.wait_for("#decisions-mode[data-allow-decisions='true']", visible=False)
            await page.screenshot("approval-held")

            # The owner supervises its session: it waits for the decision, then runs on.
            supervising = asyncio.create_task(h.wait_for(tool_id, timeout=60))
            await page.click(f"#grant-{approval.id}")
            tool = await asyncio.wait_for(supervising, timeout=60)
            assert (tool.status, agent.invoked) == ("done", [{"path": "a.py"}])
            assert isinstance(tool.state, dict)
            result = tool.state["result_entry"]
            # The tool's result asks the model again: drive the exchange to its answer.
            assert await asyncio.wait_for(h.drive(), timeout=30) == "idle"

            # Check the page: the tool's result entry arrives live, the approval is gone.
            await page.wait_for_text(f"#entry-{result}", "contents of a.py")
            await page.wait_for_text("#transcript", "a.py holds the parser")
            assert await page.count(f"#approval-{approval.id}") == 0
            granted = await h.task(approval.id)
            assert granted is not None and granted.status == "granted"
            await page.screenshot("approval-granted")
    finally:
        await h.close()


async def test_a_read_only_inspector_shows_the_approval_without_grant_or_deny(
    tmp_path: Path,
) -> None:
    h = await Agent().open(tmp_path)
    try:
        c = await h.root()
        await c.accept("read a.py")
        assert await asyncio.wait_for(c.drive(), timeout=30) == "suspended"
        (approval,) = await h.pending_approvals()
        async with serve(create_app(h)) as url, chromium(tmp_path, name="inspector-ro") as page:
            await _follow(page, url, h, c.id)
            await page.wait_for_text(f"#approval-{approval.id}", "reads need a person")
            await page.wait_for("#decisions-mode[data-allow-decisions='false']", visible=False)
            # Check: no decision buttons at all, and nothing was decided.
            assert await page.count("#approvals button") == 0
            await page.screenshot("approval-read-only")
        still = await h.task(approval.id)
        assert still is not None and still.status == "pending"
    finally:
        await h.close()


async def test_pico_serve_mode_follows_another_owners_commits_through_a_read_only_handle(
    tmp_path: Path,
) -> None:
    backend = make_backend("sqlite", tmp_path)
    owner = await backend.open()
    try:
        c = await owner.root()
        await c.append("user", "before the page opened")
        # The app opens its own read-only handle on the session (as `pico serve` does).
        app = create_app_for_url(backend.url)
        async with serve(app) as url, chromium(tmp_path, name="inspector-url") as page:
            await _follow(page, url, owner, c.id)
            await page.wait_for_text("#transcript", "before the page opened")
            await page.script("window.picoMarker = 'same page'")
            await c.append("user", "committed by the owner")
            # Check: the read-only handle's watch saw the owner's commit, the page showed it.
            await page.wait_for_text("#transcript", "committed by the owner")
            assert await page.script("return window.picoMarker") == "same page"
            await page.screenshot("other-owner")
    finally:
        await owner.close()


async def test_a_token_protected_inspector_needs_the_token_once_in_the_url(
    tmp_path: Path,
) -> None:
    h = await make_backend("sqlite", tmp_path).open()
    try:
        c = await h.root()
        await c.append("user", "behind a token")
        app = create_app(h, token="s3cret-token")
        async with serve(app) as url, chromium(tmp_path, name="inspector-token") as page:
            # Check: without the token the page says how to get in, and shows nothing.
            await page.open(url + "/")
            await page.wait_for_text("#error", "needs its token")
            assert await page.count("#transcript [data-testid='entry']") == 0
            # With ?token= once: the page follows, and the token leaves the address bar.
            await page.open(url + "/?token=s3cret-token")
            await page.wait_for("#live-status[data-state='live']", visible=False)
            await page.wait_for_text("#transcript", "behind a token")
            assert "s3cret-token" not in await page.script("return window.location.href")
            await c.append("user", "still followed")
            await page.wait_for_text("#transcript", "still followed")
            await page.screenshot("token")
    finally:
        await h.close()
