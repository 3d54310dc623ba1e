"""Bad input changes nothing (issue 10), property-based over the public API, every backend.

For each class of bad input — values that are not strict JSON, malformed ids and
positions, out-of-range limits and modes — hypothesis generates examples; each must raise
its specific ``PicoError``, leave the head and a digest of all readable state unchanged,
and the SAME handle must then commit normally. One harness per test, not per example.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pico
from tests.backends import Backend
from tests.digest import state_digest
from tests.taskdefs import definitions

MAX_ID = 2**63 - 1
SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

# ------------------------------------------------------------------ strategies

_well_formed_text = st.text(st.characters(codec="utf-8"), max_size=6)
_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _well_formed_text
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_well_formed_text, inner, max_size=3)
    ),
    max_leaves=6,
)
_surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_lone_surrogate_text = st.builds(
    lambda a, s, b: a + s + b, _well_formed_text, _surrogate, _well_formed_text
)

#: One bad value of each class the gate refuses.
_bad_leaf = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.lists(_json_leaf, max_size=2).map(tuple),
    st.sets(st.integers(), max_size=2),
    st.frozensets(st.integers(), max_size=2),
    st.binary(max_size=3),
    st.decimals(allow_nan=False, allow_infinity=False, places=2),
    st.integers(0, 5).map(range),
    st.dictionaries(st.integers() | st.none() | st.booleans(), _json_leaf, min_size=1, max_size=2),
    _lone_surrogate_text,
    st.builds(lambda k, v: {k: v}, _lone_surrogate_text, _json_leaf),
)


def _nest(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@st.composite
def _bad_json(draw: st.DrawFn) -> Any:
    """A bad leaf at a random depth inside good JSON, or good JSON nested too deep."""
    if draw(st.integers(0, 9)) == 0:
        depth = draw(st.integers(201, 260))
        return _nest(depth, draw(_json_leaf)) if draw(st.booleans()) else {"a": _nest(depth, 1)}
    value = draw(_bad_leaf)
    for _ in range(draw(st.integers(0, 6))):
        sibling = draw(_json)
        if draw(st.booleans()):
            value = [sibling, value] if draw(st.booleans()) else [value, sibling]
        else:
            value = {draw(_well_formed_text): value, "\x00other": sibling}
    return value


#: Everything that is not an id: bool, float, str, bytes, list, 0, negatives, >= 2**63.
_not_an_id = st.one_of(
    st.booleans(),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.lists(st.integers(1, 9), max_size=2),
    st.integers(max_value=0),
    st.integers(min_value=MAX_ID + 1, max_value=2**80),
    st.decimals(allow_nan=False, allow_infinity=False),
)
_not_a_position = st.one_of(
    st.booleans(),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.integers(max_value=-1),
    st.integers(min_value=MAX_ID + 1, max_value=2**80),
)
_not_a_limit = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=1001, max_value=2**70),
    st.booleans(),
    st.floats(),
    st.text(max_size=3),
)
_not_an_order = st.text(max_size=5).filter(lambda s: s not in ("asc", "desc")) | st.integers()


# ------------------------------------------------------------------ the world


SCOPE = pico.working_scope("bad-input")
S_VALUE = pico.session_value("bad.session")
S_JSON = pico.session_value("bad.json", pico.JsonValue)
S_LIST = pico.session_list("bad.session-list")
C_VALUE = pico.conversation_value("bad.rewind")
C_STICKY = pico.conversation_value("bad.sticky", rewind=False)
C_LIST = pico.conversation_list("bad.rewind-list")
C_STICKY_LIST = pico.conversation_list("bad.sticky-list", rewind=False)
W_VALUE = pico.working_value("bad.working", scope=SCOPE)
W_LIST = pico.working_list("bad.working-list", scope=SCOPE)
LISTS = (S_LIST, C_LIST, C_STICKY_LIST, W_LIST)


class World:
    """One harness for a whole property test, with a root, one fork and one task."""

    def __init__(self, backend: Backend, runner: asyncio.Runner) -> None:
        self.runner = runner
        self.h: pico.Harness = runner.run(
            backend.open(definitions=definitions(), provider=pico.FauxProvider([]))
        )
        self.c: pico.ConversationHandle = runner.run(self.h.root())
        first = self.run(self.c.append("user", "hello"))
        self.run(self.c.append("assistant", "hi"))
        self.fork = self.run(self.c.fork(at_entry=first))
        self.task = self.run(self.h.command(lambda tx: tx.create_task(self.c.id, "note")))
        self.run(self.c.set_value(C_VALUE, {"plan": [1, 2]}))
        self.run(self.h.append_list(S_LIST, "one"))
        self.run(self.h.command(SCOPE, lambda w: w.append_list(W_LIST, {"frame": 1})))

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.runner.run(coro)  # type: ignore[arg-type]

    async def digest(self) -> str:
        return await state_digest(self.h, lists=LISTS, working=[SCOPE])

    def refuses(
        self, error: type[pico.PicoError], attempt: Callable[[], Awaitable[Any]]
    ) -> pico.PicoError:
        """The attempt raises exactly ``error``; head and readable state are unchanged; the
        same handle then commits normally."""
        head, before = self.h.head(), self.run(self.digest())
        with pytest.raises(pico.PicoError) as caught:
            self.run(attempt())
        assert isinstance(caught.value, error), repr(caught.value)
        assert self.h.head() == head
        assert self.run(self.digest()) == before
        assert self.h.faulted is None
        entry = self.run(self.c.append("user", "still works"))
        assert entry == head + 1 and self.h.head() > head
        return caught.value


@pytest.fixture
def world(backend: Backend) -> Any:
    with asyncio.Runner() as runner:
        w = World(backend, runner)
        yield w
        runner.run(w.h.close())


# ------------------------------------------------------------------ strict JSON


def _context_end(w: World) -> int:
    return w.run(w.c.snapshot()).context[-1]  # type: ignore[no-any-return]


_WRITES: dict[str, Callable[[World, Any], Awaitable[Any]]] = {
    "entry content": lambda w, v: w.c.append("user", v),
    "entry metadata": lambda w, v: w.c.append("user", "x", metadata={"m": v}),
    "entry metadata itself": lambda w, v: w.c.append("user", "x", metadata=v),
    "summary": lambda w, v: w.c.compact(v, through=_context_end(w)),
    "compact metadata": lambda w, v: w.c.compact("s", through=_context_end(w), metadata={"m": v}),
    "handoff": lambda w, v: w.c.handoff(v),
    "new task state": lambda w, v: w.h.command(lambda tx: tx.create_task(w.c.id, "note", state=v)),
    "patched task state": lambda w, v: w.h.command(lambda tx: tx.patch_task(w.task, state=v)),
    "session value": lambda w, v: w.h.set_value(S_VALUE, v),
    "JsonValue session value": lambda w, v: w.h.set_value(S_JSON, v),
    "session list element": lambda w, v: w.h.append_list(S_LIST, v),
    "rewindable conversation value": lambda w, v: w.c.set_value(C_VALUE, v),
    "sticky conversation value": lambda w, v: w.c.set_value(C_STICKY, v),
    "rewindable conversation list element": lambda w, v: w.c.append_list(C_LIST, v),
    "sticky conversation list element": lambda w, v: w.c.append_list(C_STICKY_LIST, v),
    "working value": lambda w, v: w.h.command(SCOPE, lambda wc: wc.set_value(W_VALUE, v)),
    "working list element": lambda w, v: w.h.command(SCOPE, lambda wc: wc.append_list(W_LIST, v)),
    "accepted input": lambda w, v: w.c.accept(v),
    "steering input": lambda w, v: w.c.steer(v),
    "follow-up input": lambda w, v: w.c.follow_up(v),
    "next-run input": lambda w, v: w.c.next_run(v),
    "appended message": lambda w, v: w.c.append_message(v),
    "input with a request id": lambda w, v: w.c.accept(v, request_id="r-1"),
}


def test_a_value_that_is_not_strict_json_is_refused_on_every_write_path(world: World) -> None:
    @SETTINGS
    @given(value=_bad_json(), path=st.sampled_from(sorted(_WRITES)))
    def check(value: Any, path: str) -> None:
        world.refuses(pico.InvalidJsonError, lambda: _WRITES[path](world, value))

    check()


def test_good_json_round_trips_exactly_through_values_and_entries(world: World) -> None:
    # The other side of the gate: what it admits reads back equal, never coerced.
    @settings(max_examples=25, deadline=None, database=None)
    @given(value=_json)
    def check(value: Any) -> None:
        world.run(world.h.set_value(S_VALUE, value))
        assert world.run(world.h.get_value(S_VALUE)) == value
        entry = world.run(world.c.append("user", value))
        found = world.run(world.h.entry(entry))
        assert found is not None and found.content == value

    check()


_NAMES: dict[str, Callable[[World, str], Awaitable[Any]]] = {
    "entry kind": lambda w, t: w.c.append(t, "x"),
    "entry key": lambda w, t: w.c.append("user", "x", key=t),
    "address namespace": lambda w, t: w.h.set_value(pico.session_value("n" + t), 1),
    "address key": lambda w, t: w.c.set_value(pico.conversation_value("n", key=t), 1),
    "request id": lambda w, t: w.c.accept("hi", request_id=t),
    "working scope name": lambda w, t: w.h.command(
        pico.working_scope(t), lambda wc: wc.set_value(W_VALUE, 1)
    ),
    "required permit": lambda w, t: w.h.command(
        lambda tx: tx.create_task(w.c.id, "note", required_permit=t)
    ),
    "collapse instructions": lambda w, t: w.c.collapse(instructions=t),
}


def test_a_lone_surrogate_in_any_stored_name_is_refused_without_faulting(world: World) -> None:
    # Kinds, keys, namespaces, request ids, scope names and permits are stored text too:
    # unchecked, a lone surrogate failed at encoding and faulted the handle.
    @SETTINGS
    @given(text=_lone_surrogate_text, path=st.sampled_from(sorted(_NAMES)))
    def check(text: str, path: str) -> None:
        error = world.refuses(pico.InvalidJsonError, lambda: _NAMES[path](world, text))
        assert "lone surrogate" in str(error)

    check()


@pytest.mark.parametrize("path", sorted(set(_NAMES) - {"collapse instructions"}))
def test_a_nul_in_any_stored_name_is_refused_alike_on_every_backend(
    world: World, path: str
) -> None:
    # A name is a database text column, which PostgreSQL's text cannot hold a NUL in: there
    # an entry kind with one faulted the handle and a namespace read as "damaged tables",
    # while SQLite stored it. (Collapse instructions are stored inside JSON, which escapes
    # NUL.)
    error = world.refuses(pico.InvalidArgumentError, lambda: _NAMES[path](world, "a\x00b"))
    assert "NUL character" in str(error)


@pytest.mark.parametrize("metadata", [["a"], "text", 3, ("k", "v"), True])
def test_metadata_that_is_not_an_object_is_invalid_json(world: World, metadata: Any) -> None:
    error = world.refuses(
        pico.InvalidJsonError, lambda: world.c.append("user", "x", metadata=metadata)
    )
    assert "entry metadata" in str(error) and "not a JSON object" in str(error)


def test_a_lone_surrogate_in_a_tool_answer_is_refused_before_the_task_is_read(
    world: World,
) -> None:
    error = world.refuses(
        pico.InvalidJsonError, lambda: world.h.answer_tool_call(world.task, "half \udc00")
    )
    assert "tool answer" in str(error)


# ------------------------------------------------------------------ ids and positions


def _id_calls(w: World) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    h, c = w.h, w.c
    return {
        "harness.entry": lambda x: h.entry(x),
        "harness.get_entries": lambda x: h.get_entries([x]),
        "harness.conversation": lambda x: h.conversation(x),
        "harness.get_conversations": lambda x: h.get_conversations([x]),
        "harness.task": lambda x: h.task(x),
        "harness.get_tasks": lambda x: h.get_tasks([x]),
        "harness.entries(conversation)": lambda x: h.entries(x),
        "harness.tasks(conversation_ids)": lambda x: h.tasks(conversation_ids=[x]),
        "harness.answer_tool_call": lambda x: h.answer_tool_call(x, "answer"),
        "harness.decide_approval": lambda x: h.decide_approval(x, "grant"),
        "harness.delete_conversation": lambda x: h.delete_conversation(x),
        "conversation.result": lambda x: c.result(x),
        "conversation.cancel_queued": lambda x: c.cancel_queued(x),
        "conversation.fork(at_entry)": lambda x: c.fork(at_entry=x),
        "conversation.compact(through)": lambda x: c.compact("s", through=x),
        "conversation.append_context": lambda x: c.append_context([x]),
        "conversation.replace_context_prefix": lambda x: c.replace_context_prefix(x, []),
        "conversation.reset_context": lambda x: c.reset_context([x]),
        "conversation.abort_background": lambda x: c.abort_background(x),
        "create_task(after)": lambda x: h.command(
            lambda tx: tx.create_task(c.id, "note", after=[x])
        ),
        "create_task(conversation)": lambda x: h.command(lambda tx: tx.create_task(x, "note")),
        "patch_task": lambda x: h.command(lambda tx: tx.patch_task(x, status="spawning")),
        "append_entry(conversation)": lambda x: h.command(
            lambda tx: tx.append_entry(x, "user", "x")
        ),
        "conversation value (conversation)": lambda x: h.command(
            lambda tx: tx.set_value(C_VALUE, 1, conversation_id=x)
        ),
    }


def _position_calls(w: World) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    h, c = w.h, w.c
    return {
        "conversation.fork(as_of)": lambda x: c.fork(as_of=x),
        "conversation.snapshot(as_of)": lambda x: c.snapshot(as_of=x),
        "conversation.context_as_of": lambda x: c.context_as_of(x),
        "conversation.entries(after)": lambda x: c.entries(after=x),
        "harness.entries(before)": lambda x: h.entries(c.id, before=x),
        "harness.entries(as_of)": lambda x: h.entries(c.id, as_of=x),
        "harness.tasks(after)": lambda x: h.tasks(after=x),
        "harness.conversations(before)": lambda x: h.conversations(before=x),
        "harness.get_conversations(as_of)": lambda x: h.get_conversations([c.id], as_of=x),
        "conversation.get_value(as_of)": lambda x: c.get_value(C_VALUE, as_of=x),
        "conversation.read_list(after)": lambda x: c.read_list(C_LIST, after=x),
        "harness.read_list(before)": lambda x: h.read_list(S_LIST, before=x),
    }


def test_an_id_that_is_not_an_id_gets_invalid_argument_everywhere(world: World) -> None:
    calls = _id_calls(world)

    @SETTINGS
    @given(bad=_not_an_id, name=st.sampled_from(sorted(calls)))
    def check(bad: Any, name: str) -> None:
        error = world.refuses(pico.InvalidArgumentError, lambda: calls[name](bad))
        assert f"from 1 to {MAX_ID}" in str(error), str(error)

    check()


def test_a_single_id_lookup_names_its_own_argument(world: World) -> None:
    h = world.h
    lookups: list[tuple[Callable[[Any], Awaitable[Any]], str]] = [
        (h.entry, "entry_id"),
        (h.task, "task_id"),
        (h.conversation, "conversation_id"),
    ]
    for lookup, name in lookups:

        def attempt(f: Callable[[Any], Awaitable[Any]] = lookup) -> Awaitable[Any]:
            return f(True)

        error = world.refuses(pico.InvalidArgumentError, attempt)
        # Check: the message names the caller's argument, not an internal list of ids.
        assert str(error).startswith(f"{name} must be"), str(error)


def test_a_position_that_is_not_a_position_gets_invalid_argument_everywhere(
    world: World,
) -> None:
    calls = _position_calls(world)

    @SETTINGS
    @given(bad=_not_a_position, name=st.sampled_from(sorted(calls)))
    def check(bad: Any, name: str) -> None:
        error = world.refuses(pico.InvalidArgumentError, lambda: calls[name](bad))
        assert f"from 0 to {MAX_ID}" in str(error), str(error)

    check()


def test_a_well_formed_id_that_does_not_exist_is_not_found(world: World) -> None:
    h, c = world.h, world.c
    for ident in (MAX_ID, 2**53, h.head() + 10_000):
        # Check: lookups answer None (or leave the id out), the same on every backend.
        assert world.run(h.entry(ident)) is None
        assert world.run(h.get_entries([ident])) == {}
        assert world.run(h.task(ident)) is None
        assert world.run(h.get_tasks([ident])) == {}
        assert world.run(h.conversation(ident)) is None
        assert world.run(c.result(ident)) is None
        assert world.run(c.cancel_queued(ident)) == "not_found"
        # Check: commands raise their Unknown*Error, and nothing changes.
        world.refuses(pico.UnknownEntryError, lambda i=ident: c.append_context([i]))  # type: ignore[misc]
        world.refuses(pico.UnknownConversationError, lambda i=ident: h.delete_conversation(i))  # type: ignore[misc]
        world.refuses(
            pico.UnknownTaskError,
            lambda i=ident: h.command(lambda tx: tx.patch_task(i, status="spawning")),  # type: ignore[misc]
        )
        world.refuses(pico.NotInContextError, lambda i=ident: c.compact("s", through=i))  # type: ignore[misc]


def test_the_extreme_well_formed_positions_answer_normally(world: World) -> None:
    # 0 and 2**63 - 1 are positions every backend stores: no overflow, no driver error.
    h, c = world.h, world.c
    for at in (0, MAX_ID):
        assert world.run(c.entries(after=at, before=at)).items == ()
        assert world.run(h.tasks(after=at, before=at)).items == ()
        assert world.run(h.conversations(after=at, before=at)).items == ()
        assert world.run(h.read_list(S_LIST, after=at, before=at)).items == ()
        assert world.run(c.read_list(C_LIST, after=at, before=at)).items == ()
        assert len(world.h.audit(after=at, limit=1)) == (1 if at == 0 else 0)
    # As of the farthest position: today's state.
    assert world.run(h.entries(c.id, as_of=MAX_ID)) == world.run(h.entries(c.id))
    assert world.run(c.get_value(C_VALUE, as_of=MAX_ID)) == {"plan": [1, 2]}
    assert world.run(h.get_conversations([c.id], as_of=MAX_ID)) == world.run(
        h.get_conversations([c.id])
    )
    assert world.run(c.snapshot(as_of=MAX_ID)).context == world.run(c.snapshot()).context
    assert world.run(c.context_as_of(MAX_ID)) == world.run(c.snapshot()).context
    with pytest.raises(pico.UnknownConversationError):
        world.run(c.snapshot(as_of=0))  # it did not exist before the first commit
    world.refuses(pico.InvalidPositionError, lambda: c.fork(as_of=MAX_ID))
    world.refuses(pico.InvalidPositionError, lambda: c.fork(as_of=0))


# ------------------------------------------------------------------ limits and modes


def _page_calls(w: World, arg: str) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    h, c = w.h, w.c
    calls: dict[str, Callable[[Any], Awaitable[Any]]] = {
        "harness.entries": lambda x: h.entries(c.id, **{arg: x}),
        "conversation.entries": lambda x: c.entries(**{arg: x}),
        "harness.tasks": lambda x: h.tasks(**{arg: x}),
        "harness.conversations": lambda x: h.conversations(**{arg: x}),
        "harness.read_list": lambda x: h.read_list(S_LIST, **{arg: x}),
        "conversation.read_list": lambda x: c.read_list(C_LIST, **{arg: x}),
    }
    if arg == "limit":
        calls["harness.scan_values"] = lambda x: h.scan_values(limit=x)
        calls["conversation.scan_values"] = lambda x: c.scan_values(limit=x)
    return calls


def test_a_page_limit_out_of_range_says_the_allowed_range(world: World) -> None:
    calls = _page_calls(world, "limit")

    @SETTINGS
    @given(bad=_not_a_limit, name=st.sampled_from(sorted(calls)))
    def check(bad: Any, name: str) -> None:
        error = world.refuses(pico.InvalidArgumentError, lambda: calls[name](bad))
        assert "limit must be an integer from 1 to 1000" in str(error), str(error)

    check()


def test_an_unknown_order_or_mode_says_the_known_ones(world: World) -> None:
    calls = _page_calls(world, "order")

    @SETTINGS
    @given(bad=_not_an_order, name=st.sampled_from(sorted(calls)))
    def check(bad: Any, name: str) -> None:
        error = world.refuses(pico.InvalidArgumentError, lambda: calls[name](bad))
        assert "one of 'asc', 'desc'" in str(error), str(error)

    check()
    error = world.refuses(
        pico.InvalidArgumentError, lambda: world.h.decide_approval(world.task, "maybe")
    )
    assert "one of 'grant', 'deny'" in str(error)


def _argument_calls(w: World) -> dict[str, Callable[[], Awaitable[Any]]]:
    h, c = w.h, w.c

    def task(**kw: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: h.command(lambda tx: tx.create_task(c.id, "note", **kw))

    return {
        "an empty entry kind": lambda: c.append("", "x"),
        "an entry kind that is not text": lambda: c.append(3, "x"),  # type: ignore[arg-type]
        "an entry key that is not text": lambda: c.append("user", "x", key=3),  # type: ignore[arg-type]
        "a by_task_id that is not an id": lambda: h.command(
            lambda tx: tx.append_entry(c.id, "user", "x", by_task_id=True)
        ),
        "foreground that is not a bool": task(foreground=1),
        "not_before that is NaN": task(not_before=math.nan),
        "not_before that is text": task(not_before="soon"),
        "a permit that is not text": task(required_permit=7),
        "spawned_by that is not an id": task(spawned_by=1.0),
        "an expected_revision that is negative": lambda: c.compact(
            "s", through=_context_end(w), expected_revision=-1
        ),
        "an expected_revision that is a bool": lambda: c.compact(
            "s", through=_context_end(w), expected_revision=True
        ),
        "inherit_state that is not a bool": lambda: c.fork(
            at_entry=_context_end(w),
            inherit_state="no",  # type: ignore[arg-type]
        ),
        "a live filter that is not a bool": lambda: h.tasks(live="yes"),  # type: ignore[arg-type]
        "a kind filter that is not text": lambda: h.entries(c.id, kind=1),  # type: ignore[arg-type]
        "a scan cursor that is not a key pair": lambda: h.scan_values(after=("a",)),  # type: ignore[arg-type]
        "a namespace filter that is not text": lambda: h.scan_values(namespace=1),  # type: ignore[arg-type]
        "an audit limit of zero": lambda: _now(h.audit, limit=0),
        "an audit position that is negative": lambda: _now(h.audit, after=-1),
    }


async def _now(call: Callable[..., Any], **kw: Any) -> Any:
    return call(**kw)  # a synchronous call, awaited like the others


def test_every_other_malformed_argument_is_invalid_argument(world: World) -> None:
    for label, call in _argument_calls(world).items():
        error = world.refuses(pico.InvalidArgumentError, call)
        assert "must be" in str(error), (label, str(error))


# ------------------------------------------------------------------ one meaning per error


def test_a_through_id_outside_the_context_is_not_in_context_and_not_a_stale_prefix(
    world: World,
) -> None:
    note = world.run(world.c.append("note", "aside", select=False))
    error = world.refuses(pico.NotInContextError, lambda: world.c.compact("s", through=note))
    assert not isinstance(error, pico.StalePrefixError)
    assert f"entry {note} is not in the current context" in str(error)
    # A real stale revision is StalePrefixError, never NotInContextError.
    revision = world.run(world.c.snapshot()).prefix_revision
    end = _context_end(world)
    stale = world.refuses(
        pico.StalePrefixError,
        lambda: world.c.compact("s", through=end, expected_revision=revision + 1),
    )
    assert not isinstance(stale, pico.NotInContextError)


def test_decimal_and_bool_ids_are_never_taken_as_ids(world: World) -> None:
    # True == 1 and Decimal(1) == 1 in Python: a dict- or index-based backend would find
    # entry 1; every backend refuses instead.
    for bad in (True, Decimal(1), 1.0):
        world.refuses(pico.InvalidArgumentError, lambda b=bad: world.h.entry(b))  # type: ignore[misc]
