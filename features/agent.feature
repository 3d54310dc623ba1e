Feature: Agent turns
  A user's input is accepted durably, answered by a generation, and can call tools whose
  results the model sees before it answers. Input that arrives while the agent works waits
  in a queue and is placed at the boundary its mode allows. (pico v3 §8)

  Background:
    Given an agent session with conversation "A"

  Scenario: An idle acceptance is answered
    Given the model will answer "The parser has two problems."
    When the user asks "Inspect the parser" in "A"
    And "A" works until it settles
    Then the drive ends "idle"
    And the answer to "Inspect the parser" is "The parser has two problems."

  Scenario: A two-tool turn
    Given the model will call the tools "read, grep"
    And the model will answer "Both files agree."
    When the user asks "Find the bug" in "A"
    And "A" works until it settles
    Then the tools "read, grep" ran
    And the transcript of "A" has the kinds "user, assistant, tool, tool, assistant"
    And the answer to "Find the bug" is "Both files agree."

  Scenario: A busy acceptance waits for its own answer
    Given the model will answer "first answer"
    And the model will answer "second answer"
    When the user asks "first" in "A"
    And "A" starts working
    And the user asks "second" in "A"
    Then "second" is queued
    When "A" finishes its work
    Then the answer to "first" is "first answer"
    And the answer to "second" is "second answer"

  Scenario: Steering during tool execution joins the current answer
    Given the model will call the tools "read"
    And the model will answer "done, and checked y too"
    When the user asks "check x" in "A"
    And "A" starts working
    And the user steers with "also check y" in "A"
    And "A" finishes its work
    Then "check x" and "also check y" share one answer
    And the model was asked 2 times

  Scenario: A follow-up starts a new group after the answer
    Given the model will answer "answer one"
    And the model will answer "answer two"
    When the user asks "one" in "A"
    And "A" starts working
    And the user follows up with "two" in "A"
    And "A" finishes its work
    Then the answer to "one" is "answer one"
    And the answer to "two" is "answer two"

  Scenario: Input for the next run waits for the next explicit acceptance
    Given the model will answer "answer one"
    And the model will answer "answer two"
    When the user asks "one" in "A"
    And "A" starts working
    And the user leaves for the next run "remember the tests" in "A"
    And "A" finishes its work
    Then "remember the tests" is queued
    When the user asks "two" in "A"
    And "A" works until it settles
    Then "remember the tests" and "two" share one answer

  Scenario: A context-only message never requests a run
    Given the model will answer "noted"
    When the user adds the message "the build uses make" in "A"
    Then "the build uses make" is placed
    When the user asks "what builds it?" in "A"
    And "A" works until it settles
    Then the model was asked 1 times

  Scenario: Aborting a turn cancels its input and publishes no answer
    Given the model will answer "a long answer that never finishes"
    When the user asks "explain everything" in "A"
    And "A" starts working
    And "A" is aborted
    And "A" finishes its work
    Then "explain everything" is cancelled
    And the transcript of "A" has the kinds "user"

  Scenario: An overloaded model is retried on the same generation after its delay
    Given the model will be overloaded once, asking to retry after 30 seconds
    And the model will answer "ok now"
    When the user asks "hello" in "A"
    And "A" works until it settles
    Then the answer to "hello" is "ok now"
    And the model was asked 2 times

  Scenario: A deferred answer waits for permission to poll
    Given the model will answer "worth the wait" later, after 1 poll
    When the user asks "slow question" in "A"
    And "A" works until it settles
    Then the drive ends "suspended"
    And "slow question" is running
    When "A" works until it settles with permission "deferred-poll"
    Then the answer to "slow question" is "worth the wait"
