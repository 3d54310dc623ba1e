"""Steps for ``pico check``: damaging a session the way an operator with database tools
(or a text editor, for a JSONL journal) could (the one place steps reach past the public
API, because the behaviour is about damage pico did not make), then checking it through
``pico.check``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pytest_bdd import parsers, then, when

import pico
from features.steps.library import World
from pico.infrastructure.jsonl.journal import Journal
from pico.infrastructure.memory import named_database


@pytest.fixture
def checks() -> dict[str, Any]:
    """The reports of this scenario's checks, newest last."""
    return {"reports": []}


def _report(checks: dict[str, Any]) -> pico.CheckReport:
    reports: list[pico.CheckReport] = checks["reports"]
    assert reports, "the scenario checked nothing"
    return reports[-1]


def _engine(world: World) -> sa.Engine:
    """An engine on the scenario's SQL database, behind pico's back (no pool)."""
    url = world.backend.url
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def _sql(world: World, statement: str, **params: Any) -> None:
    engine = _engine(world)
    try:
        with engine.begin() as conn:
            changed = conn.execute(sa.text(statement), {"sid": world.backend.session, **params})
            assert changed.rowcount == 1, statement
    finally:
        engine.dispose()


def _memory(world: World) -> Any:
    return named_database(world.backend.url[len("memory://") :])


def _edit_journal(world: World, edit: Callable[[int, list[list[Any]]], bool]) -> None:
    """Rewrite exactly one batch line of the session's JSONL journal in place. ``edit``
    gets the position of the line's first event and the line's events (``[id, version,
    topic, body]``), changes them and says whether it did; the line stays valid JSON, so
    the damage is to an event, not a corrupt line."""
    url = world.backend.url
    main = Journal(Path(url[len("jsonl:///") :]), world.backend.session, fsync=False).main
    lines = main.read_bytes().split(b"\n")
    position, edited = 1, 0
    for i, raw in enumerate(lines[1:], start=1):
        if not raw:
            continue
        record = json.loads(raw)
        events: list[list[Any]] = record["events"]
        first, count = position, len(events)
        position += count
        if not edited and edit(first, events):
            text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
            lines[i] = text.encode()
            edited += 1
    assert edited == 1, "no batch line held the event to damage"
    main.write_bytes(b"\n".join(lines))


@when(parsers.parse('entry "{name}" is altered outside pico'))
def alter_entry(world: World, name: str) -> None:
    entry = world.id(name)
    world.head_before = world.h.head()
    if world.backend.name == "memory":
        store = _memory(world).read_stores[world.backend.session]
        with store.lock:
            store._entries[entry] = store._entries[entry]._replace(content='"altered"')
        return
    if world.backend.name == "jsonl":  # the journal is the only stored form of the entry

        def alter(_first: int, events: list[list[Any]]) -> bool:
            for e in events:
                body = json.loads(e[3])
                if e[2].endswith("Conversation.EntryAppended") and body["seq"] == entry:
                    body["content"] = '"altered"'
                    e[3] = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
                    return True
            return False

        _edit_journal(world, alter)
        return
    _sql(
        world,
        "UPDATE pico_entries SET content = '\"altered\"' WHERE session_id = :sid AND id = :id",
        id=entry,
    )


@when(parsers.parse('an event of "{conv}" is lost outside pico'))
def lose_event(world: World, conv: str) -> None:
    """The conversation's second event (not its last: a lost last event leaves no gap)."""
    aggregate = f"conversation/{world.id(conv)}"
    record = next(r for r in world.h.audit(limit=10_000) if r.aggregate == aggregate)
    later = [r for r in world.h.audit(after=record.position, limit=10_000)]
    second = next(r for r in later if r.aggregate == aggregate)
    if world.backend.name == "memory":
        db = _memory(world)
        with db.lock:
            del db.log[world.backend.session][second.position - 1]
        return
    if world.backend.name == "jsonl":

        def drop(first: int, events: list[list[Any]]) -> bool:
            if not first <= second.position < first + len(events):
                return False
            del events[second.position - first]
            return True

        _edit_journal(world, drop)
        return
    _sql(
        world,
        "DELETE FROM pico_events WHERE session_number = "
        "(SELECT id FROM pico_session_numbers WHERE session_id = :sid) AND id = :id",
        id=second.position,
    )


def _stored_events(world: World) -> int:
    count, after = 0, 0
    while page := world.h.audit(after=after, limit=1000):
        count, after = count + len(page), page[-1].position
    return count


@when("the session is checked")
def check_session(world: World, checks: dict[str, Any]) -> None:
    checks["events before"] = _stored_events(world)
    report = world.run(pico.check(world.backend.url, session=world.backend.session))
    checks["reports"].append(report)
    checks["events after"] = _stored_events(world)


@then("checking stored nothing")
def check_stored_nothing(world: World, checks: dict[str, Any]) -> None:
    assert checks["events after"] == checks["events before"]
    assert world.h.head() == world.head_before


@then("the check finds nothing wrong")
def finds_nothing(checks: dict[str, Any]) -> None:
    report = _report(checks)
    assert report.ok, [str(f) for f in report.findings]
    assert report.events > 0


@then(parsers.parse('the check reports that entry "{name}" differs from its history'))
def reports_entry(world: World, checks: dict[str, Any], name: str) -> None:
    findings = _report(checks).findings
    # A JSONL journal holds the entry only in its event: that event no longer matches its
    # commit's link either (the hash chain).
    kinds = ["chain", "read model"] if world.backend.name == "jsonl" else ["read model"]
    assert [f.kind for f in findings] == kinds, [str(f) for f in findings]
    findings = findings[-1:]
    entry = world.id(name)
    # SQL names the row, memory the index key: both name the entry's id.
    assert f"id={entry})" in findings[0].message or f"key {entry}:" in findings[0].message
    assert "altered" in findings[0].message


@then(parsers.parse('the check reports a gap in the history of "{conv}"'))
def reports_gap(world: World, checks: dict[str, Any], conv: str) -> None:
    findings = _report(checks).findings
    gaps = [f for f in findings if f.kind == "versions"]
    assert len(gaps) == 1, [str(f) for f in findings]
    assert gaps[0].message.startswith(f"conversation/{world.id(conv)}: version 3 ")
