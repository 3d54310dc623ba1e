"""Scoped state (§4), run unchanged against memory, SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import pico
from pico import Command
from tests.backends import Backend

PLAN = pico.conversation_value("plugin.plan", bool)
EXPANDED = pico.conversation_value("ui.expanded", bool, rewind=False)
MOVES = pico.conversation_list("game.moves", str)
NOTES = pico.conversation_list("ui.notes", str, rewind=False)
NAME = pico.session_value("app.session-name", str)
TAGS = pico.session_list("app.tags", str)


async def _values(page: pico.Page[pico.ListElement[str]]) -> list[str]:
    return [e.value for e in page.items]


async def test_values_round_trip_typed_and_null_is_not_absence(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    maybe = pico.conversation_value("plugin.maybe", int | None)
    assert await c.get_value(maybe) is None and await c.get_stored(maybe) is None
    await c.set_value(maybe, None)
    stored = await c.get_stored(maybe)
    assert stored is not None and stored.value is None  # JSON null is a stored value
    await c.delete_value(maybe)
    assert await c.get_stored(maybe) is None
    assert await c.get_value(PLAN, default=False) is False  # defaults at the read site
    await c.set_value(PLAN, True)
    assert await c.get_value(PLAN) is True
    # Check: the address type is enforced on write, strictly.
    head = h.head()
    with pytest.raises(pico.InvalidJsonError):
        await c.set_value(PLAN, 1)  # type: ignore[misc]
    with pytest.raises(pico.InvalidJsonError):
        await c.set_value(pico.conversation_value("x.f", float), float("nan"))
    assert h.head() == head
    await h.close()


async def test_returned_values_are_copies(backend: Backend) -> None:
    h = await backend.open()
    config = pico.session_value("app.config", dict[str, list[int]])
    payload = {"a": [1, 2]}
    await h.set_value(config, payload)
    payload["a"].append(3)
    got = await h.get_value(config)
    assert got == {"a": [1, 2]}
    assert got is not None
    got["a"].append(99)
    assert await h.get_value(config) == {"a": [1, 2]}
    await h.close()


async def test_rewindable_list_trace(backend: Backend) -> None:
    """§4.2: append A, append B, clear, append C; read through each position."""
    h = await backend.open()
    c = await h.root()
    await c.append_list(MOVES, "A")
    through_b = await c.append_list(MOVES, "B")
    await c.clear_list(MOVES)
    cleared = h.main_head()
    await c.append_list(MOVES, "C")
    assert await _values(await c.read_list(MOVES, as_of=through_b)) == ["A", "B"]
    assert await _values(await c.read_list(MOVES, as_of=cleared)) == []
    assert await _values(await c.read_list(MOVES)) == ["C"]
    await h.close()


async def test_list_cursors_are_element_ids_and_stable_with_fixed_as_of(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    ids = [await c.append_list(MOVES, f"m{i}") for i in range(7)]
    at = h.main_head()
    first = await c.read_list(MOVES, limit=3, as_of=at)
    assert [e.id for e in first.items] == ids[:3] and first.next == ids[2]
    await c.append_list(MOVES, "later")  # later writes do not shift a fixed-as_of page
    second = await c.read_list(MOVES, after=first.next, limit=3, as_of=at)
    assert [e.id for e in second.items] == ids[3:6]
    third = await c.read_list(MOVES, after=second.next, limit=3, as_of=at)
    assert [e.id for e in third.items] == ids[6:] and third.next is None
    desc = await c.read_list(MOVES, order="desc", limit=2)
    assert await _values(desc) == ["later", "m6"]
    window = await c.read_list(MOVES, after=ids[1], before=ids[4])
    assert [e.id for e in window.items] == ids[2:4]
    await h.close()


async def test_sticky_state_has_no_history(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.set_value(EXPANDED, True)
    await c.append_list(NOTES, "n1")
    await c.clear_list(NOTES)
    await c.append_list(NOTES, "n2")
    assert await _values(await c.read_list(NOTES)) == ["n2"]  # only current contents
    with pytest.raises(pico.HistoricalReadError):
        await c.get_value(EXPANDED, as_of=h.main_head())
    with pytest.raises(pico.HistoricalReadError):
        await c.read_list(NOTES, as_of=h.main_head())
    await h.set_value(NAME, "demo")
    with pytest.raises(pico.HistoricalReadError):
        await h.command(lambda tx: tx.get_value(NAME, as_of=1))
    await h.close()


async def test_rewind_policy_and_scope_are_persisted_and_enforced(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.set_value(PLAN, True)
    await h.close()
    h = await backend.open()
    c = await h.root()
    head = h.head()
    sticky_plan = pico.conversation_value("plugin.plan", bool, rewind=False)
    with pytest.raises(pico.AddressPolicyError):
        await c.set_value(sticky_plan, False)
    # Check: a conversation address cannot be used as a session address, nor vice versa.
    with pytest.raises(pico.AddressPolicyError):
        await h.command(lambda tx: tx.set_value(PLAN, True))
    with pytest.raises(pico.AddressPolicyError):
        await h.command(lambda tx: tx.set_value(NAME, "x", conversation_id=c.id))
    with pytest.raises(pico.ReservedNamespaceError):
        await h.set_value(pico.session_value("pico.request-input", int, key="k"), 1)
    assert h.head() == head
    assert await c.get_value(PLAN) is True
    await h.close()


def _policy_reads(h: pico.Harness, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The addresses whose rewind policy the owner reads from its store from now on."""
    lookups: list[tuple[str, ...]] = []
    state = h._line.storage.state
    real = state.address_policy

    def counted(*address: str) -> bool | None:
        lookups.append(address)
        return real(*address)

    monkeypatch.setattr(state, "address_policy", counted)
    return lookups


