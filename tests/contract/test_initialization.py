"""Initialization of a fork's sticky state (§4.3, §9.1), on memory, SQLite and PostgreSQL.

``fork(..., sticky=Initialization(inherit=[...], set=[...]))`` copies the selected sticky
values' current source contents, then applies the overrides, in the fork's one command.
"""

from __future__ import annotations

from typing import Any

import pytest

import pico
from tests.backends import Backend

MODEL = pico.conversation_value("agent.model", str, rewind=False)
THINKING = pico.conversation_value("agent.thinking", str, rewind=False)
TOOLS = pico.conversation_value("agent.tools", list[str], rewind=False)
EXPANDED = pico.conversation_value("ui.expanded", bool, rewind=False)
PLAN = pico.conversation_value("plugin.plan", bool)
MOVES = pico.conversation_list("game.moves", str)
NOTES = pico.conversation_list("ui.notes", str, rewind=False)


async def _source(backend: Backend) -> tuple[pico.Harness, pico.ConversationHandle, int]:
    h = await backend.open()
    a = await h.root()
    await a.set_value(MODEL, "small")
    await a.set_value(THINKING, "low")
    await a.set_value(EXPANDED, True)
    m = await a.append("user", "m")
    return h, a, m


async def test_a_fork_copies_selected_current_values_then_applies_overrides(
    backend: Backend,
) -> None:
    h, a, m = await _source(backend)
    await a.set_value(MODEL, "large")  # selected copies come from the CURRENT source
    init = pico.Initialization(
        inherit=[MODEL, THINKING], set=[(THINKING, "high"), (TOOLS, ["read", "grep"])]
    )
    b = await a.fork(at_entry=m, sticky=init)
    assert await b.get_value(MODEL) == "large"
    assert await b.get_value(THINKING) == "high"  # the override wins over the copy
    assert await b.get_value(TOOLS) == ["read", "grep"]  # an override needs no selection
    assert await b.get_stored(EXPANDED) is None  # unselected: absent
    # Check: the source is untouched, and the fork holds copies, not a live link.
    assert await a.get_value(THINKING) == "low" and await a.get_stored(TOOLS) is None
    await a.set_value(MODEL, "medium")
    assert await b.get_value(MODEL) == "large"
    await h.close()


async def test_overrides_alone_initialize_a_fork(backend: Backend) -> None:
    h, a, m = await _source(backend)
    b = await a.fork(at_entry=m, sticky=pico.Initialization(set=[(MODEL, "tiny")]))
    assert await b.get_value(MODEL) == "tiny"
    assert await b.get_stored(THINKING) is None and await b.get_stored(EXPANDED) is None
    assert await a.get_value(MODEL) == "small"
    await h.close()


async def test_an_unselected_value_is_absent_with_no_fallback_to_the_source(
    backend: Backend,
) -> None:
    h, a, m = await _source(backend)
    b = await a.fork(at_entry=m, sticky=pico.Initialization(inherit=[MODEL]))
    assert await b.get_stored(THINKING) is None
    await a.set_value(THINKING, "max")  # a later source write does not reach the fork
    assert await b.get_stored(THINKING) is None
    # Check: a fork of the fork selects from ITS current values, not its source's.
    n = await b.append("user", "n")
    c = await b.fork(at_entry=n, sticky=pico.Initialization(inherit=[MODEL, THINKING]))
    assert await c.get_value(MODEL) == "small" and await c.get_stored(THINKING) is None
    await h.close()


async def test_a_selected_value_absent_in_the_source_stays_absent(backend: Backend) -> None:
    h, a, m = await _source(backend)
    await a.delete_value(THINKING)
    maybe = pico.conversation_value("agent.maybe", int | None, rewind=False)
    await a.set_value(maybe, None)  # JSON null is a value: it is copied
    b = await a.fork(at_entry=m, sticky=pico.Initialization(inherit=[THINKING, TOOLS, maybe]))
    assert await b.get_stored(THINKING) is None  # deleted in the source
    assert await b.get_stored(TOOLS) is None  # never set in the source
    stored = await b.get_stored(maybe)
    assert stored is not None and stored.value is None
    await h.close()


async def test_a_plain_list_of_addresses_only_selects(backend: Backend) -> None:
    h, a, m = await _source(backend)
    b = await a.fork(at_entry=m, sticky=[MODEL])
    c = await a.fork(at_entry=m, sticky=pico.Initialization(inherit=[MODEL]))
    for fork in (b, c):
        assert await fork.get_value(MODEL) == "small"
        assert await fork.get_stored(THINKING) is None
    await h.close()


async def test_the_fork_and_its_initialization_are_one_commit(backend: Backend) -> None:
    h, a, m = await _source(backend)
    before_head, before_events = h.head(), h.audit_count()
    init = pico.Initialization(inherit=[MODEL, THINKING], set=[(TOOLS, ["read"])])
    b = await a.fork(at_entry=m, sticky=init)
    records = h.audit(limit=10_000)[before_events:]
    commits = [r for r in records if r.event.endswith("Committed")]
    # Check: one boundary covers the creation and every value it starts with.
    assert len(commits) == 1
    assert commits[0].payload["first"] == b.id == before_head + 1
    assert commits[0].payload["last"] == h.head() == b.id + 3
    writes = [r.payload["namespace"] for r in records if r.event.endswith("ValueSet")]
    assert writes == ["agent.model", "agent.thinking", "agent.tools"]
    assert {r.aggregate for r in records if r.event.endswith("ValueSet")} == {
        f"conversation/{b.id}"
    }
    await h.close()


