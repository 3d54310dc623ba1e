"""Steps for the audit export: the auditor reads a session's history through
``pico.audit_records`` (a read of the log; nothing is written)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pytest_bdd import parsers, then, when

import pico
from features.steps.library import World
from pico.application.audit import AuditEntry, audit_records


@pytest.fixture
def export() -> dict[str, Any]:
    """What the auditor read (``entries``) or the refusal (``error``)."""
    return {}


def _read(world: World, export: dict[str, Any], **filters: Any) -> None:
    export.clear()
    try:
        export["entries"] = list(audit_records(world.h, **filters))
    except pico.PicoError as exc:
        export["error"] = exc


def _entries(export: dict[str, Any]) -> list[AuditEntry]:
    assert "entries" in export, f"the export was refused: {export.get('error')}"
    entries: list[AuditEntry] = export["entries"]
    return entries


def _message(world: World, export: dict[str, Any], name: str) -> AuditEntry | None:
    entry = world.id(name)
    return next(
        (
            e
            for e in _entries(export)
            if e.event == "Conversation.EntryAppended" and e.payload.get("seq") == entry
        ),
        None,
    )


@when("the auditor exports the session's history")
def audit_exports_everything(world: World, export: dict[str, Any]) -> None:
    _read(world, export)


@when(parsers.parse('the auditor exports only the events of conversation "{conv}"'))
def audit_exports_conversation(world: World, export: dict[str, Any], conv: str) -> None:
    _read(world, export, conversation=world.id(conv))


@when(parsers.parse('the auditor notes the position of the last stored event as "{name}"'))
def audit_notes_position(world: World, name: str) -> None:
    last = 0
    for e in audit_records(world.h):
        last = e.position
    world.positions[name] = last


@when(parsers.parse('the auditor exports only the events after position "{position}"'))
def audit_exports_after(world: World, export: dict[str, Any], position: str) -> None:
    _read(world, export, after=world.positions[position])


@when(parsers.parse('the auditor exports only the events of type "{kind}"'))
def audit_exports_type(world: World, export: dict[str, Any], kind: str) -> None:
    _read(world, export, events=[kind])


@then("the export has every stored event once, in storage order")
def audit_every_event(world: World, export: dict[str, Any]) -> None:
    positions = [e.position for e in _entries(export)]
    assert positions == sorted(set(positions))
    assert len(positions) == world.h.audit_count()


@then("every exported event says when it was stored, in UTC")
def audit_in_utc(export: dict[str, Any]) -> None:
    for e in _entries(export):
        assert e.at is not None and e.at.utcoffset() == timedelta(0), e


@then(
    parsers.parse(
        '"{first}" were written by the session\'s first owner and "{second}" by its second'
    )
)
def audit_written_by(world: World, export: dict[str, Any], first: str, second: str) -> None:
    claims = [e for e in _entries(export) if e.event == "Session.Claimed"]
    assert len(claims) == 2, [c.position for c in claims]
    for names, claim in ((first, claims[0]), (second, claims[1])):
        for name in (n.strip() for n in names.split(",")):
            message = _message(world, export, name)
            assert message is not None, name
            assert (message.owner, message.host, message.pid) == (
                claim.payload["owner"],
                claim.payload["host"],
                claim.payload["pid"],
            ), name


@then(
    parsers.parse(
        'the content of message "{name}" reads as the text "{text}", not as JSON inside JSON'
    )
)
def audit_reads_as_text(world: World, export: dict[str, Any], name: str, text: str) -> None:
    message = _message(world, export, name)
    assert message is not None and message.payload["content"] == text


@then(parsers.parse('every exported event names conversation "{conv}"'))
def audit_names_conversation(world: World, export: dict[str, Any], conv: str) -> None:
    entries = _entries(export)
    assert entries
    assert all(e.payload.get("conversation_id") == world.id(conv) for e in entries)


@then(parsers.parse('the export shows message "{shown}" and not message "{hidden}"'))
def audit_shows(world: World, export: dict[str, Any], shown: str, hidden: str) -> None:
    assert _message(world, export, shown) is not None
    assert _message(world, export, hidden) is None


@then(parsers.parse('the export is refused, naming "{what}"'))
def audit_refused(export: dict[str, Any], what: str) -> None:
    error = export.get("error")
    assert isinstance(error, pico.InvalidArgumentError) and what in str(error), error
