"""The one strict-JSON gate (issue 10): exact verdicts and path-naming messages."""

from __future__ import annotations

import enum
import json
import math
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pico.application.state import session_value
from pico.application.tools import Tool, ToolContext
from pico.domain import json as json_module
from pico.domain.errors import InvalidArgumentError, InvalidJsonError
from pico.domain.ids import MAX_ID, check_choice, check_id, check_ids, check_limit, check_position
from pico.domain.json import MAX_DEPTH, JsonValue, check_json, dumps, is_strict_json, strict_json


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ((1, 2), r"^payload: tuple is not JSON; use a list$"),
        ({1, 2}, r"^payload: set is not JSON"),
        (frozenset({1}), r"^payload: frozenset is not JSON"),
        (b"x", r"^payload: bytes is not JSON"),
        (bytearray(b"x"), r"^payload: bytearray is not JSON"),
        (Decimal("1.5"), r"^payload: Decimal is not JSON"),
        (range(3), r"^payload: range is not JSON"),
        (float("nan"), r"^payload: nan is not a JSON number"),
        (float("inf"), r"^payload: inf is not a JSON number"),
        (float("-inf"), r"^payload: -inf is not a JSON number"),
        ({1: "a"}, r"^payload: object key 1 is of type int, not a string"),
        ({None: "a"}, r"^payload: object key None is of type NoneType"),
        ({(1,): "a"}, r"^payload: object key \(1,\) is of type tuple"),
        (object(), r"^payload: object is not JSON"),
        pytest.param(10**4300, r"^payload: an integer of more than 4300 digits", id="big-int"),
        pytest.param(-(10**4300), r"^payload: an integer of more than 4300", id="-big-int"),
    ],
)
def test_the_gate_refuses_each_kind_of_non_json_naming_it(bad: object, message: str) -> None:
    with pytest.raises(InvalidJsonError, match=message):
        dumps(bad)
    assert not is_strict_json(bad)


@pytest.mark.parametrize(
    ("bad", "path"),
    [
        ({"a": [1, {"b": (1,)}]}, "payload.a[1].b: tuple"),
        ([0, [1, {2: 3}]], "payload[1][1]: object key 2"),
        ({"odd key": float("nan")}, "payload['odd key']: nan"),
        ({"ok": {"deeper": b""}}, "payload.ok.deeper: bytes"),
        ({"n": [1, 10**5000]}, "payload.n[1]: an integer of more than 4300 digits"),
    ],
)
def test_the_gate_names_the_path_of_a_nested_bad_value(bad: object, path: str) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        dumps(bad)
    assert str(caught.value).startswith(path), str(caught.value)


@pytest.mark.parametrize(
    ("bad", "path"),
    [
        ("\ud800", "payload: the string '\\ud800' has a lone surrogate at index 0"),
        ("ab\udfffcd", "payload: the string 'ab\\udfffcd' has a lone surrogate at index 2"),
        ({"k": "é\udc80"}, "payload.k: the string"),
        ({"\ud83d": 1}, "payload: object key '\\ud83d' has a lone surrogate at index 0"),
        ([1, {"a": {"b\udbff": 0}}], "payload[1].a: object key"),
        (_nested(20, "x\ud800"), "payload" + "[0]" * 20 + ": the string"),
    ],
)
def test_a_lone_surrogate_anywhere_is_refused_before_encoding(bad: object, path: str) -> None:
    with pytest.raises(InvalidJsonError) as caught:
        dumps(bad)
    assert str(caught.value).startswith(path), str(caught.value)


def test_well_formed_text_outside_ascii_passes_and_round_trips() -> None:
    value = {
        "emoji 😀": "naïve — 日本語 \U0001f600",
        "pair": "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16"),
    }
    assert strict_json(value) == value


def test_nesting_depth_is_one_limit_200_levels_pass_201_do_not() -> None:
    assert MAX_DEPTH == 200
    assert dumps(_nested(200)).count("[") == 200
    assert dumps({"a": _nested(199)}).count("[") == 199
    with pytest.raises(InvalidJsonError, match="nested deeper than 200 levels"):
        dumps(_nested(201))
    with pytest.raises(InvalidJsonError, match="nested deeper than 200 levels"):
        dumps({"a": _nested(200)})  # the object counts as a level
    # A cycle is refused by the same limit, never a RecursionError.
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(InvalidJsonError, match="nested deeper"):
        dumps(cycle)


