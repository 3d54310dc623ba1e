"""Steps for recurring schedules: a recurrence, an outage on the fake clock, the plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from pytest_bdd import given, parsers, then, when

from pico.application.clock import FakeClock
from pico.application.recurrence import Plan, Recurrence, first_run, plan


@dataclass
class Schedule:
    rec: Recurrence
    clock: FakeClock = field(default_factory=FakeClock)
    created: float = 0.0
    plan: Plan | None = None
    launched: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.created = self.clock.now()

    @property
    def result(self) -> Plan:
        assert self.plan is not None, "the scenario has not planned the schedule yet"
        return self.plan


def _wall(text: str, zone: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp()


@given(
    parsers.parse("a schedule every {every:d} seconds that catches up at most {n:d} missed runs"),
    target_fixture="schedule",
)
def an_interval_schedule_catching_up(every: int, n: int) -> Schedule:
    return Schedule(Recurrence(every=every, missed="catch_up", catch_up_limit=n))


@given(
    parsers.parse("a schedule every {every:d} seconds that runs missed work once"),
    target_fixture="schedule",
)
def an_interval_schedule_once(every: int) -> Schedule:
    return Schedule(Recurrence(every=every, missed="once"))


@given(
    parsers.parse("a schedule every {every:d} seconds that skips missed runs"),
    target_fixture="schedule",
)
def an_interval_schedule_skipping(every: int) -> Schedule:
    return Schedule(Recurrence(every=every, missed="skip"))


@given(
    parsers.parse("a schedule every {every:d} seconds that runs {count:d} times"),
    target_fixture="schedule",
)
def an_interval_schedule_with_a_count(every: int, count: int) -> Schedule:
    return Schedule(Recurrence(every=every, count=count))


@given(
    parsers.parse('a daily schedule at {hhmm} in "{zone}" that last ran on {day}'),
    target_fixture="schedule",
)
def a_daily_schedule(hhmm: str, zone: str, day: str) -> Schedule:
    hour, minute = (int(part) for part in hhmm.split(":"))
    schedule = Schedule(Recurrence(cron=f"{minute} {hour} * * *", timezone=zone))
    schedule.launched.append(_wall(f"{day} {hhmm}", zone))
    return schedule


@when(parsers.parse("the harness was down for {days:d} days and {seconds:d} seconds"))
def the_harness_was_down(schedule: Schedule, days: int, seconds: int) -> None:
    schedule.clock.advance(days * 86_400 + seconds)
    schedule.plan = plan(
        schedule.rec, last_due=schedule.created, runs_done=0, now=schedule.clock.now()
    )


@when("its runs fall due on time one after another")
def runs_fall_due_on_time(schedule: Schedule) -> None:
    due = first_run(schedule.rec, now=schedule.created)
    last = schedule.created
    while due is not None:
        schedule.clock.advance(due - schedule.clock.now() + 0.5)
        schedule.plan = plan(
            schedule.rec, last_due=last, runs_done=len(schedule.launched), now=due + 0.5
        )
        schedule.launched.extend(schedule.plan.due)
        last = schedule.launched[-1]
        due = schedule.plan.next_not_before
        assert len(schedule.launched) <= 100, "the schedule never completed"


def _period(schedule: Schedule) -> float:
    assert schedule.rec.every is not None
    return schedule.rec.every


def _due_so_far(schedule: Schedule) -> int:
    return math.floor((schedule.clock.now() - schedule.created) / _period(schedule))


@then(
    parsers.re(r"(?P<n>\d+|no) runs? (?:is|are) launched(?:, the most recent ones?)?"),
)
def runs_are_launched(schedule: Schedule, n: str) -> None:
    count = 0 if n == "no" else int(n)
    total = _due_so_far(schedule)
    every = _period(schedule)
    newest = tuple(schedule.created + k * every for k in range(total - count + 1, total + 1))
    assert schedule.result.due == newest


@then(parsers.parse("{n:d} missed runs are skipped"))
def runs_are_skipped(schedule: Schedule, n: int) -> None:
    assert schedule.result.skipped == n


@then("the schedule resumes at its next due time")
def the_schedule_resumes(schedule: Schedule) -> None:
    next_due = schedule.created + (_due_so_far(schedule) + 1) * _period(schedule)
    assert schedule.result.next_not_before == next_due
    assert next_due > schedule.clock.now()


@then(parsers.parse("{n:d} runs were launched in all"))
def runs_launched_in_all(schedule: Schedule, n: int) -> None:
    assert len(schedule.launched) == n


@then("the schedule is complete")
def the_schedule_is_complete(schedule: Schedule) -> None:
    assert schedule.result.complete


@then(parsers.parse('its next run is at {when} in "{zone}"'))
def the_next_run_is_at(schedule: Schedule, when: str, zone: str) -> None:
    schedule.launched.append(_wall(when, zone))
    assert first_run(schedule.rec, now=schedule.launched[-2]) == schedule.launched[-1]


@then(parsers.parse('the run after it is at {when} in "{zone}"'))
def the_run_after_it_is_at(schedule: Schedule, when: str, zone: str) -> None:
    last = schedule.launched[-1]
    result = plan(schedule.rec, last_due=schedule.launched[-2], runs_done=1, now=last)
    assert result.due == (last,)
    assert result.next_not_before == _wall(when, zone)
