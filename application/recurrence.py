"""Recurrence for schedules (seed 003 §8.7): when a recurring schedule's runs are due, and how
many of the runs missed during downtime it launches.

A ``Recurrence`` is a persisted, JSON-able value: a fixed interval or a 5-field cron expression
(UTC or an IANA time zone), an optional end (``until``, ``count``) and a missed-run policy.
``first_run`` and ``plan`` are pure arithmetic on explicit times: no clock, no I/O. Their cost is
bounded whatever the outage: O(1) for an interval, at most ``max_launch + SKIPPED_WALK + 1``
cron steps for a cron expression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from pico.domain.errors import InvalidArgumentError
from pico.domain.ids import (
    MAX_ID,
    check_choice,
    check_limit,
    invalid_argument,  # one wording for every argument error
)
from pico.domain.json import JsonObject, JsonValue, strict_json

__all__ = [
    "DEFAULT_GRACE",
    "MAX_CATCH_UP",
    "MAX_EVERY",
    "MAX_TIME",
    "MIN_EVERY",
    "MISSED_POLICIES",
    "SKIPPED_WALK",
    "Missed",
    "Plan",
    "Recurrence",
    "first_run",
    "plan",
]

Missed = Literal["skip", "once", "catch_up"]

#: The missed-run policies, in ``Recurrence.missed``.
MISSED_POLICIES: tuple[str, ...] = ("skip", "once", "catch_up")

#: ``catch_up_limit`` is at most this: a restart never launches more than this many runs.
MAX_CATCH_UP = 1000

#: Interval bounds in seconds. Below a millisecond consecutive due times could round to the
#: same float on an epoch clock; above ~317 years the arithmetic gains nothing.
MIN_EVERY = 0.001
MAX_EVERY = 1e10

#: The latest epoch time a recurrence takes (9000-01-01T00:00:00Z): far enough from the
#: datetime range's end (9999) for a sparse cron expression's next match to exist.
MAX_TIME = 221_845_392_000.0

#: How late (seconds) the newest due time may be and still count as on time under ``skip``.
DEFAULT_GRACE = 60.0

#: Cron only: how many older missed runs ``plan`` counts beyond the ones it launches before it
#: stops walking back and reports ``skipped`` as a lower bound (``skipped_exact`` False).
SKIPPED_WALK = 10

_FIELDS = ("every", "cron", "timezone", "until", "count", "missed", "catch_up_limit", "grace")
_MAX_CRON_CHARS = 200


def _seconds(value: object, what: str) -> float:
    """A finite number of seconds (an ``int`` or ``float``, never a bool), as a float."""
    if type(value) in (int, float) and math.isfinite(cast(float, value)):
        return float(cast(float, value))
    raise invalid_argument(what, value, "a finite number of seconds (an int or float, not a bool)")


def _time(value: object, what: str) -> float:
    """An epoch time from 0 to ``MAX_TIME``: the range a cron walk can reach in any zone."""
    when = _seconds(value, what)
    if 0 <= when <= MAX_TIME:
        return when
    raise invalid_argument(
        what, value, f"epoch seconds from 0 to {MAX_TIME:.0f} (1970 to the year 9000)"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Recurrence:
    """When a schedule runs: exactly one of ``every`` (seconds) or ``cron`` (5 fields).

    Attributes:
        every: the interval in seconds, from ``MIN_EVERY`` to ``MAX_EVERY``. Runs are due at
            ``last_due + k * every``: the grid is anchored at the schedule's creation time and
            kept by every run, so late runs do not drift it.
        cron: a 5-field cron expression (minute hour day-of-month month day-of-week).
        timezone: the IANA zone the cron fields are read in (``None``: UTC). Cron only.
        until: epoch seconds; no run is due at or after it.
        count: the total number of runs launched (skipped runs do not count).
        missed: ``"skip"``, ``"once"`` or ``"catch_up"`` (see ``plan``).
        catch_up_limit: N, from 1 to ``MAX_CATCH_UP``; required with ``catch_up`` only.
        grace: seconds the newest due time may be late and still run under ``skip``
            (``None``: ``DEFAULT_GRACE``). ``skip`` only.

    Raises:
        InvalidArgumentError: a field is missing, of the wrong type, out of range, or does not
            apply to the others; the message names the field, the value and what is allowed.
            Nothing of croniter's or zoneinfo's own exceptions reaches the caller.
    """

    every: float | None = None
    cron: str | None = None
    timezone: str | None = None
    until: float | None = None
    count: int | None = None
    missed: Missed = "skip"
    catch_up_limit: int | None = None
    grace: float | None = None

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise InvalidArgumentError(
                "a recurrence needs exactly one of every (an interval in seconds) or cron "
                f"(a 5-field cron expression), got every={self.every!r}, cron={self.cron!r}"
            )
        if self.every is not None:
            every = _seconds(self.every, "recurrence.every")
            if not MIN_EVERY <= every <= MAX_EVERY:
                raise invalid_argument(
                    "recurrence.every",
                    self.every,
                    f"an interval from {MIN_EVERY} to {MAX_EVERY:.0e} seconds",
                )
            object.__setattr__(self, "every", every)
            if self.timezone is not None:
                raise InvalidArgumentError(
                    f"recurrence.timezone applies to cron expressions only, got "
                    f"timezone={self.timezone!r} with every={every!r}; drop the timezone "
                    "(an interval is the same in every zone)"
                )
        else:
            self._check_cron()
        if self.until is not None:
            object.__setattr__(self, "until", _time(self.until, "recurrence.until"))
        if self.count is not None:
            check_limit(self.count, "recurrence.count", maximum=MAX_ID)
        check_choice(self.missed, "recurrence.missed", MISSED_POLICIES)
        if self.missed == "catch_up":
            check_limit(self.catch_up_limit, "recurrence.catch_up_limit", maximum=MAX_CATCH_UP)
        elif self.catch_up_limit is not None:
            raise InvalidArgumentError(
                f"recurrence.catch_up_limit applies to missed='catch_up' only, got "
                f"catch_up_limit={self.catch_up_limit!r} with missed={self.missed!r}"
            )
        if self.grace is not None:
            if self.missed != "skip":
                raise InvalidArgumentError(
                    f"recurrence.grace applies to missed='skip' only, got grace={self.grace!r} "
                    f"with missed={self.missed!r}"
                )
            grace = _seconds(self.grace, "recurrence.grace")
            if grace < 0:
                raise invalid_argument(
                    "recurrence.grace", self.grace, "a finite number of seconds >= 0"
                )
            object.__setattr__(self, "grace", grace)

    def _check_cron(self) -> None:
        expr = self.cron
        if type(expr) is not str or len(expr) > _MAX_CRON_CHARS or len(expr.split()) != 5:
            raise invalid_argument(
                "recurrence.cron",
                expr,
                "a 5-field cron expression 'minute hour day-of-month month day-of-week' "
                "(e.g. '30 2 * * *'), at most 200 characters",
            )
        zone = self.timezone
        if zone is not None:
            if type(zone) is not str:
                raise invalid_argument(
                    "recurrence.timezone", zone, "an IANA time zone name or None"
                )
            try:
                ZoneInfo(zone)
            except (ZoneInfoNotFoundError, ValueError, OSError):
                raise InvalidArgumentError(
                    f"recurrence.timezone {zone!r} is not an IANA time zone this system knows; "
                    "pass a name such as 'Europe/Berlin' or 'UTC', or None for UTC"
                ) from None
        try:
            # One step proves the expression parses and matches some time at all.
            croniter(expr, datetime.fromtimestamp(0, self._zone())).get_next(float)
        except Exception:  # croniter's errors are not part of pico's surface
            raise InvalidArgumentError(
                f"recurrence.cron {expr!r} is not a cron expression that matches any time; "
                "each of the 5 fields takes a number, a range (1-5), a list (1,3), a step "
                "(*/15) or *; e.g. '30 2 * * *' is every day at 02:30"
            ) from None

    def _zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or "UTC")

    @property
    def max_launch(self) -> int:
        """The most runs one ``plan`` launches: 1 for skip and once, N for catch_up."""
        return self.catch_up_limit if self.catch_up_limit is not None else 1

    @property
    def effective_grace(self) -> float:
        return DEFAULT_GRACE if self.grace is None else self.grace

    def to_json(self) -> JsonObject:
        """Every field, ``None`` where unset; ``from_json`` reads it back equal."""
        return cast(
            JsonObject,
            strict_json({name: getattr(self, name) for name in _FIELDS}, what="recurrence"),
        )

    @classmethod
    def from_json(cls, data: JsonValue) -> Recurrence:
        """A recurrence from ``to_json``'s object. Missing keys take their defaults.

        Raises:
            InvalidArgumentError: ``data`` is not an object, has a key that is not a field,
                or a field is invalid (as the constructor).
        """
        if not isinstance(data, dict):
            raise invalid_argument("recurrence", data, "a JSON object of recurrence fields")
        unknown = sorted(str(key) for key in data if key not in _FIELDS)
        if unknown:
            raise InvalidArgumentError(
                f"recurrence has unknown field(s) {', '.join(map(repr, unknown))}; the fields "
                f"are {', '.join(_FIELDS)}"
            )
        return cls(**cast(dict[str, object], data))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a ready schedule does now.

    Attributes:
        due: the due times to launch now, oldest first, at most ``rec.max_launch``; all at or
            before ``now``.
        next_not_before: the next due time after ``now`` (the schedule's next ``not_before``),
            or ``None`` when the recurrence is complete once ``due`` is launched.
        skipped: due times in the window that are not launched.
        skipped_exact: False when a cron walk stopped after ``SKIPPED_WALK`` older runs:
            ``skipped`` is then a lower bound ("at least").
        latest: the newest due time in the window (launched or skipped), or ``None`` when
            the window is empty: the next ``plan``'s ``last_due`` when nothing is launched,
            so skipped runs are not counted again.
    """

    due: tuple[float, ...]
    next_not_before: float | None
    skipped: int
    skipped_exact: bool = True
    latest: float | None = field(default=None, compare=False)

    @property
    def complete(self) -> bool:
        return self.next_not_before is None