def test_a_very_long_path_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidJsonError) as caught:
        dumps(_nested(201))
    assert len(str(caught.value)) < 300 and "..." in str(caught.value)


class _Color(enum.IntEnum):
    RED = 1


class _Name(enum.StrEnum):
    ADA = "ada"


class _Text(str):
    pass


def test_builtin_subclasses_are_stored_as_their_base_value() -> None:
    # Documented choice: an int/str/float subclass keeps its value and compares equal;
    # bool stays JSON's true/false and is never an int.
    assert strict_json({"c": _Color.RED, "n": _Name.ADA, "t": _Text("v")}) == {
        "c": 1,
        "n": "ada",
        "t": "v",
    }
    assert type(strict_json(_Color.RED)) is int
    assert dumps([True, False]) == "[true,false]"


def test_check_json_validates_without_encoding() -> None:
    check_json({"a": [1, 2.5, None, True, "x"]})
    with pytest.raises(InvalidJsonError, match=r"^entry content: tuple"):
        check_json((1,), what="entry content")


@pytest.mark.parametrize("type_", [Any, object, JsonValue])
@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (float("nan"), "value of 'ns': nan"),
        ((1, 2), "value of 'ns': tuple"),
        ({1: "a"}, "value of 'ns': object key 1"),
        ({"a": "\ud800"}, "value of 'ns'.a: the string"),
        (Decimal(1), "value of 'ns': Decimal"),
        (_nested(201), "value of 'ns'"),
    ],
)
def test_an_untyped_address_stores_only_strict_json(type_: Any, bad: Any, expected: str) -> None:
    address = session_value("ns", type_)
    with pytest.raises(InvalidJsonError) as caught:
        address.encode(bad)
    assert str(caught.value).startswith(expected), str(caught.value)
    assert address.decode(address.encode({"a": [1, None]})) == {"a": [1, None]}


def test_a_typed_address_refuses_a_value_that_would_read_back_as_something_else() -> None:
    # A NaN float would serialize as null and read back as None (or fail): refused.
    with pytest.raises(InvalidJsonError, match="nan is not a JSON number"):
        session_value("f", float).encode(float("nan"))
    with pytest.raises(InvalidJsonError, match="lone surrogate"):
        session_value("s", str).encode("\udc00")
    with pytest.raises(InvalidJsonError, match="deeper than 200"):
        session_value("l", list[Any]).encode(_nested(201))
    # A type that defines its JSON form round-trips and is kept.
    pair = session_value("p", tuple[int, int])
    assert pair.decode(pair.encode((1, 2))) == (1, 2)


# ------------------------------------------------------------------ ids, positions, limits


@pytest.mark.parametrize(
    "bad", [True, False, 1.0, "1", b"1", [1], None, 0, -1, MAX_ID + 1, 2**64, Decimal(1)]
)
def test_an_id_that_is_not_a_positive_64_bit_int_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        check_id(bad, "entry_id")
    message = str(caught.value)
    assert message.startswith("entry_id must be an integer id from 1 to 9223372036854775807")
    assert repr(bad)[:20] in message


def test_well_formed_ids_and_positions_pass() -> None:
    assert check_id(1, "x") == 1 and check_id(MAX_ID, "x") == MAX_ID
    assert check_position(0, "as_of") == 0
    assert check_ids((3, 1), "ids") == [3, 1]
    with pytest.raises(InvalidArgumentError, match=r"ids\[1\] must be an integer id"):
        check_ids([1, True], "ids")
    assert check_ids({7}, "ids") == [7] and check_ids(iter([2]), "ids") == [2]
    assert check_ids(frozenset({4}), "ids") == [4] and check_ids(range(1, 3), "ids") == [1, 2]

    class ListMapping(list, Mapping):  # type: ignore[type-arg]
        """A list that is also a mapping: refused as every mapping is."""

    for bad in ("12", b"12", {1: "a"}, 12, None, ListMapping([1])):
        with pytest.raises(InvalidArgumentError, match="ids must be a list, tuple or set"):
            check_ids(bad, "ids")
    with pytest.raises(InvalidArgumentError, match="as_of must be an integer position from 0"):
        check_position(-1, "as_of")


