"""The read model's JSON list columns (a task's ``after``, a context edit's ``ids``) are the
text ``json.dumps`` writes, whichever path wrote them: a rebuild (``pico replay``/``rebuild``)
compares its rows with the live ones byte for byte, so a fast path that spelled a list
differently would report every older row as a difference."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from pico.infrastructure.sql.recorder import _int_list


@pytest.mark.parametrize(
    "values",
    [(), [], (7,), (1, 2, 3), [10, -3, 0], (2**70,), (True, 2), (1.5,), ("a",)],
)
def test_a_list_column_reads_as_json_dumps_writes_it(values: Sequence[object]) -> None:
    assert _int_list(values) == json.dumps(list(values))  # type: ignore[arg-type]


def test_a_bool_is_not_spelled_as_an_int() -> None:
    assert _int_list((True, 1)) == "[true, 1]"