def first_run(rec: Recurrence, *, now: float) -> float | None:
    """The first due time strictly after ``now`` (the creation time), or ``None`` when
    ``until`` leaves no run. An interval's first run is ``now + every``; a cron expression's
    is its next match after ``now``. Pass the same ``now`` as ``last_due`` to the first
    ``plan``."""
    now = _time(now, "now")
    when = now + rec.every if rec.every is not None else _cron_after(rec, now)
    if rec.until is not None and when >= rec.until:
        return None
    return when


def plan(rec: Recurrence, *, last_due: float, runs_done: int, now: float) -> Plan:
    """The runs to launch at ``now`` and the next ``not_before``.

    The *window* is the due times after ``last_due`` and at or before ``now`` (and before
    ``until``). Its newest time is *on time* when ``now`` is at most ``grace`` past it; every
    other time in the window is *missed*. By policy:

    - ``skip``: launch the newest time if it is on time, else nothing;
    - ``once``: launch the newest time (one run stands for the whole backlog);
    - ``catch_up``: launch the newest N times. The newest, not the oldest: the oldest N would
      leave the rest of the backlog behind them for the next plan to find again.

    ``count`` caps the launches at ``count - runs_done`` (the newest kept). Everything in the
    window not launched is ``skipped``.

    Args:
        rec: the recurrence.
        last_due: the due time of the last run launched, or the creation time before any.
        runs_done: runs launched so far (counts towards ``count``).
        now: the current time on the harness clock.

    Raises:
        InvalidArgumentError: a time is not a finite number, or ``runs_done`` not an int >= 0.
    """
    last_due = _time(last_due, "last_due")
    now = _time(now, "now")
    if type(runs_done) is not int or runs_done < 0:
        raise invalid_argument("runs_done", runs_done, "an integer >= 0")
    remaining = MAX_ID if rec.count is None else rec.count - runs_done
    if remaining <= 0:
        return Plan(due=(), next_not_before=None, skipped=0)
    want = min(rec.max_launch, remaining)
    if rec.every is not None:
        newest, total, after, exact = _interval_window(rec, rec.every, last_due, now, want)
    else:
        newest, total, after, exact = _cron_window(rec, last_due, now, want)
    if newest and rec.missed == "skip" and now - newest[-1] > rec.effective_grace:
        due: tuple[float, ...] = ()
    else:
        due = tuple(newest[-want:]) if rec.missed == "catch_up" else tuple(newest[-1:])
    if len(due) >= remaining or (rec.until is not None and after >= rec.until):
        after_or_none: float | None = None
    else:
        after_or_none = after
    return Plan(
        due=due,
        next_not_before=after_or_none,
        skipped=total - len(due),
        skipped_exact=exact,
        latest=newest[-1] if newest else None,
    )


