"""Strict JSON: the only payload shape pico stores (seed 003 §4.1).

``dumps`` is the one gate every write path calls before any id is allocated: entry
content and metadata, summaries, handoffs, task state, tool results, inputs and every
scoped value or list element. It refuses, as ``InvalidJsonError`` naming the path, what
the JSON encoder would otherwise store as something else: NaN and infinities, tuples,
sets, bytes, ``Decimal``, ``range`` and other non-JSON objects, non-string object keys,
lone surrogates in any string or key, nesting deeper than ``MAX_DEPTH`` levels, and an
integer of more than ``MAX_INT_DIGITS`` digits (which Python would neither write nor read
back as a JSON number by default).
``str``, ``int`` and ``float`` subclasses (e.g. ``IntEnum``, ``StrEnum``) are stored as
their base type's value, which compares equal; ``bool`` is JSON's own true/false.

Payloads are validated and copied at the boundary, so a caller can never mutate stored
data through an object it passed in or got back.
"""

from __future__ import annotations

import json
import json.scanner
import math
from json.encoder import encode_basestring
from typing import Any, TypeAlias

from pico.domain.errors import InvalidArgumentError, InvalidJsonError

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "JsonObject",
    "JsonValue",
    "check_json",
    "check_name",
    "dumps",
    "is_strict_json",
    "loads",
    "strict_json",
]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonObject: TypeAlias = dict[str, JsonValue]

#: Containers nest at most this deep in every payload kind (the top level is depth 0).
MAX_DEPTH = 200
#: An integer has at most this many digits: Python's default limit for converting an int
#: to and from decimal text (``sys.get_int_max_str_digits``), so that every pico process
#: can write it and read it back as a JSON number.
MAX_INT_DIGITS = 4300
_INT_LIMIT = 10**MAX_INT_DIGITS  # an int strictly between _INT_FLOOR and it fits
_INT_FLOOR = -_INT_LIMIT  # a constant: ``-_INT_LIMIT`` in a check would negate it each time


def _utf8(text: str) -> bool:
    """Can ``text`` be stored as UTF-8 (no lone surrogate)? Callers try ``isascii`` first:
    it answers the common case without a copy."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_at(text: str) -> int:
    return next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"


def _short(path: str) -> str:
    return path if len(path) <= 120 else f"{path[:50]}...{path[-60:]}"


def _check(value: Any, path: str, depth: int) -> None:
    """Raise ``InvalidJsonError`` naming the first offending path; return if valid."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if not (value.isascii() or _utf8(value)):
            raise InvalidJsonError(
                f"{_short(path)}: the string {_shown(value)} has a lone surrogate at index "
                f"{_surrogate_at(value)}, which is not valid Unicode text; pass well-formed "
                "text (surrogate pairs joined, e.g. decoded with errors='strict')"
            )
        return
    if isinstance(value, int):
        if not _INT_FLOOR < value < _INT_LIMIT:
            raise InvalidJsonError(
                f"{_short(path)}: an integer of more than {MAX_INT_DIGITS} digits is not "
                f"stored as a JSON number (Python reads back at most {MAX_INT_DIGITS}); "
                "store it as a string"
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidJsonError(
                f"{_short(path)}: {value!r} is not a JSON number (NaN and infinities are "
                "not JSON); store a finite number, a string or null"
            )
        return
    if isinstance(value, (list, dict)) and depth >= MAX_DEPTH:
        raise InvalidJsonError(
            f"{_short(path)}: nested deeper than {MAX_DEPTH} levels; flatten the payload "
            "(or store the deep part as JSON text)"
        )
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidJsonError(
                    f"{_short(path)}: object key {key!r} is of type {type(key).__name__}, "
                    "not a string; "
                    "JSON object keys are strings (convert it yourself, e.g. str(key))"
                )
            if not (key.isascii() or _utf8(key)):
                raise InvalidJsonError(
                    f"{_short(path)}: object key {_shown(key)} has a lone surrogate at index "
                    f"{_surrogate_at(key)}, which is not valid Unicode text"
                )
            _check(item, _key_path(path, key), depth + 1)
        return
    hint = {
        "tuple": "use a list",
        "set": "use a sorted list",
        "frozenset": "use a sorted list",
        "bytes": "decode it to text or base64 first",
        "bytearray": "decode it to text or base64 first",
        "Decimal": "use a string (exact) or a float",
        "range": "use list(range(...))",
    }.get(type(value).__name__, "use dict, list, str, int, float, bool or None")
    raise InvalidJsonError(f"{_short(path)}: {type(value).__name__} is not JSON; {hint}")


def _valid(value: Any, depth: int) -> bool:
    """The common case of ``_check`` without building paths: exact built-in types only
    (anything else, e.g. a str subclass or a bad value, takes ``_check`` for the verdict
    and the message)."""
    t = type(value)
    if t is str:
        return value.isascii() or _utf8(value)
    if t is int:
        fits: bool = _INT_FLOOR < value < _INT_LIMIT
        return fits
    if t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    if depth >= MAX_DEPTH:
        return False
    # Scalar members are checked in the loop, not by a call each: most members of a
    # payload are strings and numbers, and a call is most of what checking one costs.
    if t is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _utf8(key)):
                return False
            ti = type(item)
            if ti is str:
                if not (item.isascii() or _utf8(item)):
                    return False
            elif ti is int:
                if not _INT_FLOOR < item < _INT_LIMIT:
                    return False
            elif not (ti is bool or item is None or _valid(item, depth + 1)):
                return False
        return True
    if t is list:
        for item in value:
            ti = type(item)
            if ti is str:
                if not (item.isascii() or _utf8(item)):
                    return False
            elif ti is int:
                if not _INT_FLOOR < item < _INT_LIMIT:
                    return False
            elif not (ti is bool or item is None or _valid(item, depth + 1)):
                return False
        return True
    return False


