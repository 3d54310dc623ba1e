"""The hash chain over commit boundaries (issue 13, "Tamper evidence"): every boundary's
link is recomputed here from the raw log with hashlib alone (an oracle independent of
pico's chain module), and tampering with each backend's storage directly (raw SQL on
SQLite and PostgreSQL, an edited JSONL line) is caught at the batch where it happened."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

import pico
from pico.infrastructure.container import open_storage
from pico.infrastructure.sql.bodies import encode
from pico.infrastructure.storage import EventSourcedStorage
from pico.infrastructure.tamper import verify
from tests.backends import Backend

BOUNDARY = ("pico.domain.session:Session.Committed", "pico.domain.session:Session.Claimed")


async def _history(backend: Backend) -> None:
    """Three openings, several commands: more than one claim, values and a fork."""
    async with await backend.open() as h:
        c = await h.root()
        q = await c.append("user", "Inspect the parser")
        await c.append("assistant", "It recurses per token")
        await c.fork(at_entry=q)
    async with await backend.open() as h:
        await (await h.root()).append("user", "Use a loop")


def _log(backend: Backend) -> list[tuple[int, Any]]:
    storage = open_storage(backend.url, session=backend.session, durability=None, read_only=True)
    assert isinstance(storage, EventSourcedStorage)
    try:
        rows = []
        after = 0
        while page := storage._recorder().select_session_events(
            backend.session, after=after, limit=500
        ):
            rows.extend(page)
            after = page[-1][0]
        return rows
    finally:
        storage.close()


def _oracle_links(rows: list[tuple[int, Any]]) -> list[tuple[str, str]]:
    """(stored link, recomputed link) per boundary, straight from the documented formula."""
    out, prev, batch = [], "", []
    for _, stored in rows:
        batch.append(stored)
        if stored.topic not in BOUNDARY:
            continue
        h = hashlib.sha256(prev.encode())
        for event in batch:
            body = event.state
            if event is batch[-1]:
                link = json.loads(body)["link"]
                body = body.replace(link.encode(), b"sha256:" + b"0" * 64)
            oid = event.originator_id
            hex_id = (oid if isinstance(oid, UUID) else UUID(str(oid))).hex
            h.update(f"{hex_id} {event.originator_version} {event.topic} {len(body)}\n".encode())
            h.update(body)
        out.append((link, "sha256:" + h.hexdigest()))
        prev, batch = link, []
    return out


async def test_every_boundary_carries_the_link_of_its_batch_and_the_one_before(
    backend: Backend,
) -> None:
    await _history(backend)
    rows = _log(backend)
    links = _oracle_links(rows)
    # Check: one link per batch, each the digest over the previous link and the bodies.
    assert len(links) >= 6
    assert all(stored == computed for stored, computed in links)
    assert len({stored for stored, _ in links}) == len(links)
    async with await backend.open(read_only=True) as h:
        report = await h.verify()
    assert report.ok, report.breaks
    assert report.events == len(rows) and report.through == rows[-1][0]
    assert report.head_link == links[-1][0]
    assert report.unchained == 0 and report.tail == 0
    assert report.summary().startswith(f"verified {len(rows)} events through position ")


async def test_the_link_is_written_in_the_batch_and_reopening_chains_on(backend: Backend) -> None:
    await _history(backend)
    before = _log(backend)
    async with await backend.open() as h:
        await (await h.root()).append("user", "one more")
        report = await h.verify()
    assert report.ok and report.events > len(before)
    # Check: the reopened owner chained from the stored head, not from a fresh start.
    links = _oracle_links(_log(backend))
    assert all(stored == computed for stored, computed in links)


async def test_a_task_execution_names_itself_on_the_boundaries_it_writes(backend: Backend) -> None:
    provider = pico.FauxProvider(["The parser recurses."])
    async with await backend.open(provider=provider) as h:
        c = await h.root()
        _, result = await c.prompt("Why is it slow?")
        assert result is not None and result.status == "done"
    tasks = [
        json.loads(stored.state).get("task")
        for _, stored in _log(backend)
        if stored.topic == BOUNDARY[0]
    ]
    # Check: the caller's commands carry no task, the generation's settlement names it.
    assert None in tasks
    assert any(isinstance(t, int) for t in tasks)


# --------------------------------------------------------------------------- tampering
def _sqlite(backend: Backend) -> sqlite3.Connection:
    return sqlite3.connect(backend.url.removeprefix("sqlite:///"))


def _raw_sql(backend: Backend, sql: str, *params: Any) -> None:
    """Run one statement against the backend's database behind pico's back."""
    if backend.name == "sqlite":
        db = _sqlite(backend)
        with db:
            db.execute(sql.replace("%s", "?"), params)
        db.close()
    else:
        with psycopg.connect(backend.url, autocommit=True) as conn:
            conn.execute(sql, params)


def _entry_position(rows: list[tuple[int, Any]], text: str) -> int:
    return next(
        p for p, s in rows if s.topic.endswith(".EntryAppended") and text.encode() in s.state
    )


def _batch_of(rows: list[tuple[int, Any]], position: int) -> tuple[int, int]:
    """(first, last) position of the batch holding ``position``."""
    first: int | None = None
    for p, stored in rows:
        first = p if first is None else first
        if stored.topic in BOUNDARY:
            if p >= position:
                return first, p
            first = None
    raise AssertionError(position)


async def _verified(backend: Backend) -> pico.ChainReport:
    return await verify(backend.url, session=backend.session)


async def test_an_edited_event_body_is_found_at_its_batch(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    edited = _entry_position(rows, "It recurses per token")
    stored = dict(rows)[edited]  # read through pico: JSON; stored again as pico stores it
    body = encode(stored.topic, stored.state.replace(b"per token", b"per tok3n"))
    _raw_sql(backend, "UPDATE pico_events SET state = %s WHERE id = %s", body, edited)
    report = await _verified(backend)
    assert not report.ok
    first, last = _batch_of(rows, edited)
    # Check: the first break is the edited event's batch, which holds the edited event.
    assert (report.breaks[0].position, report.breaks[0].last) == (first, last)
    assert first <= edited <= last
    assert "edited, removed, reordered or inserted" in report.breaks[0].message


async def test_a_deleted_event_is_found_at_its_batch(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    deleted = _entry_position(rows, "Use a loop")
    _raw_sql(backend, "DELETE FROM pico_events WHERE id = %s", deleted)
    report = await _verified(backend)
    first, last = _batch_of(rows, deleted)
    assert not report.ok and report.breaks[0].last == last
    # The deleted row was the batch's first: the break starts at the next stored event.
    assert report.breaks[0].position == min(p for p, _ in rows if p > deleted and p >= first)


async def test_a_deleted_whole_batch_is_found_at_the_next_batch(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    position = _entry_position(rows, "It recurses per token")
    first, last = _batch_of(rows, position)
    _raw_sql(backend, "DELETE FROM pico_events WHERE id >= %s AND id <= %s", first, last)
    report = await _verified(backend)
    next_first, _ = _batch_of(rows, last + 1)
    assert not report.ok and report.breaks[0].position == next_first


async def test_reordered_events_are_found_at_their_batch(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    a = _entry_position(rows, "Inspect the parser")
    b = a + 1  # the context append right after it, in the same batch
    assert _batch_of(rows, a) == _batch_of(rows, b)
    _raw_sql(backend, "UPDATE pico_events SET id = -1 WHERE id = %s", a)
    _raw_sql(backend, "UPDATE pico_events SET id = %s WHERE id = %s", a, b)
    _raw_sql(backend, "UPDATE pico_events SET id = %s WHERE id = -1", b)
    report = await _verified(backend)
    assert not report.ok and report.breaks[0].position == _batch_of(rows, a)[0]


async def test_an_inserted_event_is_found_at_its_batch(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    target = _entry_position(rows, "It recurses per token")
    first, last = _batch_of(rows, target)
    # Make room after the target entry (positions are shared by every session of a
    # PostgreSQL database: move this session's later rows far up) and insert a forged copy.
    offset = 1_000_000_000
    for p, _ in reversed(rows):
        if p > target:
            _raw_sql(backend, "UPDATE pico_events SET id = %s WHERE id = %s", p + offset, p)
    _raw_sql(
        backend,
        "INSERT INTO pico_events (id, session_number, stream_id, originator_version, topic_id, "
        "state) SELECT %s, session_number, stream_id, originator_version + 1000, topic_id, state "
        "FROM pico_events WHERE id = %s",
        target + offset // 2,
        target,
    )
    report = await _verified(backend)
    assert not report.ok and report.breaks[0].position == first
    assert report.breaks[0].last == last + offset


async def test_a_removed_link_after_linked_batches_is_a_break(sql_backend: Backend) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    boundaries = [(p, s) for p, s in rows if s.topic == BOUNDARY[0]]
    p, stored = boundaries[-2]
    state = json.loads(stored.state)
    del state["link"], state["task"], state["class_version"]
    _raw_sql(
        backend,
        "UPDATE pico_events SET state = %s WHERE id = %s",
        encode(stored.topic, json.dumps(state, separators=(",", ":")).encode()),
        p,
    )
    report = await _verified(backend)
    assert not report.ok and report.breaks[0].last == p
    assert "carries no link" in report.breaks[0].message


async def test_an_edited_jsonl_line_is_found_at_its_batch(tmp_path: Path) -> None:
    backend = Backend("jsonl", f"jsonl:///{tmp_path / 'j'}")
    await _history(backend)
    rows = _log(backend)
    edited = _entry_position(rows, "It recurses per token")
    journal = tmp_path / "j" / f"{backend.session}.jsonl"
    text = journal.read_text()
    assert text.count("per token") == 1
    journal.write_text(text.replace("per token", "per tok3n"))
    report = await _verified(backend)
    first, last = _batch_of(rows, edited)
    assert not report.ok and (report.breaks[0].position, report.breaks[0].last) == (first, last)


def test_pico_verify_exits_zero_when_verified_and_one_at_the_first_break(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from pico.infrastructure.cli.app import app, run

    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'c.db'}")
    asyncio.run(_history(backend))
    assert run(app, ["verify", backend.url, "--session", backend.session]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verified ") and "head link sha256:" in out
    rows = _log(backend)
    position = _entry_position(rows, "Use a loop")
    stored = dict(rows)[position]
    body = encode(stored.topic, stored.state.replace(b"loop", b"l00p"))
    _raw_sql(backend, "UPDATE pico_events SET state = %s WHERE id = %s", body, position)
    assert run(app, ["verify", backend.url, "--session", backend.session]) == 1
    out = capsys.readouterr().out
    assert f"history was changed at position {_batch_of(rows, position)[0]}" in out
    # An unknown session is one line on stderr and exit code 2, not a traceback.
    assert run(app, ["verify", backend.url, "--session", "nobody"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pico: ") and err.count("\n") == 1


async def test_a_removed_last_boundary_leaves_events_that_are_a_break(
    sql_backend: Backend,
) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    last = rows[-1][0]
    assert rows[-1][1].topic == BOUNDARY[0]
    _raw_sql(backend, "DELETE FROM pico_events WHERE id = %s", last)
    report = await _verified(backend)
    first, _ = _batch_of(rows, last)
    # Check: pico never stores events without their boundary, so this is tampering.
    assert not report.ok and report.tail == last - first
    assert (report.breaks[-1].position, report.breaks[-1].last) == (first, rows[-2][0])
    assert "follow the last commit boundary" in report.breaks[-1].message


async def test_stripping_every_link_does_not_pass_for_history_before_the_chain(
    sql_backend: Backend,
) -> None:
    backend = sql_backend
    await _history(backend)
    rows = _log(backend)
    for position, stored in rows:
        if stored.topic in BOUNDARY:
            link = json.loads(stored.state)["link"]
            body = encode(stored.topic, stored.state.replace(link.encode(), b""))
            _raw_sql(backend, "UPDATE pico_events SET state = %s WHERE id = %s", body, position)
    report = await _verified(backend)
    # Check: a version-2 boundary without its link is a break, not "written before".
    assert not report.ok and report.unchained == 0
    assert report.breaks[0].position == rows[0][0]
    assert "carries no link but is a chained version" in report.breaks[0].message
