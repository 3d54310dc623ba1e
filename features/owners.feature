Feature: One writer per session
  Opening a session for writing claims it. On a database, a previous owner that still
  believes it holds the session is refused at its next commit, and nothing of that commit
  is stored. A JSONL session is held with a lock for as long as its writer keeps it open: a
  second writer is refused before it writes anything, and gets in once the first has gone.
  (pico v3 §1.2, §3.5, §7.5; durable state, "Claiming a run")

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"

  @takeover
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

  @exclusive
  Scenario: A second writer is refused while the first holds a JSONL session
    When a second owner tries to open the session
    Then it is rejected as SessionLockedError
    And nothing was written
    When "A" receives the messages "m2"
    And the session is closed and opened again
    Then the transcript of "A" is "m1, m2"
