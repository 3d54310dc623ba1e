Feature: Shutdown and abort
  Shutting a session down refuses new commands, cancels all live work and every queued
  input whatever its mode, waits until the cancellation has settled, then closes. Every
  input stays in the transcript. Aborting a turn cancels the steering and follow-ups
  waiting for it, in the conversations its work owns too, and keeps notes and input for
  the next run. (pico v3 §6.4, §6.6, §8.2)

  Background:
    Given an agent session with conversation "A"

  Scenario: Shutdown cancels the turn and every queued input, and keeps them in the transcript
    Given the model will call the tools "read"
    When the user asks "check x" in "A"
    And "A" starts working
    And the user steers with "also y" in "A"
    And the user follows up with "then z" in "A"
    And the user leaves for the next run "tomorrow" in "A"
    And the user adds the message "a note" in "A"
    And the session shuts down and is opened again
    Then "check x" is cancelled
    And "also y" was cancelled by the shutdown
    And "then z" was cancelled by the shutdown
    And "tomorrow" was cancelled by the shutdown
    And "a note" was cancelled by the shutdown
    And no work is left in the session
    And the transcript of "A" has the kinds "user, assistant, user, user, user, user, tool"

  Scenario: New input is refused while the session shuts down
    Given the model will call the tools "read"
    When the user asks "check x" in "A"
    And "A" starts working
    And the session starts shutting down
    And the user tries to ask "one more thing" in "A"
    Then it is rejected as ShuttingDownError
    When the shutdown finishes and the session is opened again
    Then "check x" is cancelled
    And no work is left in the session
    And the transcript of "A" has the kinds "user, assistant, tool"

  Scenario: Aborting a turn cancels the steering of the subagent it started, not its notes
    Given the model will call the tools "read"
    And the model will answer "a long answer from the subagent"
    When the user asks "delegate it" in "A"
    And "A" starts working
    And the running tool of "A" starts a subagent conversation "B" asked "sub task"
    And the user steers with "also y" in "A"
    And the user adds the message "a note" in "A"
    And the user steers with "sub steer" in "B"
    And the user follows up with "sub follow" in "B"
    And the user leaves for the next run "sub tomorrow" in "B"
    And the user adds the message "sub note" in "B"
    And "A" is aborted
    And "A" finishes its work
    Then the drive ends "idle"
    And "delegate it" is cancelled
    And "sub task" is cancelled
    And "also y" is cancelled
    And "sub steer" is cancelled
    And "sub follow" is cancelled
    And "a note" is queued
    And "sub tomorrow" is queued
    And "sub note" is queued
