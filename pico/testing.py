"""Test support for users of pico: test your own tools, hooks and agent loops without a
model, a network or a clock (issue 17).

``harness(...)`` (or ``open_rig(...)`` and ``Rig.close()``) opens a throwaway session
(memory, a SQLite file in a temporary directory, or any URL) with the faux provider and a
``FakeClock`` wired in, and gives a ``Rig``: script the model, run a turn, read the
transcript as ``(kind, text)`` rows, and assert with a readable diff. It needs no test
framework: it works under pytest-asyncio, anyio or a plain ``asyncio.run``.

Loaded by pytest (the ``pytest11`` entry point ``pico``), this module also gives the
fixtures ``pico_clock`` (a ``FakeClock``), ``pico_faux`` (an empty ``FauxProvider``) and
``pico_storage_url`` (a SQLite URL under ``tmp_path``). It defines no
``pytest_pyfunc_call``: running ``async def`` tests is your async runner's job. pytest
is imported only when pytest loads the plugin; ``import pico.testing`` does not need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import json
import pprint
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

from pico.application.clock import FakeClock
from pico.application.conversation import ConversationHandle
from pico.application.faux import FauxProvider, ScriptItem
from pico.application.flows import InputResult
from pico.application.harness import Harness
from pico.application.hooks import Hooks
from pico.application.model import Request
from pico.application.tools import Tool
from pico.domain.errors import InvalidArgumentError
from pico.domain.json import JsonValue
from pico.domain.values import Entry, TaskSnapshot
from pico.infrastructure import memory

_P = ParamSpec("_P")

__all__ = [
    "Rig",
    "ScriptItem",
    "ToolResult",
    "assert_rows",
    "harness",
    "open_rig",
    "transcript_rows",
]

#: A transcript row: ``(kind, text)``.
Row = tuple[str, str]


@dataclass(frozen=True)
class ToolResult:
    """One tool result as the model saw it: the tool's name, its call id, the text and
    whether it was an error (a raising tool, invalid arguments, a blocked call)."""

    name: str
    content: str
    is_error: bool
    call_id: str


def _text(content: JsonValue) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def transcript_rows(entries: Iterable[Entry]) -> list[Row]:
    """Entries as ``(kind, text)`` rows, the shape ``Rig.transcript()`` returns.

    A user entry gives its text (JSON input as compact JSON); an assistant entry gives
    ``("assistant", text)`` when it has text, then one ``("tool_call", 'name {"arg": 1}')``
    row per call; a tool result gives ``("tool", text)``, or ``("tool_error", text)`` when
    it is an error; any other entry gives its kind and its text (or JSON).
    """
    rows: list[Row] = []
    for entry in entries:
        content = entry.content
        if entry.kind == "assistant" and isinstance(content, dict):
            text = content.get("text")
            if isinstance(text, str) and text:
                rows.append(("assistant", text))
            calls = content.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    args = json.dumps(call.get("arguments"), sort_keys=True)
                    rows.append(("tool_call", f"{call.get('name')} {args}"))
        elif entry.kind == "tool" and isinstance(content, dict) and "content" in content:
            kind = "tool_error" if content.get("is_error") else "tool"
            rows.append((kind, _text(content["content"])))
        else:
            rows.append((entry.kind, _text(content)))
    return rows


def assert_rows(actual: Sequence[Any], expected: Sequence[Any], *, what: str = "rows") -> None:
    """Raise ``AssertionError`` with a unified diff (expected -> actual) unless the two
    sequences are equal (tuples and lists compare as the same rows)."""
    got = [tuple(r) if isinstance(r, list) else r for r in actual]
    want = [tuple(r) if isinstance(r, list) else r for r in expected]
    if got == want:
        return
    diff = difflib.unified_diff(
        [pprint.pformat(r, width=100) for r in want],
        [pprint.pformat(r, width=100) for r in got],
        fromfile=f"expected {what}",
        tofile=f"actual {what}",
        lineterm="",
    )
    raise AssertionError(f"{what} differ:\n" + "\n".join(diff))


class Rig:
    """An open test session: the harness, its faux provider and fake clock, and helpers.

    Attributes:
        harness: the open ``pico.Harness``.
        provider: the ``FauxProvider`` (``provider.requests`` holds what the model was sent).
        clock: the ``FakeClock`` the harness and every flow read.
        url: the storage URL (a fresh ``memory://`` name or a SQLite file per rig).
        conversation: the session's root conversation.
    """

    def __init__(
        self,
        harness: Harness,
        provider: FauxProvider,
        clock: FakeClock,
        url: str,
        conversation: ConversationHandle,
        options: dict[str, Any],
        cleanup: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.harness = harness
        self.provider = provider
        self.clock = clock
        self.url = url
        self.conversation = conversation
        self._options = options
        self._cleanup = list(cleanup)

    # ------------------------------------------------------------------ scripting
    def script(self, *items: ScriptItem) -> None:
        """Append model responses to the provider's script (a str is a final answer; a
        ``pico.FauxResponse`` may call tools; ``pico.FauxFailure`` fails an attempt)."""
        self.provider.script.extend(items)

    @property
    def requests(self) -> list[Request]:
        """Every request the model was sent, oldest first."""
        return self.provider.requests

    # ------------------------------------------------------------------ running
    async def turn(
        self,
        prompt: JsonValue,
        *,
        conversation: ConversationHandle | None = None,
        advance_timers: bool = True,
    ) -> InputResult:
        """Accept ``prompt`` and drive until its input is answered (or nothing more can
        run); returns its ``InputResult`` (``status`` ``"done"`` with ``entry_id``, or
        ``"failed"`` with ``reason``, ...).

        With ``advance_timers`` (the default) a drive that waits only for the fake clock
        (a retry's ``retry_delay``, a provider's ``retry_after``) has the clock moved to
        the next timer, so a turn with retries finishes without sleeping.
        """
        target = conversation or self.conversation
        input_id = await target.accept(prompt)
        await self.drive(conversation=target, advance_timers=advance_timers)
        result = await target.result(input_id)
        if result is None:  # pragma: no cover - an accepted input always has a result
            raise AssertionError(f"input {input_id} has no result")
        return result

    async def drive(
        self, *, conversation: ConversationHandle | None = None, advance_timers: bool = True
    ) -> str:
        """Drive the conversation until it is idle or suspended (see ``turn``)."""
        target = conversation or self.conversation
        driving = asyncio.ensure_future(target.drive())
        try:
            while not driving.done():
                # Let every ready callback run; the drive is quiet when it is still waiting
                # after that, and a sleeper on the fake clock is what it waits for.
                for _ in range(50):
                    await asyncio.sleep(0)
                    if driving.done():
                        break
                if driving.done():
                    break
                wake = self.clock.next_wake()
                if advance_timers and wake is not None:
                    self.clock.advance(max(0.0, wake - self.clock.now()))
                else:
                    await asyncio.wait([driving], timeout=0.01)
            return str(driving.result())
        finally:
            if not driving.done():
                driving.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await driving

    async def advance(self, seconds: float) -> None:
        """Move the fake clock on and let what woke up run."""
        self.clock.advance(seconds)
        for _ in range(50):
            await asyncio.sleep(0)

    async def reopen(self) -> None:
        """Close the harness and open the same session again (a restart): what a later
        owner sees. The provider and clock stay the same objects."""
        await self.harness.close()
        self.harness = await Harness.open(self.url, **self._options)
        self.conversation = await self.harness.root()

    async def close(self) -> None:
        """Close the harness and discard the rig's storage (its memory database, its
        temporary directory); ``harness(...)`` does it on exit."""
        try:
            await self.harness.close()
        finally:
            while self._cleanup:
                self._cleanup.pop()()

    # ------------------------------------------------------------------ reading
    async def entries(self, *, conversation: ConversationHandle | None = None) -> list[Entry]:
        """Every entry of the conversation's transcript, oldest first (all pages)."""
        target = conversation or self.conversation
        found: list[Entry] = []
        after: int | None = None
        while True:
            page = await target.entries(after=after, limit=1000)
            found.extend(page.items)
            if page.next is None or not page.items:
                return found
            after = page.items[-1].id

    async def transcript(self, *, conversation: ConversationHandle | None = None) -> list[Row]:
        """The transcript as ``(kind, text)`` rows (see ``transcript_rows``)."""
        return transcript_rows(await self.entries(conversation=conversation))

    async def tool_results(
        self, *, conversation: ConversationHandle | None = None
    ) -> list[ToolResult]:
        """Every tool result of the transcript, in transcript order."""
        results: list[ToolResult] = []
        for entry in await self.entries(conversation=conversation):
            content, meta = entry.content, entry.metadata or {}
            if entry.kind != "tool" or not isinstance(content, dict):
                continue
            results.append(
                ToolResult(
                    name=str(meta.get("tool_name", "")),
                    content=_text(content.get("content")),
                    is_error=bool(content.get("is_error")),
                    call_id=str(meta.get("tool_call_id", "")),
                )
            )
        return results

    async def tasks(
        self,
        *,
        kind: str | None = None,
        live: bool | None = None,
        conversation: ConversationHandle | None = None,
    ) -> list[TaskSnapshot]:
        """Task records (all pages), oldest first; filter by kind (``"generation"``,
        ``"tool"``, ``"post_tools"``, ``"approval"``, your own), liveness, conversation."""
        ids = None if conversation is None else [conversation.id]
        found: list[TaskSnapshot] = []
        after: int | None = None
        while True:
            page = await self.harness.tasks(
                conversation_ids=ids, kind=kind, live=live, after=after, limit=100
            )
            found.extend(page.items)
            if page.next is None or not page.items:
                return found
            after = page.items[-1].id

    # ------------------------------------------------------------------ asserting
    async def assert_transcript(
        self,
        expected: Sequence[Row | list[str]],
        *,
        conversation: ConversationHandle | None = None,
    ) -> None:
        """Fail with a diff unless the transcript is exactly ``expected``."""
        assert_rows(await self.transcript(conversation=conversation), expected, what="transcript")

    async def assert_tool_results(
        self,
        expected: Sequence[tuple[str, str, bool]],
        *,
        conversation: ConversationHandle | None = None,
    ) -> None:
        """Fail with a diff unless the tool results are ``(name, content, is_error)``."""
        got = [
            (r.name, r.content, r.is_error)
            for r in await self.tool_results(conversation=conversation)
        ]
        assert_rows(got, expected, what="tool results")

    async def assert_tasks(
        self,
        expected: Sequence[str],
        *,
        kind: str,
        conversation: ConversationHandle | None = None,
    ) -> None:
        """Fail with a diff unless the tasks of ``kind`` have the statuses ``expected``
        (oldest first), e.g. ``await t.assert_tasks(["done", "done"], kind="tool")``."""
        got = [t.status for t in await self.tasks(kind=kind, conversation=conversation)]
        assert_rows(got, expected, what=f"{kind} task statuses")