async def test_the_owner_remembers_committed_policies_and_forgets_a_failed_command(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await backend.open()
    c = await h.root()
    sticky = pico.conversation_value("plugin.mode", bool, rewind=False)
    rewound = pico.conversation_value("plugin.mode", bool)

    def establish_then_fail(tx: Command) -> None:
        tx.set_value(sticky, True, conversation_id=c.id)
        raise RuntimeError("the builder fails after its write")

    with pytest.raises(RuntimeError):
        await h.command(establish_then_fail)
    # Check: the failed command established nothing, in storage or in the owner's memory.
    await c.set_value(rewound, True)
    lookups = _policy_reads(h, monkeypatch)
    for value in (False, True, False):
        await c.set_value(rewound, value)
    assert lookups == []  # a committed address's policy is known: no row is read
    with pytest.raises(pico.AddressPolicyError):
        await c.set_value(sticky, False)
    assert await c.get_value(rewound) is False
    await h.close()
    # Check: a new owner reads it from storage and enforces the same.
    h = await backend.open()
    c = await h.root()
    with pytest.raises(pico.AddressPolicyError):
        await c.set_value(sticky, True)
    await h.close()


async def test_an_address_keyed_by_what_the_command_made_reads_no_policy(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Command.made_here``: a reserved address keyed by a position this command allocated
    cannot have been written before, so its write reads no policy; any other position or a
    namespace outside ``pico.`` reads it as usual, and the policy check still holds."""
    h = await backend.open()
    c = await h.root()
    lookups = _policy_reads(h, monkeypatch)

    def made(namespace: str, *, earlier: int | None = None) -> Callable[[Command], int]:
        def build(tx: Command) -> int:
            entry = tx.append_entry(c.id, "user", "made here")
            position = entry if earlier is None else earlier
            address = pico.session_value(namespace, str, key=f"{position:016d}")
            with tx.core():
                tx.made_here(address, position)
                tx.set_value(address, "v")
            return entry

        return build

    first = await h.command(made("pico.test-made"))
    assert lookups == []  # the entry this command made keys the address: nothing to read
    await h.command(made("pico.test-made", earlier=first - 1))
    assert [a[2:] for a in lookups] == [("pico.test-made", f"{first - 1:016d}")]
    lookups.clear()
    await h.command(made("app.test-made"))  # not pico's: a user may have written that key
    assert [a[2] for a in lookups] == ["app.test-made"]
    lookups.clear()
    # An address keyed by an earlier position, established with another policy, is still
    # refused: made_here does not take the position's word for it.
    key = f"{first:016d}"
    sticky = pico.conversation_value("pico.test-kept", str, rewind=False, key=key)
    rewound = pico.conversation_value("pico.test-kept", str, key=key)

    def establish(tx: Command) -> None:
        with tx.core():
            tx.set_value(sticky, "x", conversation_id=c.id)

    await h.command(establish)
    head = h.head()

    def conflicting(tx: Command) -> None:
        tx.append_entry(c.id, "user", "later")
        with tx.core():
            tx.made_here(rewound, first)  # first was made by an earlier command
            tx.set_value(rewound, "y", conversation_id=c.id)

    with pytest.raises(pico.AddressPolicyError):
        await h.command(conflicting)
    assert h.head() == head
    await h.close()


async def test_session_state_is_shared_and_scannable(backend: Backend) -> None:
    h = await backend.open()
    await h.set_value(NAME, "parser work")
    for i in range(5):
        await h.set_value(pico.session_value("app.counter", int, key=f"k{i}"), i)
    await h.append_list(TAGS, "a")
    await h.append_list(TAGS, "b")
    await h.clear_list(TAGS)
    await h.append_list(TAGS, "c")
    assert [e.value for e in (await h.read_list(TAGS)).items] == ["c"]
    page = await h.scan_values(namespace="app.counter", limit=2)
    assert [(i.key, i.value) for i in page.items] == [("k0", 0), ("k1", 1)]
    assert page.next == ("app.counter", "k1")
    rest = await h.scan_values(namespace="app.counter", after=page.next, limit=10)
    assert [i.key for i in rest.items] == ["k2", "k3", "k4"] and rest.next is None
    everything = await h.scan_values(limit=100)
    assert [i.namespace for i in everything.items] == ["app.counter"] * 5 + ["app.session-name"]
    # Check: a fork reads the same session state; it is not copied.
    c = await h.root()
    m = await c.append("user", "m")
    f = await c.fork(at_entry=m)
    await h.set_value(NAME, "renamed")
    assert await h.get_value(NAME) == "renamed"
    assert f.id != c.id
    await h.close()


async def test_plan_mode_trace_through_a_fork(backend: Backend) -> None:
    """§4.4: A plan=false at 40, true at 80; B forked through 60 reads false; B's delete is
    absence; B's set wins."""
    h = await backend.open()
    a = await h.root()
    await a.set_value(PLAN, False)
    through_60 = await a.append("user", "between")
    await a.set_value(PLAN, True)
    b = await a.fork(at_entry=through_60)
    assert await a.get_value(PLAN) is True
    assert await b.get_value(PLAN) is False  # follows A capped at the boundary
    await b.delete_value(PLAN)
    assert await b.get_stored(PLAN) is None  # local deletion: no fallback to A
    assert await a.get_value(PLAN) is True
    await b.set_value(PLAN, True)
    assert await b.get_value(PLAN) is True
    await h.close()


async def test_fork_before_and_after_a_delete(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.set_value(PLAN, True)
    before = await a.append("user", "before the delete")
    await a.delete_value(PLAN)
    after = await a.append("user", "after the delete")
    fb, fa = await a.fork(at_entry=before), await a.fork(at_entry=after)
    assert await fb.get_value(PLAN) is True
    assert await fa.get_stored(PLAN) is None
    await h.close()


async def test_fork_before_and_after_a_list_clear(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.append_list(MOVES, "A")
    await a.append_list(MOVES, "B")
    before = await a.append("user", "before the clear")
    await a.clear_list(MOVES)
    await a.append_list(MOVES, "C")
    after = await a.append("user", "after the clear")
    await a.append_list(MOVES, "D")
    fb, fa = await a.fork(at_entry=before), await a.fork(at_entry=after)
    assert await _values(await fb.read_list(MOVES)) == ["A", "B"]
    assert await _values(await fa.read_list(MOVES)) == ["C"]
    await fb.append_list(MOVES, "B2")  # local appends combine with the inherited range
    assert await _values(await fb.read_list(MOVES)) == ["A", "B", "B2"]
    assert await _values(await fb.read_list(MOVES, order="desc", limit=2)) == ["B2", "B"]
    await fb.clear_list(MOVES)  # a local clear ends the inherited range
    await fb.append_list(MOVES, "fresh")
    assert await _values(await fb.read_list(MOVES)) == ["fresh"]
    assert await _values(await a.read_list(MOVES)) == ["C", "D"]
    await h.close()


async def test_nested_cutoffs_never_leak_later_ancestor_versions(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.set_value(PLAN, False)
    await a.append_list(MOVES, "a1")
    p1 = await a.append("user", "p1")
    await a.set_value(PLAN, True)  # after B's boundary
    await a.append_list(MOVES, "a2")
    b = await a.fork(at_entry=p1)
    await b.append_list(MOVES, "b1")
    p2 = await b.append("user", "p2")
    c = await b.fork(at_entry=p2)
    await b.append_list(MOVES, "b2")  # after C's boundary
    assert await c.get_value(PLAN) is False
    assert await _values(await c.read_list(MOVES)) == ["a1", "b1"]
    # Check: a deep chain still answers with the tighter cutoff at every ancestor.
    chain = c
    for i in range(8):
        marker = await chain.append("user", f"level {i}")
        chain = await chain.fork(at_entry=marker)
    assert await chain.get_value(PLAN) is False
    assert await _values(await chain.read_list(MOVES)) == ["a1", "b1"]
    await h.close()


async def test_sticky_values_are_copied_only_when_selected(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    model = pico.conversation_value("agent.model", str, rewind=False)
    await a.set_value(model, "small")
    await a.set_value(EXPANDED, True)
    m = await a.append("user", "m")
    await a.set_value(model, "large")  # sticky copies come from the CURRENT source
    b = await a.fork(at_entry=m, sticky=[model])
    assert await b.get_value(model) == "large"
    assert await b.get_stored(EXPANDED) is None  # unselected sticky: absent
    # Check: a copy, not a live link.
    await a.set_value(model, "medium")
    assert await b.get_value(model) == "large"
    # Check: historical reads leave sticky state unchanged.
    assert await a.get_value(PLAN, as_of=m) is None
    assert await a.get_value(model) == "medium"
    with pytest.raises(pico.AddressPolicyError):
        await a.fork(at_entry=m, sticky=[PLAN])  # rewindable: inherited, not copied
    await h.close()


async def test_an_independently_initialized_child_ends_the_fallback(backend: Backend) -> None:
    h = await backend.open()
    a = await h.root()
    await a.set_value(PLAN, True)
    await a.append_list(MOVES, "A")
    m = await a.append("user", "m")
    child = await a.fork(at_entry=m, inherit_state=False)
    assert (await child.snapshot()).context == (m,)  # context still inherited
    assert await child.get_stored(PLAN) is None
    assert await _values(await child.read_list(MOVES)) == []
    await child.set_value(PLAN, False)
    k = await child.append("user", "k")
    grandchild = await child.fork(at_entry=k)  # a later fork of it inherits normally
    assert await grandchild.get_value(PLAN) is False
    await h.close()


async def test_working_scopes(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    work = pico.working_scope("task-7")
    other = pico.working_scope("task-8")
    frames = pico.working_list("pi.pending.frames", str, scope=work)
    checkpoint = pico.working_value("pi.pending.checkpoint", int, scope=work)
    main_head = h.main_head()

    def progress(tx: pico.WorkingCommand) -> int:
        tx.append_list(frames, "frame 1")
        tx.set_value(checkpoint, 1)
        return tx.append_list(frames, "frame 2")

    last = await h.command(work, progress)
    # Check: working commits use the allocator but are not main history or fork targets.
    assert h.head() == last + 0 and h.main_head() == main_head
    with pytest.raises(pico.InvalidPositionError):
        await c.fork(as_of=last)
    assert [e.value for e in (await h.read_list(frames)).items] == ["frame 1", "frame 2"]
    # Check: mixing main and working writes, or two scopes, rejects with nothing written.
    head = h.head()

    def mixed(tx: Command) -> None:
        tx.append_entry(c.id, "user", "main")
        tx.append_list(frames, "working")

    with pytest.raises(pico.WorkingScopeError):
        await h.command(mixed)

    def two_scopes(tx: pico.WorkingCommand) -> None:
        tx.append_list(frames, "ok")
        tx.set_value(pico.working_value("x", int, scope=other), 1)

    with pytest.raises(pico.WorkingScopeError):
        await h.command(work, two_scopes)

    def main_in_working(tx: pico.WorkingCommand) -> None:
        tx.tx.append_entry(c.id, "user", "main")

    with pytest.raises(pico.WorkingScopeError):
        await h.command(work, main_in_working)
    assert h.head() == head
    # Check: working data survives restart until retired.
    await h.close()
    h = await backend.open()
    assert await h.get_value(checkpoint) == 1
    c = await h.root()

    def settle(tx: Command) -> int:
        entry = tx.append_entry(c.id, "assistant", "the assembled result")
        tx.retire_working_scope(work)
        return entry

    await h.command(settle)
    assert await h.get_stored(checkpoint) is None
    assert (await h.read_list(frames)).items == ()
    # Check: a deliberately reused name starts a fresh lifetime.
    await h.command(work, lambda tx: tx.append_list(frames, "new lifetime"))
    assert [e.value for e in (await h.read_list(frames)).items] == ["new lifetime"]
    with pytest.raises(pico.HistoricalReadError):
        await h.command(lambda tx: tx.read_list(frames, as_of=1))
    # Check: the audit log holds the working boundary, not the working payloads.
    events = [r.event for r in h.audit(limit=10000)]
    assert "Session.WorkingScopeRetired" in events
    assert not any("frame" in str(r.payload) for r in h.audit(limit=10000))
    await h.close()


async def test_request_keys_map_inside_one_command(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()

    def accept(text: str, key: str) -> Callable[[Command], tuple[int, bool]]:
        def build(tx: Command) -> tuple[int, bool]:
            return tx.claim_request_key(
                key,
                conversation_id=c.id,
                fingerprint=text,
                create=lambda: tx.append_entry(c.id, "user", text),
            )

        return build

    first, created = await h.command(accept("hello", "client-42"))
    assert created
    head = h.head()
    # Check: the retry (reply lost) returns the original id and writes nothing.
    again, created_again = await h.command(accept("hello", "client-42"))
    assert (again, created_again) == (first, False) and h.head() == head
    with pytest.raises(pico.RequestKeyConflictError):
        await h.command(accept("different", "client-42"))
    other = await h.command(lambda tx: tx.create_conversation())

    def elsewhere(tx: Command) -> tuple[int, bool]:
        return tx.claim_request_key(
            "client-42", conversation_id=other, fingerprint="hello", create=lambda: 0
        )

    with pytest.raises(pico.RequestKeyConflictError):
        await h.command(elsewhere)

    # Check: two claims of one key inside one command resolve to one id.
    def twice(tx: Command) -> tuple[tuple[int, bool], tuple[int, bool]]:
        make = lambda: tx.append_entry(c.id, "user", "x")  # noqa: E731
        one = tx.claim_request_key("k2", conversation_id=c.id, fingerprint="x", create=make)
        two = tx.claim_request_key("k2", conversation_id=c.id, fingerprint="x", create=make)
        return one, two

    one, two = await h.command(twice)
    assert one[0] == two[0] and one[1] and not two[1]
    # Check: normal callers cannot overwrite the mapping.
    with pytest.raises(pico.ReservedNamespaceError):
        await h.set_value(pico.session_value("pico.request-input", int, key="client-42"), 5)
    await h.close()


async def test_reading_through_a_mistyped_address_is_a_clear_error(backend: Backend) -> None:
    h = await backend.open()
    c = await h.root()
    await c.set_value(pico.conversation_value("app.count", str), "not a number")
    with pytest.raises(pico.StoredTypeError, match=r"app\.count"):
        await c.get_value(pico.conversation_value("app.count", int))
    assert await c.get_value(pico.conversation_value("app.count", str)) == "not a number"
    await h.close()