@pytest.mark.parametrize("bad", [0, -1, 1001, 10**30, True, 1.5, "10", None])
def test_a_page_limit_out_of_range_says_the_range(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="limit must be an integer from 1 to 1000"):
        check_limit(bad, maximum=1000)


def test_a_mode_must_be_one_of_the_known_strings() -> None:
    assert check_choice("asc", "order", ("asc", "desc")) == "asc"
    with pytest.raises(InvalidArgumentError, match="order must be one of 'asc', 'desc'"):
        check_choice("ASC", "order", ("asc", "desc"))


# ------------------------------------------------------------------ tool results


async def test_a_tool_result_with_a_lone_surrogate_becomes_an_error_result() -> None:
    async def returns_bad(args: Any, ctx: ToolContext) -> str:
        return "half \ud800"

    async def writes_bad(args: Any, ctx: ToolContext) -> str:
        await ctx.write("progress \udfff")
        return "never"

    schema: Any = {"type": "object"}
    for execute, where in ((returns_bad, "the result of tool"), (writes_bad, "progress text")):
        tool = Tool("t", "a tool", schema, execute)
        outcome = await tool.run({}, ToolContext(call_id="c1", tool_name="t"))
        # Check: an error result that says why, never the bad text (which would fault the
        # handle when the settlement encodes it).
        assert outcome.is_error and outcome.text.startswith("InvalidJsonError: "), outcome.text
        assert where in outcome.text and "\ud800" not in outcome.text
        assert "\udfff" not in outcome.text


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), max_size=5), inner)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_dumps_writes_the_text_the_library_encoder_writes(value: Any) -> None:
    # dumps keeps one C scanner instead of building one per call: the text must not move.
    library = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert dumps(value) == library


def test_dumps_refuses_a_cycle_before_encoding_it() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(InvalidJsonError, match="nested deeper than"):
        dumps(cycle)
    assert dumps(_Text("v")) == '"v"' and dumps({"c": _Color.RED}) == '{"c":1}'


# Values of exact built-in types, valid or not: non-finite floats, lone surrogates in text
# and keys, tuples, bytes and non-string keys among the leaves.
_ANY = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["\ud800", "a\udfff", "é"])  # lone surrogates: not UTF-8 text
    | st.tuples(st.integers())
    | st.binary(max_size=2),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=3) | st.sampled_from(["\udc80"]) | st.integers(), inner, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(_ANY)
def test_the_fast_verdict_agrees_with_the_path_naming_check(value: Any) -> None:
    # ``is_strict_json`` checks scalar members inline (the hot path); the slow path that
    # names what is wrong is the reference. For exact built-in types they agree both ways.
    try:
        json_module._check(value, "payload", 0)
    except InvalidJsonError:
        assert not is_strict_json(value)
    else:
        assert is_strict_json(value)


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types throughout (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)


def _containers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value, *(c for v in value.values() for c in _containers(v))]
    if isinstance(value, list):
        return [value, *(c for v in value for c in _containers(v))]
    return []


@settings(max_examples=500, deadline=None)
@given(_JSON, st.booleans())
def test_strict_json_copies_exactly_what_the_text_round_trip_gives(value: Any, share: bool) -> None:
    # strict_json copies a valid value without encoding it: what it returns must be what
    # the text round trip returns (types included: True, 1 and 1.0 stay apart), and share
    # no dict or list with the caller's value, even one the value holds twice.
    if share and isinstance(value, (dict, list)):
        value = {"a": value, "b": value}
    copied = strict_json(value)
    assert _same(copied, json.loads(dumps(value)))
    mine = {id(c) for c in _containers(value)}
    assert not mine & {id(c) for c in _containers(copied)}
    got = _containers(copied)
    assert len({id(c) for c in got}) == len(got)  # each container copied apart


