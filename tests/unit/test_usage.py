"""Usage as generations store it: known usage accumulates over attempts, unknown adds
nothing, and prompt-cache counts appear only once a provider reported them (§8.3)."""

from __future__ import annotations

from pico.application.flows.streaming import add_usage
from pico.application.model import Usage


def test_usage_without_cache_counts_stores_what_it_stored_before_they_existed() -> None:
    assert Usage(10, 2).as_json() == {"input": 10, "output": 2}
    assert add_usage(None, Usage(10, 2)) == {"input": 10, "output": 2}


def test_unknown_usage_adds_nothing_and_is_not_zero() -> None:
    assert add_usage(None, None) is None
    assert add_usage({"input": 3, "output": 1}, None) == {"input": 3, "output": 1}


def test_cache_counts_accumulate_once_reported_and_survive_an_attempt_without_them() -> None:
    first = add_usage(None, Usage(100, 5, cache_read_tokens=80, cache_write_tokens=20))
    assert first == {"input": 100, "output": 5, "cache_read": 80, "cache_write": 20}
    second = add_usage(first, Usage(50, 1))
    assert second == {"input": 150, "output": 6, "cache_read": 80, "cache_write": 20}
    assert add_usage(second, Usage(1, 1, cache_read_tokens=4)) == {
        "input": 151,
        "output": 7,
        "cache_read": 84,
        "cache_write": 20,
    }


def test_usage_adds_every_field() -> None:
    total = Usage(1, 2, 3, 4) + Usage(10, 20, 30, 40)
    assert total == Usage(11, 22, 33, 44)