async def open_rig(
    *,
    script: Iterable[ScriptItem] = (),
    tools: Iterable[Tool] = (),
    storage: str = "memory",
    tmp_path: str | Path | None = None,
    provider: FauxProvider | None = None,
    clock: FakeClock | None = None,
    hooks: Hooks | None = None,
    session: str = "main",
    **options: Any,
) -> Rig:
    """Open a throwaway session for a test; ``await rig.close()`` closes and discards it
    (``harness(...)`` is the same as an async context manager: prefer it).

    Args:
        script: the faux model's responses, in order (ignored with ``provider=``).
        tools: the tools under test.
        storage: ``"memory"`` (a fresh in-memory database), ``"sqlite"`` (a fresh file
            under ``tmp_path``, else a temporary directory removed afterwards) or any
            storage URL.
        tmp_path: where a ``"sqlite"`` database goes (pytest's ``tmp_path``).
        provider: your own ``FauxProvider`` (the ``pico_faux`` fixture), else one on
            ``script``.
        clock: your own ``FakeClock`` (the ``pico_clock`` fixture), else a new one.
        hooks: ``pico.Hooks`` under test.
        session: the session name.
        options: any other ``Harness.open`` option (``system=``, ``max_attempts=``, ...).
    """
    clock = clock if clock is not None else FakeClock()
    provider = provider if provider is not None else FauxProvider(script)
    if not isinstance(provider, FauxProvider):
        raise InvalidArgumentError(
            f"provider must be a pico.FauxProvider, not {type(provider).__name__}"
        )
    cleanup: list[Callable[[], None]] = []
    if storage == "memory":
        name = f"pico-testing-{uuid.uuid4().hex}"
        url = f"memory://{name}"
        cleanup.append(functools.partial(memory.drop_database, name))
    elif storage == "sqlite":
        if tmp_path is not None:
            directory = Path(tmp_path)
        else:
            scratch = tempfile.TemporaryDirectory(prefix="pico-")
            directory = Path(scratch.name)
            cleanup.append(scratch.cleanup)
        url = f"sqlite:///{directory / f'pico-{uuid.uuid4().hex[:8]}.db'}"
    else:
        url = storage
    opened = dict(options, session=session, provider=provider, clock=clock, tools=list(tools))
    if hooks is not None:
        opened["hooks"] = hooks
    try:
        h = await Harness.open(url, **opened)
    except BaseException:
        for step in cleanup:
            step()
        raise
    return Rig(h, provider, clock, url, await h.root(), opened, cleanup)


