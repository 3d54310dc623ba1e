"""Strict JSON: the only payload shape pico stores.

Payloads are validated and copied at the boundary, so a caller can never mutate stored
data through an object it passed in or got back.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeAlias

from pico.domain.errors import InvalidJsonError

__all__ = ["JsonObject", "JsonValue", "dumps", "loads", "strict_json"]

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonObject: TypeAlias = dict[str, JsonValue]

_MAX_DEPTH = 200


def _check(value: Any, path: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise InvalidJsonError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidJsonError(f"{path}: {value!r} is not a JSON number (NaN/Infinity)")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidJsonError(f"{path}: object key {key!r} is not a string")
            _check(item, f"{path}.{key}", depth + 1)
        return
    raise InvalidJsonError(
        f"{path}: {type(value).__name__} is not JSON; use dict, list, str, int, float, bool or None"
    )


def _valid(value: Any, depth: int) -> bool:
    """The common case of ``_check`` without building paths: exact built-in types only
    (anything else, e.g. a str subclass or a bad value, takes ``_check`` for the verdict
    and the message)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    if depth >= _MAX_DEPTH:
        return False
    if t is dict:
        for key, item in value.items():
            if type(key) is not str or not _valid(item, depth + 1):
                return False
        return True
    if t is list:
        for item in value:  # noqa: SIM110 - a loop, not all(<genexpr>): this is the hot path
            if not _valid(item, depth + 1):
                return False
        return True
    return False


# One encoder: json.dumps builds a new one per call for non-default options.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any, *, what: str = "payload") -> str:
    """Validate ``value`` as strict JSON and return its canonical text."""
    if not _valid(value, 0):
        _check(value, what, 0)
    return _ENCODER.encode(value)


def loads(text: str) -> JsonValue:
    result: JsonValue = json.loads(text)
    return result


def strict_json(value: Any, *, what: str = "payload") -> JsonValue:
    """Validate and deep-copy ``value``."""
    return loads(dumps(value, what=what))
