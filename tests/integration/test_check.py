"""``pico check`` / ``pico.check``: a full verification that reads only. A clean session
checks clean on every backend; each kind of damage a cheap open cannot see is a finding
with exit code 1; the file's bytes never change."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import pico
from tests.backends import Backend
from tests.bodies import edit_bodies

ROOT = Path(__file__).resolve().parents[2]

PLAN = pico.conversation_value("plugin.plan", int)
MOVES = pico.conversation_list("game.moves", int)
NAME = pico.session_value("app.name", str)


async def _history(h: pico.Harness) -> None:
    """A little of everything the read model holds: entries, context edits, a fork, a
    compaction, values, lists, a working scope that is written then left live."""
    c = await h.root()
    q = await c.append("user", "Inspect the parser")
    await c.append("assistant", "The parser has two problems")
    alt = await c.fork(at_entry=q)
    await alt.append("user", "another path")
    await c.compact("Summary of the first exchange", through=q)
    await c.set_value(PLAN, 3)
    await c.append_list(MOVES, 1)
    await h.set_value(NAME, "demo")
    work = pico.working_scope("attempt-1")
    frames = pico.working_list("app.frames", str, scope=work)
    await h.command(work, lambda tx: tx.append_list(frames, "partial output"))
    await c.append("user", "the last words")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pico", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _sqlite_session(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "checked.db"
    async with await pico.Harness.open(f"sqlite:///{path}", session="main") as h:
        await _history(h)
    return path, f"sqlite:///{path}"


@contextmanager
def _tamper(path: Path) -> Iterator[sqlite3.Connection]:
    """Change the file behind pico's back, the way an operator with sqlite3 could."""
    conn = sqlite3.connect(path)
    try:
        yield conn
        conn.commit()
    finally:
        conn.close()


def _kinds(report: pico.CheckReport) -> list[str]:
    return [f.kind for f in report.findings]


# ------------------------------------------------------------------------------ clean


async def test_a_clean_session_checks_clean_on_every_backend(backend: Backend) -> None:
    h = await backend.open()
    await _history(h)
    head = h.head()
    report = await pico.check(backend.url, session=backend.session)
    assert report.ok, [str(f) for f in report.findings]
    assert report.events > 10 and report.session == backend.session
    # Check: checking took no claim and wrote nothing; the owner keeps writing.
    await (await h.root()).append("user", "still the owner")
    assert h.head() > head
    await h.close()
    assert (await pico.check(backend.url, session=backend.session)).ok


async def test_check_reads_only_one_session_of_a_shared_database(sql_backend: Backend) -> None:
    async with await sql_backend.open() as h:
        await _history(h)
    async with await sql_backend.open(session=sql_backend.session + "-other") as other:
        await (await other.root()).append("user", "another session's entry")
    report = await pico.check(sql_backend.url, session=sql_backend.session)
    assert report.ok, [str(f) for f in report.findings]


def test_the_cli_check_exits_zero_on_a_clean_file_and_leaves_it_byte_identical(
    tmp_path: Path,
) -> None:
    import asyncio

    path, url = asyncio.run(_sqlite_session(tmp_path))
    before = _sha(path)
    done = _cli("check", url, "--session", "main")
    assert done.returncode == 0, done.stderr
    assert "clean" in done.stdout and done.stderr == ""
    assert _sha(path) == before


# ------------------------------------------------------------------------------ damage


async def test_a_read_model_row_changed_behind_picos_back_is_a_finding(tmp_path: Path) -> None:
    path, url = await _sqlite_session(tmp_path)
    with _tamper(path) as conn:
        conn.execute(
            "UPDATE pico_entries SET content = '\"tampered\"' WHERE id = "
            "(SELECT min(id) FROM pico_entries)"
        )
    before = _sha(path)
    report = await pico.check(url, session="main")
    assert _kinds(report) == ["read model"]
    message = report.findings[0].message
    assert "pico_entries" in message and "tampered" in message and "Inspect the parser" in message
    assert _sha(path) == before
    # Check: the same through the command line, one finding per line, exit code 1.
    done = _cli("check", url)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("read model: pico_entries row (id=")
    assert _sha(path) == before


