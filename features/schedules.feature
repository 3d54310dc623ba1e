Feature: Schedules
  A schedule runs a job again and again: every so many seconds, or at the times a cron
  expression names. Each due time starts one run, and the next run is planned only once
  that run has ended, so at most one run is ever working. After the harness was away, the
  schedule's policy decides how many of the missed runs it starts, at most a limit and the
  most recent ones, never the whole backlog. Cancelling a schedule stops its running job
  and its recurrence together. (pico v3 §5.6, §6.2, §8.7)

  Background:
    Given a job session with conversation "A"

  Scenario: A schedule that catches up after an outage starts at most its limit of runs
    When "A" schedules "nightly" to run "echo tick" every 60 seconds, catching up at most 3 missed runs
    And the harness is away for 10 days
    And schedule "nightly" works until it waits for its next run
    Then schedule "nightly" launched 3 runs, each after the one before had ended
    And the last run of schedule "nightly" was the one due when the harness returned
    And schedule "nightly" skipped 14397 missed runs
    And schedule "nightly" waits for its next due time, 60 seconds from now

  Scenario: Cancelling a schedule stops its running job and its recurrence
    When "A" schedules "crawl" to run "sleep 30" every 60 seconds
    And 60 seconds pass
    And the first run of schedule "crawl" is running
    And schedule "crawl" is cancelled from "A"
    Then schedule "crawl" and its run were both marked for cancellation
    And schedule "crawl" was aborted and its run was killed by SIGTERM
    And schedule "crawl" launches no further run, however much time passes
