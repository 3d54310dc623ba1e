Feature: Subagents
  A conversation can hand a task to a subagent: a child conversation of its own, owned by
  one piece of work in the parent (the subagent task). Starting one is a single step that
  creates the task, the child, the values it starts with, its prompt and its first model
  request together; nothing runs before that step is stored. The child starts with only
  the values it was given, and with a fresh context or the parent's conversation so far.
  The child's final answer completes its subagent task, which keeps a reference to the
  answer. A subagent started directly works in the background: the parent's own work does
  not wait for it, and cancelling the parent's turn does not stop it; it is cancelled on its
  own. (pico v3 §4.3, §5.6, §5.7, §6.4, §6.5, §8.6, §9.1)

  Background:
    Given an agent session with conversation "A"
    And "model" is a sticky conversation value
    And "plan" is a sticky conversation value
    And "mode" is a sticky conversation value
    And "A" sets "model" to "large"
    And "A" sets "mode" to "planning"

  Scenario: A subagent starts with its prompt and only the values it is given
    When "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests", copying "model" and setting "plan" to "tests first"
    Then subagent "S" is waiting for "C"
    And "C" is owned by subagent "S"
    And the context of "C" is "Inspect only tests"
    And "C" reads "model" as "large"
    And "C" reads "plan" as "tests first"
    And "C" reads "mode" as absent
    And nothing ran yet

  Scenario: The child's final answer completes its subagent with a reference to the answer
    Given the model will answer "the tests pass"
    When "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests"
    And the session works until it settles
    Then subagent "S" is done with the answer "the tests pass" from "C"
    And the context of "A" is empty

  Scenario: A subagent can start from the parent's conversation so far
    Given the model will answer "hi there"
    And the model will answer "the tests pass"
    When the user asks "hello" in "A"
    And "A" works until it settles
    And "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests", inheriting the context
    Then the context of "C" starts with the context of "A"
    When the session works until it settles
    Then subagent "S" is done with the answer "the tests pass" from "C"

  Scenario: Cancelling a subagent stops its child and records the cancellation
    Given the model will answer "a long answer that is never finished"
    When "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests"
    And the session starts working
    And subagent "S" is cancelled from "A"
    And the session finishes its work
    Then subagent "S" was cancelled
    And "C" has no work left
    And the transcript of "C" has the kinds "user"

  Scenario: Cancelling the parent's turn leaves a background subagent working
    Given the model will answer "the tests pass"
    When "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests"
    And the session starts working
    And the user cancels the work of "A"
    Then nothing was marked for cancellation
    When the session finishes its work
    Then subagent "S" is done with the answer "the tests pass" from "C"

  Scenario: A subagent survives a restart before its child answers
    Given the model will answer "the tests pass"
    When "A" starts the subagent "S" in conversation "C" with the prompt "Inspect only tests"
    And the agent session restarts
    And the session works until it settles
    Then subagent "S" is done with the answer "the tests pass" from "C"