def _interval_window(
    rec: Recurrence, every: float, last_due: float, now: float, want: int
) -> tuple[list[float], int, float, bool]:
    """(newest ``want`` window times oldest first, window size, next time after now, exact):
    arithmetic on ``last_due + k * every``, O(1) in the outage's length."""

    def at(k: int) -> float:
        return last_due + k * every

    k_now = max(0, math.floor((now - last_due) / every))
    # The division can round either way by an ulp; a few steps settle it.
    while at(k_now + 1) <= now:
        k_now += 1
    while k_now > 0 and at(k_now) > now:
        k_now -= 1
    k_end = k_now
    if rec.until is not None:
        until = rec.until
        k_until = max(0, math.ceil((until - last_due) / every) - 1)
        while at(k_until + 1) < until:
            k_until += 1
        while k_until > 0 and at(k_until) >= until:
            k_until -= 1
        k_end = min(k_end, k_until)
    newest = [at(k) for k in range(max(1, k_end - want + 1), k_end + 1)]
    return newest, k_end, at(k_now + 1), True


def _cron_window(
    rec: Recurrence, last_due: float, now: float, want: int
) -> tuple[list[float], int, float, bool]:
    """The same for a cron expression: walk back from ``now`` at most ``want + SKIPPED_WALK``
    matches, never the whole backlog."""
    expr = cast(str, rec.cron)
    zone = rec._zone()
    # 5-field matches fall on whole seconds, so "at or before now" is "before floor(now) + 1".
    before = float(math.floor(now) + 1)
    if rec.until is not None:
        before = min(before, rec.until)
    walk = croniter(expr, datetime.fromtimestamp(before, zone))
    found: list[float] = []
    exact = False
    for _ in range(want + SKIPPED_WALK):
        when = walk.get_prev(float)
        if when <= last_due:
            exact = True
            break
        found.append(when)
    found.reverse()
    return found[-want:], len(found), _cron_after(rec, now), exact


def _cron_after(rec: Recurrence, now: float) -> float:
    """The first match strictly after ``now``."""
    start = datetime.fromtimestamp(math.floor(now), rec._zone())
    return croniter(cast(str, rec.cron), start).get_next(float)