async def test_an_override_that_is_not_json_is_refused_before_anything_is_written(
    backend: Backend,
) -> None:
    h, a, m = await _source(backend)
    head = h.head()
    nan = float("nan")
    payload: dict[str, Any] = {"x": (1, 2)}
    anything = pico.conversation_value("agent.anything", rewind=False)
    for value, address in (
        (nan, pico.conversation_value("agent.t", float, rewind=False)),
        (payload, anything),
        (1, MODEL),
        ({1: "a"}, anything),
    ):
        with pytest.raises(pico.InvalidJsonError):
            pico.Initialization(inherit=[MODEL], set=[(address, value)])
    assert h.head() == head
    # Check: an override whose address policy conflicts with the stored one refuses the
    # whole fork (nothing written: no conversation, no number consumed).
    await a.set_value(pico.conversation_value("agent.mode", str), "rewindable")
    head = h.head()
    clash = pico.conversation_value("agent.mode", str, rewind=False)
    with pytest.raises(pico.AddressPolicyError):
        await a.fork(at_entry=m, sticky=pico.Initialization(inherit=[MODEL], set=[(clash, "x")]))
    assert h.head() == head
    # Check: a selected value stored with another type is refused, not copied.
    with pytest.raises(pico.StoredTypeError):
        await a.fork(
            at_entry=m,
            sticky=pico.Initialization(
                inherit=[pico.conversation_value("agent.model", int, rewind=False)]
            ),
        )
    assert h.head() == head
    # Check: the handle is still usable; the next fork takes the next number.
    b = await a.fork(at_entry=m, sticky=pico.Initialization(set=[(MODEL, "ok")]))
    assert b.id == head + 1 and await b.get_value(MODEL) == "ok"
    await h.close()


async def test_override_values_are_copied_when_the_initialization_is_built(
    backend: Backend,
) -> None:
    h, a, m = await _source(backend)
    tools = ["read"]
    init = pico.Initialization(set=[(TOOLS, tools)])
    tools.append("rm")  # a later edit of the caller's list does not change what is stored
    b = await a.fork(at_entry=m, sticky=init)
    assert await b.get_value(TOOLS) == ["read"]
    assert init.set == ((TOOLS, ["read"]),)
    await h.close()


async def test_lists_are_not_copied_into_a_fork_unless_rewindable_history(
    backend: Backend,
) -> None:
    h, a, _ = await _source(backend)
    await a.append_list(NOTES, "remember")
    await a.append_list(MOVES, "e4")
    m = await a.append("user", "m2")
    head = h.head()
    for selection in ({"inherit": [NOTES]}, {"set": [(NOTES, "x")]}, {"inherit": [MOVES]}):
        with pytest.raises(pico.AddressPolicyError):
            pico.Initialization(**selection)
    assert h.head() == head
    b = await a.fork(at_entry=m, sticky=pico.Initialization(inherit=[MODEL]))
    assert (await b.read_list(NOTES)).items == ()  # sticky list: not copied
    assert [e.value for e in (await b.read_list(MOVES)).items] == ["e4"]  # history: inherited
    await h.close()


async def test_rewindable_values_follow_the_boundary_and_cannot_be_initialized(
    backend: Backend,
) -> None:
    h, a, _ = await _source(backend)
    await a.set_value(PLAN, True)
    p = await a.append("user", "p")
    await a.set_value(PLAN, False)
    head = h.head()
    for init in (pico.Initialization(inherit=[PLAN]), pico.Initialization(set=[(PLAN, False)])):
        with pytest.raises(pico.AddressPolicyError):
            await a.fork(at_entry=p, sticky=init)
    assert h.head() == head
    b = await a.fork(at_entry=p, sticky=pico.Initialization(set=[(MODEL, "x")]))
    assert await b.get_value(PLAN) is True  # inherited through the boundary, as before
    await h.close()


def test_an_initialization_of_the_wrong_shape_is_refused() -> None:
    bad: list[dict[str, Any]] = [
        {"inherit": "agent.model"},  # a string is not a list of addresses
        {"inherit": MODEL},
        {"inherit": [MODEL, "agent.thinking"]},
        {"set": {MODEL: "x"}},  # a mapping: pairs are (address, value)
        {"set": [MODEL]},
        {"set": [(MODEL,)]},
        {"set": [(MODEL, "a", "b")]},
        {"set": [("agent.model", "x")]},
        {"set": [(MODEL, "a"), (MODEL, "b")]},  # one address, two values
    ]
    for arguments in bad:
        with pytest.raises(pico.InvalidArgumentError):
            pico.Initialization(**arguments)
    for address in (
        pico.session_value("app.name"),
        pico.working_value("w.v", scope=pico.working_scope("w")),
    ):
        with pytest.raises(pico.AddressPolicyError):
            pico.Initialization(inherit=[address])  # type: ignore[list-item]  # refused at runtime too
    with pytest.raises(TypeError):
        pico.Initialization([MODEL])  # type: ignore[call-arg]  # keywords only
