Feature: Delegating a tool call to a subagent
  A tool can hand its call to a subagent instead of answering itself; pico ships a ready
  "subagent" tool for this. In the foreground, the call waits for the subagent and its
  result is the subagent's final answer: the turn cannot finish before it. In the
  background, the call's result names the subagent at once and the turn goes on while the
  subagent works. Either way the subagent is started in the same step that moves the call
  on, so a restart finds one or the other, never half of it. (pico v3 §5.5, §5.6, §9.3)

  Background:
    Given an agent session with conversation "P" that can delegate to subagents

  Scenario: A tool call delegated to a subagent finishes with the subagent's answer
    Given the model will delegate "Inspect only tests" to a subagent
    And the model will answer "the tests pass"
    And the model will answer "all done"
    When the user asks "check the tests" in "P"
    And "P" works until it settles
    Then the subagent call in "P" returned "the tests pass"
    And the subagent delegated by "P" is done with the answer "the tests pass"
    And the answer to "check the tests" is "all done"

  Scenario: A tool call delegated to a background subagent returns at once and the turn goes on
    Given the model will delegate "Inspect only tests" to a background subagent
    And the model will answer the subagent "the tests pass" and "P" "started it"
    When the user asks "check the tests" in "P"
    And the session works until it settles
    Then the subagent call in "P" returned at once, naming its subagent
    And the answer to "check the tests" is "started it"
    And the subagent delegated by "P" is done with the answer "the tests pass"