async def test_a_deleted_event_row_is_a_version_gap(tmp_path: Path) -> None:
    path, url = await _sqlite_session(tmp_path)
    with _tamper(path) as conn:
        (position,) = conn.execute(
            "SELECT id FROM pico_events WHERE topic_id IN (SELECT id FROM pico_topics "
            "WHERE topic LIKE '%Conversation.EntryAppended') "
            "ORDER BY id LIMIT 1 OFFSET 1"
        ).fetchone()
        conn.execute("DELETE FROM pico_events WHERE id = ?", (position,))
    before = _sha(path)
    report = await pico.check(url, session="main")
    gaps = [f for f in report.findings if f.kind == "versions"]
    assert len(gaps) == 1 and gaps[0].message.startswith("conversation/1: version ")
    assert "is missing" in gaps[0].message
    assert "read model" in _kinds(report)  # the entry is stored, no event produces it
    assert _sha(path) == before


async def test_a_deleted_last_boundary_leaves_an_unterminated_batch(tmp_path: Path) -> None:
    path, url = await _sqlite_session(tmp_path)
    with _tamper(path) as conn:
        conn.execute("DELETE FROM pico_events WHERE id = (SELECT max(id) FROM pico_events)")
    report = await pico.check(url, session="main")
    assert "batch" in _kinds(report)
    batch = next(f for f in report.findings if f.kind == "batch")
    assert "without a Session.Committed or Session.Claimed boundary" in batch.message


async def test_an_event_body_changed_to_other_valid_json_is_a_read_model_difference(
    tmp_path: Path,
) -> None:
    path, url = await _sqlite_session(tmp_path)
    with _tamper(path) as conn:
        edited = edit_bodies(
            conn,
            lambda body: body.replace(b"Inspect the parser", b"Delete the parser"),
            where=(
                "topic_id IN (SELECT id FROM pico_topics "
                "WHERE topic LIKE '%Conversation.EntryAppended')"
            ),
        )
        assert edited > 0
    before = _sha(path)
    report = await pico.check(url, session="main")
    # The edited event no longer matches its commit's link, and the read model no longer
    # matches what the events say.
    assert _kinds(report) == ["chain", "read model"]
    assert "does not match its link" in report.findings[0].message
    assert "Delete the parser" in report.findings[1].message  # what the events now say
    assert _sha(path) == before


async def test_an_event_body_that_does_not_decode_names_its_position_and_aggregate(
    tmp_path: Path,
) -> None:
    path, url = await _sqlite_session(tmp_path)
    with _tamper(path) as conn:
        (position,) = conn.execute(
            "SELECT id FROM pico_events WHERE topic_id IN (SELECT id FROM pico_topics "
            "WHERE topic LIKE '%Conversation.EntryAppended') "
            "ORDER BY id DESC LIMIT 1"
        ).fetchone()
        conn.execute("UPDATE pico_events SET state = x'7b7b' WHERE id = ?", (position,))
    report = await pico.check(url, session="main")
    decode = [f for f in report.findings if f.kind == "decode"]
    assert len(decode) == 1 and decode[0].position == position
    assert f"position {position} (conversation/" in decode[0].message
    # The replay is incomplete, so the read model is not compared (and says so).
    assert any(f.kind == "read model" and "not compared" in f.message for f in report.findings)


def _page_of(path: Path, index: str) -> int:
    conn = sqlite3.connect(path)
    try:
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
        return int((root - 1) * size)
    finally:
        conn.close()


async def test_page_level_damage_is_a_finding_and_the_file_is_left_as_it_was(
    tmp_path: Path,
) -> None:
    path, url = await _sqlite_session(tmp_path)
    # Check: the damage is inside an index page, which no read of the session touches.
    offset = _page_of(path, "pico_entries_kind")
    data = bytearray(path.read_bytes())
    data[offset + 8 : offset + 40] = b"\xff" * 32
    path.write_bytes(bytes(data))
    before = _sha(path)
    report = await pico.check(url, session="main")
    assert not report.ok
    assert set(_kinds(report)) <= {"integrity", "storage"} and _kinds(report)
    assert _sha(path) == before
    done = _cli("check", url)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert _sha(path) == before


@pytest.mark.parametrize("content", [b"", b"garbage, not a database\n" * 10])
async def test_a_file_that_is_not_a_database_is_a_finding(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(content)
    if not content:
        with pytest.raises(pico.UnknownSessionError):  # an empty file holds no session
            await pico.check(f"sqlite:///{path}", session="main")
    else:
        report = await pico.check(f"sqlite:///{path}", session="main")
        assert _kinds(report) == ["storage"] and "not a database" in report.findings[0].message
    assert path.read_bytes() == content


async def test_a_truncated_file_is_a_finding(tmp_path: Path) -> None:
    path, url = await _sqlite_session(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    report = await pico.check(url, session="main")
    assert not report.ok and set(_kinds(report)) <= {"storage", "integrity"}


# --------------------------------------------------------------------- SQL backends


def _engine(backend: Backend) -> sa.Engine:
    url = backend.url
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def _execute(backend: Backend, statement: str, **params: Any) -> None:
    engine = _engine(backend)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), {"sid": backend.session, **params})
            assert result.rowcount > 0, statement
    finally:
        engine.dispose()


