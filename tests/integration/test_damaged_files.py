"""A damaged SQLite file is never made worse: every open (read-only and for writing)
either reads correctly or raises ``StorageCorruptError``, never another exception, and a
failed open leaves the file byte-identical (and its -wal not grown).

One real session file (commits, a session value, a tool turn) is built once; each case
damages a copy the way disks and people do: byte flips in the header, in an index page and
in the pages holding event bodies, zeroed pages, truncations, garbage, and event bodies
rewritten through sqlite3 into JSON that does not decode, bad UTF-8 or an unknown topic.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pico
from pico.infrastructure.sql.bodies import DEFLATE, DICTIONARIES, MAX_DECOMPRESSED, ZSTD
from pico.infrastructure.sql.store import SQLITE_PAGE_SIZE

SESSION = "s"
PAGE = SQLITE_PAGE_SIZE  # a file pico creates: the damage below lands on whole pages
SEARCH = pico.session_value("notes", str)


async def _read(args: pico.JsonObject, ctx: pico.ToolContext) -> str:
    return f"contents of {args['path']}"


async def _build(path: Path) -> None:
    provider = pico.FauxProvider(
        [pico.FauxResponse(tool_calls=[("read", {"path": "parser.py"})]), "use a loop"]
    )
    tool = pico.Tool("read", "Read a file", {"type": "object"}, _read)
    h = await pico.Harness.open(
        f"sqlite:///{path}", session=SESSION, provider=provider, tools=[tool]
    )
    c = await h.root()
    for i in range(6):
        await c.append("user", f"message {i} " + "x" * 300)
    await h.set_value(SEARCH, "kept")
    _, result = await c.prompt("Why is the parser slow?")
    assert result is not None and result.status == "done"
    await h.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    path = tmp_path_factory.mktemp("pristine") / "session.db"
    asyncio.run(_build(path))
    assert not Path(f"{path}-wal").exists()  # closed cleanly: one self-contained file
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE
    finally:
        conn.close()
    return path


def _pages(path: Path) -> dict[str, list[int]]:
    """Page numbers of each table and index (SQLite's dbstat), read on a copy."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out: dict[str, list[int]] = {}
        for name, pageno in conn.execute("SELECT name, pageno FROM dbstat ORDER BY pageno"):
            out.setdefault(name, []).append(pageno)
        return out
    finally:
        conn.close()


def _flip(data: bytearray, offset: int, span: int = 1) -> None:
    for i in range(offset, min(offset + span, len(data))):
        data[i] ^= 0xFF


def _page_damage(table: str, where: str, how: str) -> Callable[[Path, bytearray], bytes]:
    def damage(src: Path, data: bytearray) -> bytes:
        pages = _pages(src)[table]
        page = {"first": pages[0], "last": pages[-1], "middle": pages[len(pages) // 2]}[where]
        start = (page - 1) * PAGE
        if how == "zero":
            data[start : start + PAGE] = bytes(PAGE)
        elif how == "header":  # the b-tree page header: type, cell count, pointers
            _flip(data, start + (100 if page == 1 else 0), 12)
        else:  # cell content near the end of the page
            _flip(data, start + PAGE - 300, 40)
        return bytes(data)

    return damage


def _bytes_damage(fn: Callable[[bytearray], bytes]) -> Callable[[Path, bytearray], bytes]:
    return lambda _src, data: fn(data)


def _flip_at(offset: int, span: int = 1) -> Callable[[Path, bytearray], bytes]:
    def damage(data: bytearray) -> bytes:
        _flip(data, offset, span)
        return bytes(data)

    return _bytes_damage(damage)


DAMAGE: dict[str, Callable[[Path, bytearray], bytes]] = {
    "header-magic": _flip_at(0, 4),
    "header-page-size": _flip_at(16, 2),
    "header-write-version": _flip_at(18),
    "header-read-version": _flip_at(19),
    "header-reserved-space": _flip_at(20),
    "header-page-count": _flip_at(28, 4),
    "header-freelist": _flip_at(32, 8),
    "header-schema-cookie": _flip_at(40, 4),
    "header-schema-format": _flip_at(44, 4),
    "header-text-encoding": _flip_at(56, 4),
    "header-version-valid-for": _flip_at(92, 8),
    "schema-table-cells": _flip_at(PAGE - 600, 200),
    "truncated-to-100-bytes": _bytes_damage(lambda d: bytes(d[:100])),
    "truncated-to-half-a-page": _bytes_damage(lambda d: bytes(d[: PAGE // 2])),
    "truncated-to-3-pages": _bytes_damage(lambda d: bytes(d[: 3 * PAGE])),
    "truncated-by-one-page": _bytes_damage(lambda d: bytes(d[:-PAGE])),
    "truncated-mid-page": _bytes_damage(lambda d: bytes(d[: len(d) - PAGE // 2])),
    "garbage": _bytes_damage(lambda d: bytes((i * 7919 + 13) % 256 for i in range(len(d)))),
    "first-page-zeroed": _bytes_damage(lambda d: bytes(PAGE) + bytes(d[PAGE:])),
}
for _where in ("first", "middle", "last"):
    for _how in ("zero", "header", "cells"):
        DAMAGE[f"event-bodies-{_where}-page-{_how}"] = _page_damage("pico_events", _where, _how)
    DAMAGE[f"event-index-{_where}-page-zero"] = _page_damage(
        "sqlite_autoindex_pico_events_1", _where, "zero"
    )
    DAMAGE[f"event-index-{_where}-page-cells"] = _page_damage(
        "sqlite_autoindex_pico_events_1", _where, "cells"
    )
DAMAGE["sessions-row-page-zero"] = _page_damage("pico_sessions", "first", "zero")
DAMAGE["live-tasks-index-zero"] = _page_damage("pico_tasks_live", "first", "zero")
DAMAGE["snapshots-page-cells"] = _page_damage("pico_snapshots", "first", "cells")


def _body_damage(sql: str, *params: Any) -> Callable[[Path, bytearray], bytes]:
    """Rewrite rows through sqlite3: every page stays valid, the stored body does not."""
    return _rewrite(lambda conn: conn.execute(sql, params))


def _compressed_damage(
    event: str, damage: Callable[[bytes], bytes], codec: int
) -> Callable[[Path, bytearray], bytes]:
    """Damage the compressed body (``codec``: deflate or zstd) of the event at position
    ``event`` (SQL)."""

    def change(conn: sqlite3.Connection) -> None:
        position, state = conn.execute(
            f"SELECT id, state FROM pico_events WHERE id = {event}"
        ).fetchone()
        assert state[0] == codec
        conn.execute("UPDATE pico_events SET state = ? WHERE id = ?", (damage(state), position))

    return _rewrite(change)


def _deflate_bomb(stored: bytes) -> bytes:
    """A deflate body with the same dictionary that inflates to 1 MiB more than
    ``MAX_DECOMPRESSED`` (~65 KB stored)."""
    d = DICTIONARIES[stored[1]]
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -d.wbits, zdict=d.data)
    chunk = b"0" * 2**20
    parts = [squeeze.compress(chunk) for _ in range(MAX_DECOMPRESSED // 2**20 + 1)]
    return stored[:2] + b"".join(parts) + squeeze.flush()


def _topic_damage(event: str, topic: str | bytes) -> Callable[[Path, bytearray], bytes]:
    """Point the event at position ``event`` (SQL) at a new ``pico_topics`` row holding
    ``topic`` (bytes: stored as TEXT as they are, which need not be UTF-8)."""

    def change(conn: sqlite3.Connection) -> None:
        added = conn.execute("INSERT INTO pico_topics (topic) VALUES (CAST(? AS TEXT))", (topic,))
        updated = conn.execute(
            f"UPDATE pico_events SET topic_id = ? WHERE id = {event}", (added.lastrowid,)
        )
        assert updated.rowcount == 1

    return _rewrite(change)


def _rewrite(change: Callable[[sqlite3.Connection], Any]) -> Callable[[Path, bytearray], bytes]:
    def damage(src: Path, _data: bytearray) -> bytes:
        work = src.parent / "rewrite" / src.name
        work.parent.mkdir(exist_ok=True)
        shutil.copy(src, work)
        conn = sqlite3.connect(work)
        change(conn)
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        out = work.read_bytes()
        shutil.rmtree(work.parent)
        return out

    return damage


_LAST_SESSION_EVENT = (
    "(SELECT max(id) FROM pico_events "
    "WHERE topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE '%Session.%') "
    "AND stream_id = (SELECT stream_id FROM pico_events WHERE id = 1))"
)
_LAST_CONVERSATION_EVENT = (
    "(SELECT max(id) FROM pico_events "
    "WHERE topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE '%Conversation.%'))"
)
BODIES: dict[str, Callable[[Path, bytearray], bytes]] = {
    "session-event-not-json": _body_damage(
        f"UPDATE pico_events SET state = ? WHERE id = {_LAST_SESSION_EVENT}", b"{not json"
    ),
    "session-event-bad-utf8": _body_damage(
        f"UPDATE pico_events SET state = ? WHERE id = {_LAST_SESSION_EVENT}", b'{"a": "\xff\xfe"}'
    ),
    "session-event-wrong-fields": _body_damage(
        f"UPDATE pico_events SET state = ? WHERE id = {_LAST_SESSION_EVENT}", b'{"x": 1}'
    ),
    "session-event-unknown-topic": _topic_damage(_LAST_SESSION_EVENT, "nowhere:Gone"),
    "conversation-event-not-json": _body_damage(
        f"UPDATE pico_events SET state = ? WHERE id = {_LAST_CONVERSATION_EVENT}", b"\x00\x01"
    ),
    # The session's first event (Session.Created: no dictionary of its own, deflate) and
    # the frequent topics' last (zstd).
    "session-event-deflate-cut-short": _compressed_damage("1", lambda b: b[:-4], DEFLATE),
    "session-event-deflate-unknown-dictionary": _compressed_damage(
        "1", lambda b: bytes((DEFLATE, 250)) + b[2:], DEFLATE
    ),
    # A few KB that inflate past what pico ever compresses: refused at the limit.
    "session-event-deflate-bomb": _compressed_damage("1", _deflate_bomb, DEFLATE),
    "session-event-zstd-cut-short": _compressed_damage(_LAST_SESSION_EVENT, lambda b: b[:-4], ZSTD),
    "session-event-zstd-unknown-dictionary": _compressed_damage(
        _LAST_SESSION_EVENT, lambda b: bytes((ZSTD, 250)) + b[2:], ZSTD
    ),
    "conversation-event-zstd-garbage": _compressed_damage(
        _LAST_CONVERSATION_EVENT, lambda b: b[:2] + b"\xff" * 8, ZSTD
    ),
    "every-snapshot-not-json": _body_damage("UPDATE pico_snapshots SET state = ?", b"{"),
    "first-event-bad-utf8-text": _topic_damage("1", b"\xff\xfe\xfd"),
    "entry-content-bad-utf8": _body_damage(
        "UPDATE pico_entries SET content = CAST(? AS TEXT)", b"\xc3\x28"
    ),
    "live-task-state-not-json": _body_damage("UPDATE pico_tasks SET state = '{'"),
    "session-value-not-json": _body_damage("UPDATE pico_values SET value = '[1,'"),
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _use(h: pico.Harness) -> None:
    """What a reader does: every read either answers or reports the damage."""
    for read in (
        lambda: h.root(),
        lambda: h.get_value(SEARCH),
        lambda: h.inspect(),
    ):
        with contextlib.suppress(pico.StorageCorruptError):
            await read()
    try:
        c = await h.root()
        await c.entries(limit=1000)
        await c.snapshot()
    except pico.StorageCorruptError:
        pass
    try:
        after = 0
        while batch := h.audit(after=after, limit=500):
            after = batch[-1].position
    except pico.StorageCorruptError:
        pass


async def _open_each_way(path: Path) -> list[str]:
    """Open read-only, then for writing; return how each went."""
    outcomes = []
    wal = Path(f"{path}-wal")
    for read_only in (True, False):
        before = _sha(path)
        wal_before = wal.stat().st_size if wal.exists() else 0
        try:
            h = await pico.Harness.open(f"sqlite:///{path}", session=SESSION, read_only=read_only)
        except (pico.StorageCorruptError, pico.UnknownSessionError) as exc:
            # A failed open changed nothing: same bytes, no WAL frames.
            assert _sha(path) == before, f"{type(exc).__name__} but the file changed: {exc}"
            assert (wal.stat().st_size if wal.exists() else 0) <= wal_before
            assert str(path) in str(exc) or isinstance(exc, pico.UnknownSessionError)
            outcomes.append(type(exc).__name__)
            continue
        try:
            await _use(h)
        finally:
            await h.close()
        if read_only:
            assert _sha(path) == before, "a read-only open wrote into the file"
        outcomes.append("opened")
    return outcomes


#: Damage in what every open reads (the header, the schema, the Session stream and its
#: index, the session row, the live-task index, the newest pages): both opens refuse it,
#: before the write open appends anything.
REFUSED = {
    "header-magic",
    "header-page-size",
    "header-read-version",
    "header-write-version",
    "header-text-encoding",
    "first-page-zeroed",
    "garbage",
    "truncated-to-100-bytes",
    "truncated-to-half-a-page",
    "truncated-to-3-pages",
    "truncated-by-one-page",
    "sessions-row-page-zero",
    "live-tasks-index-zero",
    "event-index-first-page-zero",
    "event-bodies-last-page-zero",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
async def test_a_damaged_page_is_read_correctly_or_reported_and_never_written(
    kind: str, pristine: Path, tmp_path: Path
) -> None:
    damaged = DAMAGE[kind](pristine, bytearray(pristine.read_bytes()))
    path = tmp_path / "damaged.db"
    path.write_bytes(damaged)
    outcomes = await _open_each_way(path)
    assert "UnknownSessionError" not in outcomes  # the file is there: damage, not absence
    if kind in REFUSED:
        assert outcomes == ["StorageCorruptError", "StorageCorruptError"]


@pytest.mark.parametrize("kind", sorted(BODIES))
async def test_an_event_body_that_does_not_decode_is_reported_with_its_position(
    kind: str, pristine: Path, tmp_path: Path
) -> None:
    path = tmp_path / "damaged.db"
    path.write_bytes(BODIES[kind](pristine, bytearray()))
    outcomes = await _open_each_way(path)
    assert "UnknownSessionError" not in outcomes
    if kind.startswith("session-event"):
        # The Session aggregate is what every open reads first: both opens refuse.
        assert outcomes == ["StorageCorruptError", "StorageCorruptError"]


async def test_the_open_names_the_event_that_does_not_decode(
    pristine: Path, tmp_path: Path
) -> None:
    path = tmp_path / "damaged.db"
    path.write_bytes(BODIES["session-event-not-json"](pristine, bytearray()))
    with sqlite3.connect(path) as conn:
        (position,) = conn.execute(f"SELECT {_LAST_SESSION_EVENT}").fetchone()
    before = _sha(path)
    with pytest.raises(pico.StorageCorruptError) as info:
        await pico.Harness.open(f"sqlite:///{path}", session=SESSION)
    assert str(path) in str(info.value) and "could not be reconstructed" in str(info.value)
    assert _sha(path) == before
    # Reading the log finds the event by its position.
    h_ro: Any = None
    with pytest.raises(pico.StorageCorruptError, match=f"event {position} of session"):
        from pico.infrastructure.container import open_storage

        h_ro = open_storage(f"sqlite:///{path}", session=SESSION, durability=None, read_only=True)
        list(h_ro.replay())
    if h_ro is not None:
        h_ro.close()
    assert _sha(path) == before


@pytest.mark.parametrize("read_only", [True, False])
async def test_an_open_refuses_a_read_model_that_lost_its_root_conversation(
    read_only: bool, pristine: Path, tmp_path: Path
) -> None:
    """The open checks the root's row exists (one point read, not its context)."""
    path = tmp_path / "damaged.db"
    shutil.copy(pristine, path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute("DELETE FROM pico_conversations WHERE id = 1").rowcount == 1
    before = _sha(path)
    with pytest.raises(pico.StorageCorruptError, match="root conversation 1"):
        await pico.Harness.open(f"sqlite:///{path}", session=SESSION, read_only=read_only)
    assert _sha(path) == before


@pytest.mark.parametrize("read_only", [True, False])
async def test_an_empty_file_is_a_new_database_for_writing_and_unknown_for_reading(
    read_only: bool, tmp_path: Path
) -> None:
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    if read_only:
        with pytest.raises(pico.UnknownSessionError):
            await pico.Harness.open(f"sqlite:///{path}", session=SESSION, read_only=True)
        assert path.read_bytes() == b""
        return
    h = await pico.Harness.open(f"sqlite:///{path}", session=SESSION)
    await (await h.root()).append("user", "first")
    await h.close()
    assert path.stat().st_size > 0


async def test_a_read_only_open_of_an_intact_file_writes_nothing_and_reads_everything(
    pristine: Path, tmp_path: Path
) -> None:
    path = tmp_path / "intact.db"
    shutil.copy(pristine, path)
    before = _sha(path)
    h = await pico.Harness.open(f"sqlite:///{path}", session=SESSION, read_only=True)
    c = await h.root()
    assert len((await c.entries(limit=1000)).items) >= 8
    assert await h.get_value(SEARCH) == "kept"
    assert len(h.audit(limit=10_000)) > 10
    await h.close()
    assert _sha(path) == before
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0


async def test_a_read_only_open_of_a_copy_taken_mid_run_reads_its_wal_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """A copy taken while the owner runs (a crash, a backup of the live files): the
    committed frames are in the -wal, and there is no -shm. Reading it changes neither."""
    live = tmp_path / "live" / "session.db"
    live.parent.mkdir()
    h = await pico.Harness.open(f"sqlite:///{live}", session=SESSION)
    c = await h.root()
    for i in range(5):
        await c.append("user", f"m{i}")
    copy = tmp_path / "copy" / "session.db"
    copy.parent.mkdir()
    shutil.copy(live, copy)
    shutil.copy(f"{live}-wal", f"{copy}-wal")  # the -shm is not copied
    await h.close()
    wal = Path(f"{copy}-wal")
    before, wal_before = _sha(copy), _sha(wal)
    assert wal.stat().st_size > 0
    ro = await pico.Harness.open(f"sqlite:///{copy}", session=SESSION, read_only=True)
    page = await (await ro.root()).entries(limit=100)
    assert [e.content for e in page.items] == [f"m{i}" for i in range(5)]
    await ro.close()
    assert (_sha(copy), _sha(wal)) == (before, wal_before)


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_failed_open_leaves_a_leftover_wal_and_its_file_byte_identical(
    read_only: bool, pristine: Path, tmp_path: Path
) -> None:
    """After a crash the newest commits (here: a damaged session event) are only in the
    -wal. SQLite's last connection to close checkpoints the -wal into the file and deletes
    it; a failed open must not: the file, the -wal and the damaged frames in it stay as
    they were, where an operator can set them aside or restore."""
    path = tmp_path / "crashed.db"
    shutil.copy(pristine, path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"UPDATE pico_events SET state = X'7B6E6F' WHERE id = {_LAST_SESSION_EVENT}")
    # Leave the -wal behind as a crash would: copy the files while the writer still has
    # them open (closing it would checkpoint).
    crashed = tmp_path / "copy" / "crashed.db"
    crashed.parent.mkdir()
    shutil.copy(path, crashed)
    shutil.copy(f"{path}-wal", f"{crashed}-wal")
    conn.close()
    wal = Path(f"{crashed}-wal")
    before = (_sha(crashed), _sha(wal))
    assert wal.stat().st_size > 0
    with pytest.raises(pico.StorageCorruptError):
        await pico.Harness.open(f"sqlite:///{crashed}", session=SESSION, read_only=read_only)
    # Check: nothing was checkpointed, nothing deleted.
    assert wal.exists() and (_sha(crashed), _sha(wal)) == before


async def test_a_verified_write_open_still_checkpoints_its_wal_on_close(
    pristine: Path, tmp_path: Path
) -> None:
    path = tmp_path / "fine.db"
    shutil.copy(pristine, path)
    h = await pico.Harness.open(f"sqlite:///{path}", session=SESSION)
    await (await h.root()).append("user", "after the guard")
    await h.close()
    # Check: once the open verified the file and claimed, closing folds the -wal in as
    # SQLite always does (the guard was released at the claim).
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