# One encoder: json.dumps builds a new one per call for non-default options.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# Its C scanner, made once: ``JSONEncoder.encode`` builds one per call (a third of encoding
# a task's state). No circular-reference markers: ``dumps`` encodes only what ``_valid``
# or ``_check`` passed, whose depth limit refuses a cycle first. Same text as ``_ENCODER``.
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # CPython's C accelerator
_C_ENCODER = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
)


def is_strict_json(value: Any) -> bool:
    """The fast verdict alone: True when ``value`` is strict JSON of exact built-in types
    (False may still be valid, e.g. a str subclass: ``check_json`` decides)."""
    return _valid(value, 0)


def check_json(value: Any, *, what: str = "payload") -> None:
    """Validate ``value`` as strict JSON without encoding it; ``InvalidJsonError`` names
    the first offending path (``what`` is its root)."""
    if not _valid(value, 0):
        _check(value, what, 0)


def check_name(text: str, *, what: str) -> None:
    """A name pico stores as a database text column (a namespace, a key, an entry kind):
    text JSON can carry (no lone surrogate: ``check_json``) and no NUL character, which
    PostgreSQL's text cannot hold; refused on every backend alike, before anything runs."""
    check_json(text, what=what)
    if "\x00" in text:
        raise InvalidArgumentError(
            f"{what} {text!r} contains a NUL character, which a database text column cannot "
            "hold; remove it"
        )


def dumps(value: Any, *, what: str = "payload") -> str:
    """Validate ``value`` as strict JSON and return its canonical text."""
    if not _valid(value, 0):
        _check(value, what, 0)
    if _C_ENCODER is None or type(value) is str:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


# The C scanner ``json.loads`` ends in, called directly: ``loads`` of a short text spent
# ~80% of its time in the Python-level ``decode``/``raw_decode`` and their whitespace
# regexes (0.94 against 0.12 us for "{}"; most stored texts pico reads back are short).
_c_make_scanner: Any = getattr(json.scanner, "c_make_scanner", None)  # CPython's C accelerator
_SCAN = None if _c_make_scanner is None else _c_make_scanner(json.JSONDecoder())


def loads(text: str) -> JsonValue:
    """``json.loads(text)``: the same value, or the same error."""
    if _SCAN is not None and type(text) is str:
        # A value starting at 0 and ending the text is what json.loads returns for it;
        # anything else (whitespace around it, an error) takes json.loads, which decides.
        try:
            value, end = _SCAN(text, 0)
        except Exception:  # json.loads below raises its own error
            pass
        else:
            if end == len(text):
                scanned: JsonValue = value  # (no typing.cast: a call a read)
                return scanned
    result: JsonValue = json.loads(text)
    return result


def _copy(value: Any) -> Any:
    """A deep copy of a value ``_valid`` passed: what ``loads(dumps(value))`` returns
    (new dicts and lists, the same immutable leaves), without the text in between."""
    # Loops, not comprehensions: a comprehension is a frame of its own in Python 3.11, and
    # a payload MAX_DEPTH deep must not need twice the stack ``_valid`` needed for it.
    t = type(value)
    if t is dict:
        copied: dict[str, Any] = {}
        for k, v in value.items():
            tv = type(v)
            copied[k] = v if tv is str or tv is int or v is None else _copy(v)
        return copied
    if t is list:
        items: list[Any] = []
        append = items.append
        for v in value:
            tv = type(v)
            append(v if tv is str or tv is int or v is None else _copy(v))
        return items
    return value  # a bool, a float, a str or an int, or None


def strict_json(value: Any, *, what: str = "payload") -> JsonValue:
    """Validate and deep-copy ``value``."""
    if _valid(value, 0):
        copied: JsonValue = _copy(value)
        return copied
    return loads(dumps(value, what=what))
