Feature: One writer per session
  Opening a session for writing claims it. A previous owner that still believes it holds
  the session is refused at its next commit, and nothing of that commit is stored.
  (pico v3 §1.2, §3.5; durable state, "Claiming a run")

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"

  Scenario: A second owner fences the first
    When a second owner opens the session
    And the first owner tries to append "stale" to "A"
    Then it is rejected as StaleWriterError
    And nothing was written

  Scenario: Reopening continues from the durable high-water mark
    When the session is closed and opened again
    And "A" receives the messages "m2"
    Then "m2" is numbered right after the commit of "m1"
    And the transcript of "A" is "m1, m2"
