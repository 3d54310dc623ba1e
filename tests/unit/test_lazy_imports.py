"""``import pico`` loads SQLAlchemy only when a process uses SQL: a session on memory or
JSONL storage never imports it; the SQL tools (and the container) are the same objects
as in their modules, imported on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid

import pytest

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


@pytest.mark.parametrize(
    ("raised", "expected", "text"),
    [
        # What the SQL adapter makes of a pool that lent no connection in time
        # (sql/store.py translate_error; tests/integration/test_pg_pool.py meets it for real).
        (
            pico.StorageUnavailableError("every connection of this process's pool is in use"),
            pico.StorageUnavailableError,
            "every connection of this process's pool is in use",
        ),
        (TimeoutError("not the pool's"), pico.StorageCorruptError, "could not be reconstructed"),
    ],
)
def test_a_load_passes_pico_errors_through_and_calls_any_other_failure_damage(
    monkeypatch: pytest.MonkeyPatch, raised: Exception, expected: type, text: str
) -> None:
    # Storage names no driver: it needs no SQLAlchemy to tell unavailability from damage.
    storage = build_storage(settings_for(f"memory://{uuid.uuid4()}", session="s"))
    assert isinstance(storage, EventSourcedStorage)

    def select_events(*args: object, **kwargs: object) -> list[object]:
        raise raised

    monkeypatch.setattr(storage.recorder, "select_events", select_events)
    with pytest.raises(pico.PicoError) as caught:
        storage.load(uuid.uuid4())
    assert type(caught.value) is expected and text in str(caught.value)
