"""Steps of features/opening.feature: a second owner and a read-only auditor."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

import pico
import pico.application.line as line_module
from features.steps.library import World, _names, _show


@when(
    parsers.parse(
        'a second owner opens the session while the first owner appends "{name}" to "{conv}"'
    )
)
def second_owner_during_a_commit(
    world: World, name: str, conv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first owner commits after the opener read the session and before its claim
    (forced at the claim step, not left to timing)."""
    first = world.h
    real_claim = line_module._claim

    def claim_after_a_commit(storage: Any, session: Any, *gate: Any) -> Any:
        def build(tx: Any) -> int:
            entry: int = tx.append_entry(world.id(conv), "assistant", name)
            tx.append_context(world.id(conv), [entry])
            return entry

        world.names[name] = first._line.run_sync(build)
        return real_claim(storage, session, *gate)

    monkeypatch.setattr(line_module, "_claim", claim_after_a_commit)
    try:
        world.others.append(world.run(world.backend.open()))
    finally:
        monkeypatch.setattr(line_module, "_claim", real_claim)


@then("the second owner holds the session")
def second_owner_holds(world: World) -> None:
    second = world.others[-1]
    # Its claim is the newest commit boundary: it landed after the first owner's commit.
    assert second.head() > max(world.names.values())
    assert second.audit(after=second.head() - 1)[-1].event == "Session.Claimed"


@then(parsers.parse('the second owner reads the transcript of "{conv}" as "{names}"'))
@then(parsers.parse('the auditor reads the transcript of "{conv}" as "{names}"'))
def other_reads_transcript(world: World, conv: str, names: str) -> None:
    other = world.others[-1]
    page = world.run(pico.ConversationHandle(other, world.id(conv)).entries(limit=1000))
    assert _show(world, [e.id for e in page.items]) == ", ".join(_names(names))


@given(parsers.parse('"{conv}" has accepted the input "{name}" that no model has answered'))
def accepted_input(world: World, conv: str, name: str) -> None:
    world.run(world.h.close())
    provider = pico.FauxProvider(["never asked"])
    world.harness = world.run(world.backend.open(definitions=[world.work], provider=provider))
    world.names[name] = world.run(world.conv(conv).accept(name))
    assert any(world.run(world.h.inspect()).values())
    world.run(world.h.close())
    world.harness = None
    world.head_before = None


@when("an auditor opens the session read-only without definitions or a model")
def auditor_opens(world: World) -> None:
    auditor = world.run(world.backend.open(read_only=True))
    world.others.append(auditor)
    world.head_before = auditor.head()


@then(parsers.parse("the auditor sees {count:d} live task"))
@then(parsers.parse("the auditor sees {count:d} live tasks"))
def auditor_sees_live(world: World, count: int) -> None:
    live = world.run(world.others[-1].inspect())
    assert sum(len(tasks) for tasks in live.values()) == count


@then("the auditor's audit log ends at the session head")
def audit_ends_at_head(world: World) -> None:
    auditor = world.others[-1]
    records, after = [], 0
    while batch := auditor.audit(after=after, limit=500):
        records += batch
        after = batch[-1].position
    assert records and records[-1].event in ("Session.Committed", "Session.Claimed")
    assert records[-1].payload.get("last", auditor.head()) == auditor.head()


@then("the session head did not move")
def head_did_not_move(world: World) -> None:
    again = world.run(world.backend.open(read_only=True))
    try:
        assert again.head() == world.head_before
    finally:
        world.run(again.close())


@then(parsers.parse("driving through the auditor's handle is rejected as {error}"))
def auditor_drives(world: World, error: str) -> None:
    with pytest.raises(getattr(pico, error.strip())):
        world.run(world.others[-1].drive())
