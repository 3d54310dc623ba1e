"""``import pico`` loads SQLAlchemy only when a process uses SQL: a session on memory or
JSONL storage never imports it; the SQL tools (and the container) are the same objects
as in their modules, imported on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid

import pytest
import sqlalchemy as sa

import pico
from pico.infrastructure.container import build_storage
from pico.infrastructure.settings import settings_for
from pico.infrastructure.storage import EventSourcedStorage

#: A session on each storage that needs no SQL: a faux turn with a tool call, its
#: transcript read back; then what a process has imported.
_NO_SQL = """
import asyncio, sys, tempfile
import pico

async def echo(args, ctx):
    return "seen " + args["path"]

async def turn(url):
    provider = pico.FauxProvider(
        [pico.FauxResponse(text="look", tool_calls=[("echo", {"path": "a"})]), "done"]
    )
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    h = await pico.Harness.open(
        url, session="s", provider=provider, tools=[pico.Tool("echo", "Echo", schema, echo)]
    )
    c = await h.root()
    _, result = await c.prompt("go")
    assert result is not None and result.status == "done", result
    assert [e.kind for e in (await c.entries()).items][-1] == "assistant"
    await h.close()

asyncio.run(turn("memory://lazy"))
asyncio.run(turn("jsonl:///" + tempfile.mkdtemp()))
print("sqlalchemy" in sys.modules)
pico.check  # a SQL tool: imported now
print("sqlalchemy" in sys.modules)
"""


def test_a_session_on_memory_or_jsonl_storage_imports_no_sqlalchemy() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _NO_SQL], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("name", sorted(pico._LAZY))
def test_a_lazy_name_is_its_modules_object(name: str) -> None:
    assert name in pico.__all__
    assert name in dir(pico)
    assert getattr(pico, name) is getattr(importlib.import_module(pico._LAZY[name]), name)


def test_every_public_name_resolves() -> None:
    missing = [name for name in pico.__all__ if not hasattr(pico, name)]
    assert missing == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="'pico' has no attribute 'Verify'"):
        # mypy --strict flags the name too (an unused ignore would fail CI): the module's
        # __getattr__ is hidden from type checkers, so misspellings are not typed Any.
        pico.Verify  # type: ignore[attr-defined]  # noqa: B018


def _failing_load(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> Exception:
    storage = build_storage(settings_for(f"memory://{uuid.uuid4()}", session="s"))
    assert isinstance(storage, EventSourcedStorage)

    def select_events(*args: object, **kwargs: object) -> list[object]:
        raise exc

    monkeypatch.setattr(storage.recorder, "select_events", select_events)
    with pytest.raises(pico.PicoError) as caught:
        storage.load(uuid.uuid4())
    return caught.value


def test_a_pool_timeout_while_loading_is_storage_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Recognised without storage importing SQLAlchemy (this test has imported it).
    err = _failing_load(monkeypatch, sa.exc.TimeoutError("QueuePool limit reached"))
    assert isinstance(err, pico.StorageUnavailableError)
    assert "no database connection became free" in str(err)


def test_any_other_failure_while_loading_is_storage_corrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = _failing_load(monkeypatch, TimeoutError("not the pool's"))
    assert isinstance(err, pico.StorageCorruptError)
    assert "could not be reconstructed" in str(err)
