"""Steps for tamper evidence: the stored event of an entry is edited or removed the way
someone with database tools (or a text editor, for a JSONL journal) could, then the
session's history is verified through ``pico.verify`` (reading only)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from pytest_bdd import parsers, then, when

import pico
from features.steps.check import _edit_journal, _engine, _memory, _sql, _stored_events
from features.steps.library import World
from tests.bodies import reencoded


@pytest.fixture
def verifications() -> dict[str, Any]:
    return {}


def _position(world: World, name: str) -> int:
    """The storage position of the event that appended entry ``name``."""
    entry = world.id(name)
    after = 0
    while page := world.h.audit(after=after, limit=1000):
        for r in page:
            if r.event == "Conversation.EntryAppended" and r.payload.get("seq") == entry:
                return r.position
        after = page[-1].position
    raise AssertionError(f"no stored event appended entry {name!r}")


def _tamper(world: World, name: str, *, remove: bool) -> None:
    position = _position(world, name)
    world.positions[f"event of {name}"] = position
    world.head_before = world.h.head()
    entry = world.id(name)
    if world.backend.name == "memory":
        db = _memory(world)
        with db.lock:
            log = db.log[world.backend.session]
            if remove:
                del log[position - 1]
            else:
                oid, version, topic, state = log[position - 1]  # as the database keeps it
                body = state.replace(f'\\"{name}\\"'.encode(), b'\\"forged\\"')
                assert body != state
                log[position - 1] = (oid, version, topic, body)
        return
    if world.backend.name == "jsonl":

        def edit(first: int, events: list[list[Any]]) -> bool:
            if not first <= position < first + len(events):
                return False
            if remove:
                del events[position - first]
            else:
                body = json.loads(events[position - first][3])
                assert body["seq"] == entry
                body["content"] = json.dumps("forged")
                events[position - first][3] = json.dumps(body, separators=(",", ":"))
            return True

        _edit_journal(world, edit)
        return
    if remove:
        _sql(
            world,
            "DELETE FROM pico_events WHERE session_number = "
            "(SELECT id FROM pico_session_numbers WHERE session_id = :sid) AND id = :id",
            id=position,
        )
        return
    engine = _engine(world)
    try:
        with engine.connect() as conn:
            # The event row names its topic by number (pico_topics, schema revision 0008).
            topic, state = conn.execute(
                sa.text(
                    "SELECT t.topic, e.state FROM pico_events e "
                    "JOIN pico_topics t ON t.id = e.topic_id WHERE e.id = :id"
                ),
                {"id": position},
            ).one()
    finally:
        engine.dispose()

    def forge(body: bytes) -> bytes:
        assert f'"seq":{entry},'.encode() in body
        return body.replace(f'\\"{name}\\"'.encode(), b'\\"forged\\"')

    _sql(
        world,
        "UPDATE pico_events SET state = :body WHERE session_number = "
        "(SELECT id FROM pico_session_numbers WHERE session_id = :sid) AND id = :id",
        id=position,
        body=reencoded(state, topic, forge),
    )


@when(parsers.parse('the stored event of entry "{name}" is edited outside pico'))
def edit_event(world: World, name: str) -> None:
    _tamper(world, name, remove=False)


@when(parsers.parse('the stored event of entry "{name}" is removed outside pico'))
def remove_event(world: World, name: str) -> None:
    _tamper(world, name, remove=True)


@when("the session's history is verified")
def verify_history(world: World, verifications: dict[str, Any]) -> None:
    verifications["events before"] = _stored_events(world)
    verifications["report"] = world.run(
        pico.verify(world.backend.url, session=world.backend.session)
    )


@then("the verification covers every stored event")
def covers_everything(world: World, verifications: dict[str, Any]) -> None:
    report: pico.ChainReport = verifications["report"]
    assert report.ok, [str(b) for b in report.breaks]
    assert report.events == verifications["events before"] > 0
    assert report.unchained == 0 and report.head_link.startswith("sha256:")
    assert report.summary().startswith(f"verified {report.events} events through position ")


@then(
    parsers.parse(
        'the verification reports that history was changed where entry "{name}" was committed'
    )
)
def reports_change(world: World, verifications: dict[str, Any], name: str) -> None:
    report: pico.ChainReport = verifications["report"]
    assert not report.ok
    first = report.breaks[0]
    # The first break is the commit that held the tampered event, or (when the event was
    # the first of its commit and was removed) starts right after where it was.
    position = world.positions[f"event of {name}"]
    assert first.position <= position + 1 and position <= first.last, str(first)
    assert "history was changed" in report.summary()


@then("verifying stored nothing")
def stored_nothing(world: World, verifications: dict[str, Any]) -> None:
    assert _stored_events(world) == verifications["events before"]
    assert world.h.head() == world.head_before