def _closing(
    opener: Callable[_P, Awaitable[Rig]],
) -> Callable[_P, AbstractAsyncContextManager[Rig]]:
    """``opener`` as an async context manager that closes (and discards) the rig on exit."""

    @contextlib.asynccontextmanager
    async def opened(*args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[Rig]:
        rig = await opener(*args, **kwargs)
        try:
            yield rig
        finally:
            await rig.close()

    return opened


#: ``async with pico.testing.harness(...) as t:`` -- ``open_rig``'s arguments; the rig is
#: closed and its storage discarded on exit.
harness = _closing(open_rig)


# ---------------------------------------------------------------------- pytest plugin
def pytest_configure(config: Any) -> None:
    """pytest's hook (this module is the ``pico`` pytest11 plugin): register the
    fixtures. pytest is imported here, so importing this module never needs it."""
    import pytest

    name = "pico.testing.fixtures"
    if config.pluginmanager.has_plugin(name):
        return

    class _Fixtures:
        @pytest.fixture
        def pico_clock(self) -> FakeClock:
            """A ``pico.FakeClock``: pass it as ``harness(clock=...)``."""
            return FakeClock()

        @pytest.fixture
        def pico_faux(self) -> FauxProvider:
            """An empty ``pico.FauxProvider``: extend ``.script``, pass it as
            ``harness(provider=...)``."""
            return FauxProvider([])

        @pytest.fixture
        def pico_storage_url(self, tmp_path: Path) -> str:
            """A SQLite URL for a fresh file under ``tmp_path``."""
            return f"sqlite:///{tmp_path / 'pico.db'}"

    config.pluginmanager.register(_Fixtures(), name)
