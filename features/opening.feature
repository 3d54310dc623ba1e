Feature: Opening a session
  Opening for writing reads the session's stored state first and then claims it; the claim
  lands on the newest commit, so an owner that keeps committing cannot keep a replacement
  out. Opening read-only claims nothing, writes nothing and needs no task definitions.
  (pico v3 §1.2, §6.6; durable state, "Claiming a run")

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"

  @takeover
  Scenario: A second owner gets in although the first commits while it opens
    When a second owner opens the session while the first owner appends "m2" to "A"
    Then the second owner holds the session
    When the first owner tries to append "stale" to "A"
    Then it is rejected as StaleWriterError
    And nothing was written
    And the second owner reads the transcript of "A" as "m1, m2"

  Scenario: An auditor reads waiting agent work without definitions or a model
    Given "A" has accepted the input "later" that no model has answered
    When an auditor opens the session read-only without definitions or a model
    Then the auditor sees 1 live task
    And the auditor reads the transcript of "A" as "m1, later"
    And the auditor's audit log ends at the session head
    And the session head did not move
    And driving through the auditor's handle is rejected as ReadOnlyError