_SPACE = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@settings(max_examples=400, deadline=None)
@given(_JSON, _SPACE, _SPACE, st.booleans())
def test_loads_reads_what_json_loads_reads(
    value: Any, before: str, after: str, pretty: bool
) -> None:
    # loads calls json's C scanner directly; with whitespace around the value, or spaced
    # out inside it, it must return exactly what json.loads returns.
    text = json.dumps(value, indent=1 if pretty else None, ensure_ascii=pretty)
    for candidate in (text, before + text + after):
        assert _same(json_module.loads(candidate), json.loads(candidate))


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "{",
        '{"a":}',
        "[1,]",
        "1 2",
        '"x" y',
        "nul",
        "NaNx",
        '{"a":1}}',
        "\ufeff{}",
        "[" * 3,
    ],
)
def test_loads_refuses_what_json_loads_refuses_with_its_error(bad: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(bad)
    with pytest.raises(json.JSONDecodeError) as got:
        json_module.loads(bad)
    assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


def test_loads_reads_the_non_finite_numbers_json_loads_reads() -> None:
    # json.loads takes NaN and Infinity (pico's writers never write them): the same here.
    got = json_module.loads("[NaN,Infinity,-Infinity,1e400]")
    assert isinstance(got, list)
    assert got[0] != got[0] and got[1:] == [math.inf, -math.inf, math.inf]


def test_an_integer_over_the_digit_limit_is_refused_at_the_call_and_its_edge_kept() -> None:
    # strict_json copies a valid value without encoding it: an int Python could not write
    # as JSON text (over 4,300 digits) must still be refused where it is passed in, not
    # later when storage encodes it (which would fault the handle).
    edge = 10**4300 - 1  # 4,300 digits: stored and read back exactly
    assert strict_json({"n": edge}) == {"n": edge}
    assert json_module.loads(dumps([edge, -edge])) == [edge, -edge]
    assert is_strict_json([edge, -edge, {"n": edge}])
    json_module._check([edge, -edge, {"n": edge}], "payload", 0)
    # (Hypothesis cannot draw these: it takes their repr, which is over the limit too.)
    for bad in (10**4300, [1, -(10**4300)], {"a": {"b": 10**5000}}, [_Color.RED, 10**4300]):
        with pytest.raises(InvalidJsonError, match="more than 4300 digits"):
            strict_json(bad)
        with pytest.raises(InvalidJsonError, match="more than 4300 digits"):
            json_module._check(bad, "payload", 0)  # the path-naming check agrees
        assert not is_strict_json(bad)


async def test_a_tool_writing_an_integer_over_the_digit_limit_gets_an_error_result() -> None:
    async def huge_details(args: Any, ctx: ToolContext) -> str:
        ctx.set_details({"n": 10**5000})
        return "never"

    tool = Tool("t", "a tool", {"type": "object"}, huge_details)
    outcome = await tool.run({}, ToolContext(call_id="c1", tool_name="t"))
    assert outcome.is_error and outcome.text.startswith("InvalidJsonError: "), outcome.text
    assert "more than 4300 digits" in outcome.text and outcome.details is None


def test_copying_a_payload_nested_to_the_limit_needs_no_more_stack_than_checking_it() -> None:
    # strict_json's copy recurses once a level, as the verdict does: a payload nested
    # MAX_DEPTH deep is copied from as deep a call stack as it can be checked from.
    payload = {"a": _nested(MAX_DEPTH - 1)}

    def depth() -> int:
        frame: Any = sys._getframe()
        n = 0
        while frame is not None:
            frame, n = frame.f_back, n + 1
        return n

    def at(remaining: int) -> Any:
        return at(remaining - 1) if remaining else strict_json(payload)

    # Leave room for the 200-level walk and ~40 frames more, no more: a copy that took
    # two frames a level (a comprehension's own frame in 3.11) runs out of stack here.
    spare = sys.getrecursionlimit() - depth() - MAX_DEPTH - 40
    assert at(spare) == payload
