Feature: Recurring schedules after downtime
  A schedule's recurrence says when its runs are due and, after the harness was down, how
  many of the runs it missed are launched: none (skip), one (once) or at most N (catch up).
  A restart never launches the backlog. (pico v3 §8.7)

  Scenario: A schedule that catches up after an outage launches at most its limit
    Given a schedule every 60 seconds that catches up at most 5 missed runs
    When the harness was down for 10 days and 30 seconds
    Then 5 runs are launched, the most recent ones
    And 14395 missed runs are skipped
    And the schedule resumes at its next due time

  Scenario: A schedule that runs once after an outage launches one run
    Given a schedule every 60 seconds that runs missed work once
    When the harness was down for 10 days and 30 seconds
    Then 1 run is launched, the most recent one
    And 14399 missed runs are skipped
    And the schedule resumes at its next due time

  Scenario: A schedule that skips missed runs launches none after an outage
    Given a schedule every 3600 seconds that skips missed runs
    When the harness was down for 10 days and 1800 seconds
    Then no run is launched
    And 240 missed runs are skipped
    And the schedule resumes at its next due time

  Scenario: A schedule with a run count completes with its last run
    Given a schedule every 60 seconds that runs 3 times
    When its runs fall due on time one after another
    Then 3 runs were launched in all
    And the schedule is complete

  Scenario: A daily schedule in Berlin runs at 03:00 on the spring-forward day
    Given a daily schedule at 02:30 in "Europe/Berlin" that last ran on 2026-03-28
    Then its next run is at 2026-03-29 03:00 in "Europe/Berlin"
    And the run after it is at 2026-03-30 02:30 in "Europe/Berlin"
