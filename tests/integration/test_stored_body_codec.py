"""Event bodies on SQLite and PostgreSQL are stored compressed (``infrastructure/sql/
bodies.py``: deflate from schema revision 0007, zstd for the frequent topics from 0009):
the same bytes on both, JSON to everything that reads them through pico (``pico audit``),
and a body that does not decompress is reported by a read, ``pico verify`` and ``pico
check`` at its position, like any damaged body."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.domain import DomainEvent

import pico
from pico.infrastructure.cli.app import app, run
from pico.infrastructure.container import open_storage
from pico.infrastructure.sql import bodies
from pico.infrastructure.sql.bodies import DEFLATE, ZSTD
from tests.backends import Backend, make_backend
from tests.contract.test_stored_bodies import _clock, _stream, _tokens

#: The topics whose new bodies are zstd frames (revision 0009).
_ZSTD_TOPICS = {t for t, i in bodies.ENCODE_WITH.items() if bodies.DICTIONARIES[i].codec == "zstd"}


def _rows(backend: Backend, session: str, sql: str = "") -> list[tuple[Any, ...]]:
    """``(id, originator_id, originator_version, topic, state)`` of the session's stored
    events, as the database holds them (no pico in between): each event row joined to the
    ``pico_streams`` and ``pico_topics`` rows its numbers name, the session by its number
    (schema revision 0008)."""
    query = (
        "SELECT e.id, s.originator_id, e.originator_version, t.topic, e.state "
        "FROM pico_events e JOIN pico_streams s ON s.id = e.stream_id "
        "JOIN pico_topics t ON t.id = e.topic_id "
        "WHERE e.session_number = (SELECT id FROM pico_session_numbers WHERE session_id = "
        f"{'?' if backend.name == 'sqlite' else '%s'}) {sql} ORDER BY e.id"
    )
    if backend.name == "sqlite":
        with sqlite3.connect(backend.url.removeprefix("sqlite:///")) as conn:
            return [(*r[:4], bytes(r[4])) for r in conn.execute(query, (session,))]
    with psycopg.connect(backend.url) as pg:
        return [(*r[:4], bytes(r[4])) for r in pg.execute(query, (session,)).fetchall()]


def _write(backend: Backend, position: int, body: bytes) -> None:
    if backend.name == "sqlite":
        with sqlite3.connect(backend.url.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE pico_events SET state = ? WHERE id = ?", (body, position))
        return
    with psycopg.connect(backend.url, autocommit=True) as pg:
        pg.execute("UPDATE pico_events SET state = %s WHERE id = %s", (body, position))


async def test_sqlite_and_postgresql_store_the_same_compressed_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = "deflated-" + uuid.uuid4().hex[:8]
    stored = {}
    for name in ("sqlite", "postgresql"):
        backend = make_backend(name, tmp_path)
        monkeypatch.setattr(DomainEvent, "create_timestamp", staticmethod(_clock()))
        monkeypatch.setattr("pico.application.line.uuid.uuid4", _tokens())
        decoded = await _stream(backend.url, session)
        monkeypatch.undo()
        raw = _rows(backend, session)
        # Check: every body is compressed with its topic's codec (none here is too small to
        # shrink): zstd for the frequent topics, deflate for the others ...
        assert len(raw) == len(decoded) > 50
        assert all(r[4][0] == (ZSTD if r[3] in _ZSTD_TOPICS else DEFLATE) for r in raw)
        assert {r[4][0] for r in raw} == {ZSTD, DEFLATE}
        assert sum(len(r[4]) for r in raw) < sum(len(d[3]) for d in decoded) / 2
        # ... and pico reads back the JSON the stream wrote.
        assert all(d[3].startswith(b"{") for d in decoded)
        stored[name] = [r[1:] for r in raw]
    assert stored["sqlite"] == stored["postgresql"]


def test_pico_audit_shows_the_json_of_compressed_bodies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = make_backend("sqlite", tmp_path)

    async def write() -> None:
        async with await backend.open() as h:
            await (await h.root()).append("user", "Inspect the parser")

    asyncio.run(write())  # the command runs its own event loop
    raw = _rows(backend, backend.session)
    # Compressed on disk (zstd may keep a short text's bytes as they are, deflate does not).
    entry = next(r[4] for r in raw if r[3].endswith("EntryAppended"))
    assert entry[0] == ZSTD and b'"content"' not in entry
    assert run(app, ["audit", backend.url, "--session", backend.session, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert '"event": "Conversation.EntryAppended"' in out
    assert '"content": "Inspect the parser"' in out


@pytest.fixture(params=["sqlite", "postgresql"])
def sql(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path)


@pytest.mark.parametrize(
    ("topic", "codec"), [("EntryAppended", ZSTD), ("Conversation.Deleted", DEFLATE)]
)
async def test_a_compressed_body_that_does_not_decompress_is_reported_at_its_position(
    sql: Backend, topic: str, codec: int
) -> None:
    async with await sql.open() as h:
        c = await h.root()
        await c.append("user", "Inspect the parser")
        await c.append("assistant", "It recurses per token")
        await c.append("user", "Use a loop")
        # A topic without a dictionary of its own: the fallback's (deflate).
        await h.delete_conversation(await h.command(lambda tx: tx.create_conversation()))
    rows = _rows(sql, sql.session, f"AND t.topic LIKE '%%{topic}'")
    position, state = rows[-1][0], rows[-1][4]
    assert state[0] == codec
    _write(sql, position, state[:-4])  # the zstd frame or deflate stream cut short

    # Check: a read of the log names the event (never a zlib.error) ...
    storage: Any = open_storage(sql.url, session=sql.session, durability=None, read_only=True)
    try:
        with pytest.raises(pico.StorageCorruptError, match=f"event {position} of session"):
            list(storage.replay())
    finally:
        storage.close()
    # ... verify lists it as a break at its position and goes on ...
    report = await pico.verify(sql.url, session=sql.session)
    assert not report.ok
    undecodable = [b for b in report.breaks if "does not decode" in b.message]
    assert [b.position for b in undecodable] == [position]
    # ... and check finds it as a "decode" finding at its position.
    checked = await pico.check(sql.url, session=sql.session)
    decode = [f for f in checked.findings if f.kind == "decode"]
    assert [f.position for f in decode] == [position]
    assert f"position {position} (conversation/" in decode[0].message


async def test_a_session_written_at_0008_and_continued_at_0009_reads_verifies_and_migrates(
    sql: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a pico at 0008 wrote: every topic deflated, with its newest deflate dictionary.
    deflate_only = {
        topic: max(
            d.id for d in bodies.DICTIONARIES.values() if d.codec == "deflate" and d.topic == topic
        )
        for topic in bodies.ENCODE_WITH
    }
    monkeypatch.setattr(bodies, "ENCODE_WITH", deflate_only)
    monkeypatch.setattr(bodies, "_local", threading.local())  # no encoder cached yet
    async with await sql.open() as h:
        c = await h.root()
        await c.append("user", "written at 0008")
        await c.append("assistant", "deflated")
    monkeypatch.undo()
    async with await sql.open() as h:
        c = await h.root()
        await c.append("user", "written at 0009")
        await c.append("assistant", "zstd")
        assert [e.content for e in (await c.entries()).items] == [
            "written at 0008",
            "deflated",
            "written at 0009",
            "zstd",
        ]
    # Check: one stream holds both codecs ...
    entries = _rows(sql, sql.session, "AND t.topic LIKE '%%EntryAppended'")
    assert [r[4][0] for r in entries] == [DEFLATE, DEFLATE, ZSTD, ZSTD]
    # ... the chain (over the JSON) verifies across them, and a copy proves equal.
    assert (await pico.verify(sql.url, session=sql.session)).ok
    report = await pico.migrate(sql.url, f"jsonl:///{tmp_path / 'copy'}", session=sql.session)
    assert report.ok, report.lines()
