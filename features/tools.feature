Feature: Tool calls one after another
  The tool calls of one model response run at the same time unless the session asks for
  them one after another, or a tool must run alone. Then each call waits until the call
  before it has finished — whether it succeeded or failed — and the model sees every
  result before it answers. (pico v3 §5.4)

  Scenario: Tool calls run one after another in the order the model made them
    Given an agent session with conversation "A" whose tool calls run one after another
    And the model will call the tools "read, grep, edit"
    And the model will answer "All three, in order."
    When the user asks "Fix the parser" in "A"
    And "A" works until it settles
    Then the tools ran one after another in the order "read, grep, edit"
    And the transcript of "A" has the kinds "user, assistant, tool, tool, tool, assistant"
    And the answer to "Fix the parser" is "All three, in order."

  Scenario: A tool that runs alone waits for the calls before it and holds back the ones after
    Given an agent session with conversation "A" whose tool "edit" runs alone
    And the model will call the tools "read, grep, edit, read"
    And the model will answer "Edited between the reads."
    When the user asks "Edit safely" in "A"
    And "A" works until it settles
    Then "read" and "grep" ran at the same time
    And "edit" started after "read" finished
    And "edit" started after "grep" finished
    And every tool call of "A" has a result
    And the answer to "Edit safely" is "Edited between the reads."

  Scenario: A failed call does not stop the calls after it
    Given an agent session with conversation "A" whose tool calls run one after another
    And the tool "read" will fail
    And the model will call the tools "read, grep"
    And the model will answer "read broke, grep worked."
    When the user asks "Try both" in "A"
    And "A" works until it settles
    Then the tools ran one after another in the order "read, grep"
    And every tool call of "A" has a result
    And the answer to "Try both" is "read broke, grep worked."

  Scenario: Aborting during the first call cancels the calls still waiting and the turn
    Given an agent session with conversation "A" whose tool calls run one after another
    And the model will call the tools "read, grep"
    And the model will answer "never said"
    When the user asks "Go" in "A"
    And "A" starts working
    And "A" is aborted
    And "A" finishes its work
    Then "Go" is cancelled
    And the tool "grep" never ran
    And every tool call of "A" has a result
    And the model was asked 1 times