async def test_damage_is_found_on_every_sql_backend(sql_backend: Backend) -> None:
    async with await sql_backend.open() as h:
        await _history(h)
    _execute(
        sql_backend,
        "UPDATE pico_values SET value = '99' WHERE session_id = :sid AND namespace = 'app.name'",
    )
    report = await pico.check(sql_backend.url, session=sql_backend.session)
    assert _kinds(report) == ["read model"]
    assert "pico_values" in report.findings[0].message and "'99'" in report.findings[0].message
    _execute(
        sql_backend,
        "DELETE FROM pico_events WHERE id = (SELECT min(id) FROM pico_events WHERE "
        "session_number = (SELECT id FROM pico_session_numbers WHERE session_id = :sid) "
        "AND topic_id IN (SELECT id FROM pico_topics WHERE topic LIKE '%ContextAppended'))",
    )
    report = await pico.check(sql_backend.url, session=sql_backend.session)
    assert "versions" in _kinds(report)


async def test_a_session_that_does_not_exist_is_an_error_not_a_finding(
    sql_backend: Backend,
) -> None:
    async with await sql_backend.open() as h:
        await (await h.root()).append("user", "x")
    with pytest.raises(pico.UnknownSessionError):
        await pico.check(sql_backend.url, session="no-such-session")


async def test_check_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(pico.StorageUnavailableError, match="no SQLite file"):
        await pico.check(f"sqlite:///{path}", session="main")
    assert list(tmp_path.iterdir()) == []
    done = _cli("check", f"sqlite:///{path}")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr and not path.exists()


async def test_a_bad_url_or_session_name_is_a_configuration_error() -> None:
    with pytest.raises(pico.ConfigurationError):
        await pico.check("bogus://x", session="main")
    with pytest.raises(pico.ConfigurationError):
        await pico.check("memory://somewhere", session="")


async def test_a_changed_memory_read_model_is_a_finding() -> None:
    from pico.infrastructure.memory import named_database

    name = "check-memory-damage"
    async with await pico.Harness.open(f"memory://{name}", session="s") as h:
        await _history(h)
        assert (await pico.check(f"memory://{name}", session="s")).ok
        store = named_database(name).read_stores["s"]
        entry = min(store._entries)
        store._entries[entry] = store._entries[entry]._replace(content='"tampered"')
        report = await pico.check(f"memory://{name}", session="s")
        assert _kinds(report) == ["read model"]
        assert f"index _entries key {entry}" in report.findings[0].message


async def test_check_reads_one_snapshot_while_the_owner_commits(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that lands after the events were read and before the tables are compared
    must not show up as a difference: the whole check reads one snapshot."""
    import asyncio

    from pico.infrastructure import verify

    async with await sql_backend.open() as h:
        await _history(h)
    compare = verify._compare
    landed: list[int] = []

    async def commit_meanwhile() -> int:
        async with await sql_backend.open() as owner:
            await (await owner.root()).append("user", "committed during the check")
            return owner.head()

    def compare_after_a_commit(*args: Any) -> None:
        if not landed:  # the check's worker thread: a real commit by another owner, now
            landed.append(asyncio.run(commit_meanwhile()))
        compare(*args)

    monkeypatch.setattr(verify, "_compare", compare_after_a_commit)
    report = await pico.check(sql_backend.url, session=sql_backend.session)
    assert landed, "the commit did not land during the check"
    assert report.ok, [str(f) for f in report.findings]
    monkeypatch.undo()
    # Check: the commit is there, and a fresh check sees it (and is clean too).
    again = await pico.check(sql_backend.url, session=sql_backend.session)
    assert again.ok and again.events > report.events


async def test_an_unreachable_server_is_storage_unavailable_with_the_password_masked() -> None:
    with pytest.raises(pico.StorageUnavailableError) as caught:
        await pico.check("postgresql://pico:secret@127.0.0.1:1/nowhere", session="main")
    assert "secret" not in str(caught.value) and "127.0.0.1" in str(caught.value)
