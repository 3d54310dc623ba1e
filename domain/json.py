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


def dumps(value: Any, *, what: str = "payload") -> str:
    """Validate ``value`` as strict JSON and return its canonical text."""
    _check(value, what, 0)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def loads(text: str) -> JsonValue:
    result: JsonValue = json.loads(text)
    return result


def strict_json(value: Any, *, what: str = "payload") -> JsonValue:
    """Validate and deep-copy ``value``."""
    return loads(dumps(value, what=what))
