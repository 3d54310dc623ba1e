"""Recurrence (seed 003 §8.7): due times, missed-run policies after an outage, ends, DST, JSON
and validation. Pure: every time is explicit (the shipped FakeClock where a clock reads well)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from pico.application import recurrence
from pico.application.clock import FakeClock
from pico.application.recurrence import (
    MAX_CATCH_UP,
    SKIPPED_WALK,
    Plan,
    Recurrence,
    first_run,
    plan,
)
from pico.domain.errors import InvalidArgumentError
from pico.domain.json import dumps, loads

MINUTE = 60.0
DAY = 86_400.0
BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> float:
    return datetime(year, month, day, hour, minute, sec, tzinfo=BERLIN).timestamp()


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> float:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC).timestamp()


class CountingCroniter(croniter):
    """The real croniter, counting the matches it computes."""

    steps = 0

    def get_next(self, *args: Any, **kwargs: Any) -> Any:
        CountingCroniter.steps += 1
        return super().get_next(*args, **kwargs)

    def get_prev(self, *args: Any, **kwargs: Any) -> Any:
        CountingCroniter.steps += 1
        return super().get_prev(*args, **kwargs)


@pytest.fixture
def cron_steps(monkeypatch: pytest.MonkeyPatch) -> type[CountingCroniter]:
    CountingCroniter.steps = 0
    monkeypatch.setattr(recurrence, "croniter", CountingCroniter)
    return CountingCroniter


# --- intervals -------------------------------------------------------------------------------


def test_an_interval_first_runs_one_interval_after_creation() -> None:
    assert first_run(Recurrence(every=MINUTE), now=1_000_000.0) == 1_000_060.0


def test_an_interval_run_late_by_less_than_a_period_launches_and_keeps_the_grid() -> None:
    rec = Recurrence(every=MINUTE)
    result = plan(rec, last_due=1_000_000.0, runs_done=0, now=1_000_060.5)
    # Check the grid is anchored at last_due, not at the late now.
    assert result == Plan(due=(1_000_060.0,), next_not_before=1_000_120.0, skipped=0)


def test_a_plan_before_the_first_due_time_launches_nothing_and_waits_for_it() -> None:
    rec = Recurrence(every=MINUTE)
    result = plan(rec, last_due=1_000_000.0, runs_done=0, now=1_000_059.9)
    assert result == Plan(due=(), next_not_before=1_000_060.0, skipped=0)


def test_a_due_time_exactly_at_now_is_due() -> None:
    result = plan(Recurrence(every=MINUTE), last_due=0.0, runs_done=0, now=120.0)
    assert result.due == (120.0,)
    assert result.next_not_before == 180.0
    assert result.skipped == 1


# --- a 10-day outage with a one-minute interval ----------------------------------------------


def outage() -> tuple[float, float]:
    """(creation time, now) after ten days and 30 seconds down: 14,400 one-minute runs due,
    the newest 30 seconds ago."""
    clock = FakeClock()
    created = clock.now()
    clock.advance(10 * DAY + 30)
    return created, clock.now()


def test_skip_after_an_outage_launches_no_missed_run_and_resumes_on_the_grid() -> None:
    created, now = outage()
    rec = Recurrence(every=MINUTE, missed="skip", grace=10.0)
    result = plan(rec, last_due=created, runs_done=0, now=now)
    assert result.due == ()
    assert result.skipped == 14_400
    assert result.next_not_before == created + 14_401 * MINUTE


def test_skip_still_launches_the_newest_run_within_its_grace() -> None:
    created, now = outage()
    result = plan(Recurrence(every=MINUTE), last_due=created, runs_done=0, now=now)
    # The default grace (60 s) covers the run due 30 s ago; the other 14,399 are skipped.
    assert result.due == (created + 14_400 * MINUTE,)
    assert result.skipped == 14_399


def test_once_after_an_outage_launches_only_the_newest_missed_run() -> None:
    created, now = outage()
    result = plan(Recurrence(every=MINUTE, missed="once"), last_due=created, runs_done=0, now=now)
    assert result.due == (created + 14_400 * MINUTE,)
    assert result.skipped == 14_399
    assert result.next_not_before == created + 14_401 * MINUTE


def test_catch_up_after_an_outage_launches_the_newest_n_oldest_first() -> None:
    created, now = outage()
    rec = Recurrence(every=MINUTE, missed="catch_up", catch_up_limit=5)
    result = plan(rec, last_due=created, runs_done=0, now=now)
    assert result.due == tuple(created + k * MINUTE for k in range(14_396, 14_401))
    assert result.skipped == 14_395
    assert result.next_not_before == created + 14_401 * MINUTE
    # Check the backlog is consumed: planning again from the last launched run finds nothing.
    again = plan(rec, last_due=result.due[-1], runs_done=5, now=now)
    assert again == Plan(due=(), next_not_before=created + 14_401 * MINUTE, skipped=0)


def test_catch_up_with_a_short_backlog_launches_all_of_it() -> None:
    rec = Recurrence(every=MINUTE, missed="catch_up", catch_up_limit=5)
    result = plan(rec, last_due=0.0, runs_done=0, now=185.0)
    assert result == Plan(due=(60.0, 120.0, 180.0), next_not_before=240.0, skipped=0)


@pytest.mark.parametrize(
    ("missed", "limit", "launched"), [("skip", None, 1), ("once", None, 1), ("catch_up", 5, 5)]
)
def test_a_cron_outage_walks_a_bounded_number_of_matches(
    cron_steps: type[CountingCroniter], missed: Any, limit: int | None, launched: int
) -> None:
    created, now = outage()
    rec = Recurrence(cron="* * * * *", missed=missed, catch_up_limit=limit)
    cron_steps.steps = 0
    result = plan(rec, last_due=created, runs_done=0, now=now)
    # Check the launch bound and the walk bound (not 14,400 steps, one per missed minute).
    assert len(result.due) == launched
    assert result.due[-1] == math.floor(now / MINUTE) * MINUTE
    assert cron_steps.steps <= launched + SKIPPED_WALK + 1
    assert result.skipped == SKIPPED_WALK and not result.skipped_exact
    assert result.next_not_before == result.due[-1] + MINUTE


def test_a_cron_backlog_shorter_than_the_walk_is_counted_exactly() -> None:
    rec = Recurrence(cron="0 * * * *", missed="catch_up", catch_up_limit=2)
    result = plan(rec, last_due=utc(2026, 1, 1, 0, 0), runs_done=0, now=utc(2026, 1, 1, 4, 10))
    assert result.due == (utc(2026, 1, 1, 3, 0), utc(2026, 1, 1, 4, 0))
    assert result.skipped == 2 and result.skipped_exact
    assert result.next_not_before == utc(2026, 1, 1, 5, 0)


# --- cron and time zones ---------------------------------------------------------------------


def test_a_cron_first_run_is_the_next_match_strictly_after_now() -> None:
    rec = Recurrence(cron="0 * * * *")
    assert first_run(rec, now=utc(2026, 1, 1, 0, 0)) == utc(2026, 1, 1, 1, 0)
    assert first_run(rec, now=utc(2026, 1, 1, 0, 59, 59) + 0.5) == utc(2026, 1, 1, 1, 0)


def test_a_cron_in_a_time_zone_runs_on_that_zones_wall_clock() -> None:
    rec = Recurrence(cron="30 2 * * *", timezone="Europe/Berlin")
    assert first_run(rec, now=utc(2026, 1, 10, 0, 0)) == utc(2026, 1, 10, 1, 30)  # CET = UTC+1
    assert first_run(rec, now=utc(2026, 7, 10, 0, 0)) == utc(2026, 7, 10, 0, 30)  # CEST = UTC+2


def test_a_daily_0230_berlin_job_runs_at_0300_on_the_spring_forward_day() -> None:
    rec = Recurrence(cron="30 2 * * *", timezone="Europe/Berlin")
    saturday = berlin(2026, 3, 28, 2, 30)
    # 02:30 does not exist on 29 March 2026 (02:00 CET -> 03:00 CEST): the run is at 03:00.
    sunday = first_run(rec, now=saturday)
    assert sunday == berlin(2026, 3, 29, 3, 0) == saturday + 23.5 * 3600
    result = plan(rec, last_due=saturday, runs_done=1, now=berlin(2026, 3, 29, 3, 0, 5))
    assert result.due == (sunday,)
    assert result.next_not_before == berlin(2026, 3, 30, 2, 30)


def test_a_daily_0230_berlin_job_runs_twice_on_the_fall_back_day() -> None:
    # croniter matches wall-clock times: 02:30 happens twice on 25 October 2026 (CEST, CET).
    rec = Recurrence(
        cron="30 2 * * *", timezone="Europe/Berlin", missed="catch_up", catch_up_limit=3
    )
    result = plan(
        rec, last_due=berlin(2026, 10, 24, 2, 30), runs_done=0, now=berlin(2026, 10, 25, 4)
    )
    assert result.due == (utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30))


# --- until and count -------------------------------------------------------------------------


def test_until_excludes_a_run_due_at_it_and_ends_the_recurrence() -> None:
    rec = Recurrence(every=MINUTE, until=180.0)
    assert plan(rec, last_due=0.0, runs_done=0, now=60.0).next_not_before == 120.0
    last = plan(rec, last_due=60.0, runs_done=1, now=120.0)
    assert last == Plan(due=(120.0,), next_not_before=None, skipped=0)
    assert last.complete


def test_until_bounds_the_window_after_an_outage_past_it() -> None:
    rec = Recurrence(every=MINUTE, missed="catch_up", catch_up_limit=3, until=200.0)
    result = plan(rec, last_due=0.0, runs_done=0, now=10 * DAY)
    assert result == Plan(due=(60.0, 120.0, 180.0), next_not_before=None, skipped=0)


def test_until_before_the_first_run_leaves_none() -> None:
    assert first_run(Recurrence(every=MINUTE, until=60.0), now=0.0) is None
    assert (
        first_run(Recurrence(cron="0 * * * *", until=utc(2026, 1, 1, 1)), now=utc(2026, 1, 1))
        is None
    )


def test_count_caps_the_runs_and_completes_with_the_last() -> None:
    rec = Recurrence(every=MINUTE, missed="catch_up", catch_up_limit=5, count=3)
    result = plan(rec, last_due=0.0, runs_done=1, now=10 * MINUTE + 1)
    # Two runs remain: the newest two are launched, the rest skipped, and it is complete.
    assert result == Plan(due=(540.0, 600.0), next_not_before=None, skipped=8)
    assert plan(rec, last_due=600.0, runs_done=3, now=DAY) == Plan(
        due=(), next_not_before=None, skipped=0
    )


def test_a_cron_until_ends_the_walk() -> None:
    rec = Recurrence(cron="0 * * * *", until=utc(2026, 1, 1, 3), missed="once")
    result = plan(rec, last_due=utc(2026, 1, 1), runs_done=0, now=utc(2026, 1, 2))
    assert result == Plan(due=(utc(2026, 1, 1, 2),), next_not_before=None, skipped=1)


# --- JSON ------------------------------------------------------------------------------------

EXAMPLES = [
    Recurrence(every=60),
    Recurrence(every=0.5, until=2e9, count=10, missed="once"),
    Recurrence(cron="30 2 * * 1-5", timezone="Europe/Berlin", missed="catch_up", catch_up_limit=3),
    Recurrence(cron="*/15 * * * *", missed="skip", grace=5),
]


@pytest.mark.parametrize("rec", EXAMPLES)
def test_a_recurrence_round_trips_through_strict_json(rec: Recurrence) -> None:
    stored = dumps(rec.to_json(), what="recurrence")
    assert Recurrence.from_json(loads(stored)) == rec


def test_from_json_takes_defaults_for_missing_keys() -> None:
    assert Recurrence.from_json({"cron": "0 0 * * *"}) == Recurrence(cron="0 0 * * *")


# --- validation ------------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({}, "exactly one of every"),
    ({"every": 60, "cron": "* * * * *"}, "exactly one of every"),
    ({"every": 0}, "recurrence.every"),
    ({"every": -1.0}, "recurrence.every"),
    ({"every": math.nan}, "recurrence.every"),
    ({"every": math.inf}, "recurrence.every"),
    ({"every": True}, "recurrence.every"),
    ({"every": "60"}, "recurrence.every"),
    ({"every": 60, "timezone": "UTC"}, "recurrence.timezone"),
    ({"cron": "* * * *"}, "recurrence.cron"),
    ({"cron": "0 * * * * *"}, "recurrence.cron"),
    ({"cron": "@daily"}, "recurrence.cron"),
    ({"cron": 5}, "recurrence.cron"),
    ({"cron": "61 * * * *"}, "recurrence.cron"),
    ({"cron": "* * * * mo"}, "recurrence.cron"),
    ({"cron": "0 0 30 2 *"}, "recurrence.cron"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus_Mons"}, "recurrence.timezone"),
    ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "recurrence.timezone"),
    ({"cron": "* * * * *", "timezone": 1}, "recurrence.timezone"),
    ({"every": 60, "until": math.nan}, "recurrence.until"),
    ({"every": 60, "until": -1.0}, "recurrence.until"),
    ({"every": 60, "count": 0}, "recurrence.count"),
    ({"every": 60, "count": True}, "recurrence.count"),
    ({"every": 60, "count": 2.0}, "recurrence.count"),
    ({"every": 60, "missed": "all"}, "recurrence.missed"),
    ({"every": 60, "missed": "catch_up"}, "recurrence.catch_up_limit"),
    ({"every": 60, "missed": "catch_up", "catch_up_limit": 0}, "recurrence.catch_up_limit"),
    (
        {"every": 60, "missed": "catch_up", "catch_up_limit": MAX_CATCH_UP + 1},
        "recurrence.catch_up_limit",
    ),
    ({"every": 60, "missed": "catch_up", "catch_up_limit": True}, "recurrence.catch_up_limit"),
    ({"every": 60, "missed": "once", "catch_up_limit": 3}, "recurrence.catch_up_limit"),
    ({"every": 60, "grace": -1}, "recurrence.grace"),
    ({"every": 60, "grace": math.inf}, "recurrence.grace"),
    ({"every": 60, "missed": "once", "grace": 5}, "recurrence.grace"),
]


@pytest.mark.parametrize(("fields", "named"), BAD, ids=[repr(f) for f, _ in BAD])
def test_a_bad_field_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named) as caught:
        Recurrence(**fields)
    # Check no third-party exception leaks as the cause.
    assert caught.value.__cause__ is None
    with pytest.raises(InvalidArgumentError, match=named):
        Recurrence.from_json(fields)


def test_from_json_refuses_unknown_keys_and_non_objects() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown field.*'hourly'"):
        Recurrence.from_json({"every": 60, "hourly": True})
    with pytest.raises(InvalidArgumentError, match="JSON object"):
        Recurrence.from_json(["every", 60])


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"last_due": math.nan, "runs_done": 0, "now": 0.0}, "last_due"),
        ({"last_due": 0.0, "runs_done": 0, "now": math.inf}, "now"),
        ({"last_due": 0.0, "runs_done": 0, "now": True}, "now"),
        ({"last_due": 0.0, "runs_done": -1, "now": 0.0}, "runs_done"),
        ({"last_due": 0.0, "runs_done": False, "now": 0.0}, "runs_done"),
        ({"last_due": 0.0, "runs_done": 0, "now": 1e12}, "now"),
    ],
)
def test_plan_refuses_bad_arguments(args: dict[str, Any], named: str) -> None:
    for rec in (Recurrence(every=60), Recurrence(cron="* * * * *")):
        with pytest.raises(InvalidArgumentError, match=named):
            plan(rec, **args)


def test_a_recurrence_is_frozen() -> None:
    rec = Recurrence(every=60)
    with pytest.raises(AttributeError):
        rec.every = 1.0  # type: ignore[misc]


# --- property --------------------------------------------------------------------------------


def assert_ordered_past_and_bounded(rec: Recurrence, *, last_due: float, now: float) -> None:
    result = plan(rec, last_due=last_due, runs_done=0, now=now)
    assert all(a < b for a, b in zip(result.due, result.due[1:], strict=False))
    assert all(last_due < when <= now for when in result.due)
    assert result.next_not_before is not None and result.next_not_before > now
    assert len(result.due) <= rec.max_launch
    assert result.skipped >= 0


times = st.floats(min_value=0.0, max_value=1e11, allow_nan=False, allow_infinity=False)


@given(
    every=st.floats(min_value=0.001, max_value=1e6),
    last_due=times,
    gap=st.floats(min_value=0.0, max_value=1e11),
    policy=st.sampled_from(["skip", "once", "catch_up"]),
    limit=st.integers(min_value=1, max_value=50),
    grace=st.floats(min_value=0.0, max_value=1e4),
)
def test_interval_plans_are_ordered_past_and_bounded(
    every: float, last_due: float, gap: float, policy: Any, limit: int, grace: float
) -> None:
    rec = Recurrence(
        every=every,
        missed=policy,
        catch_up_limit=limit if policy == "catch_up" else None,
        grace=grace if policy == "skip" else None,
    )
    assert_ordered_past_and_bounded(rec, last_due=last_due, now=last_due + gap)


@settings(max_examples=60, deadline=None)
@given(
    cron=st.sampled_from(["* * * * *", "*/7 3-5 * * *", "30 2 * * 1-5", "0 0 29 2 *"]),
    zone=st.sampled_from([None, "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    last_due=st.floats(min_value=0.0, max_value=4e9),
    gap=st.floats(min_value=0.0, max_value=1e9),
    policy=st.sampled_from(["skip", "once", "catch_up"]),
    limit=st.integers(min_value=1, max_value=20),
)
def test_cron_plans_are_ordered_past_and_bounded(
    cron: str, zone: str | None, last_due: float, gap: float, policy: Any, limit: int
) -> None:
    rec = Recurrence(
        cron=cron,
        timezone=zone,
        missed=policy,
        catch_up_limit=limit if policy == "catch_up" else None,
    )
    assert_ordered_past_and_bounded(rec, last_due=last_due, now=last_due + gap)


def test_a_cron_match_at_until_is_not_due_but_one_just_before_it_is() -> None:
    rec = Recurrence(cron="0 * * * *", until=5 * 3600.0, missed="catch_up", catch_up_limit=10)
    result = plan(rec, last_due=0.0, runs_done=0, now=10 * 3600.0)
    assert result == Plan(
        due=tuple(k * 3600.0 for k in range(1, 5)), next_not_before=None, skipped=0
    )
    later = Recurrence(cron="0 * * * *", until=5 * 3600 + 0.5, missed="catch_up", catch_up_limit=10)
    assert plan(later, last_due=0.0, runs_done=0, now=10 * 3600.0).due[-1] == 5 * 3600.0


def test_latest_is_the_newest_window_time_launched_or_skipped() -> None:
    # A 10-minute outage with a one-minute interval under skip: nothing is on time, but
    # the next plan starts after the newest missed time, so nothing is counted twice.
    rec = Recurrence(every=60.0, missed="skip", grace=5.0)
    missed = plan(rec, last_due=0.0, runs_done=0, now=630.0)
    assert missed.due == () and missed.skipped == 10 and missed.latest == 600.0
    again = plan(rec, last_due=missed.latest, runs_done=0, now=630.0)
    assert again.skipped == 0 and again.latest is None
    caught = plan(
        Recurrence(every=60.0, missed="catch_up", catch_up_limit=3),
        last_due=0.0,
        runs_done=0,
        now=630.0,
    )
    assert caught.due == (480.0, 540.0, 600.0) and caught.latest == 600.0
