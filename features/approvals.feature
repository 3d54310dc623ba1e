Feature: Approving held tool calls
  A policy may hold a tool call until a person decides. The held call waits on an approval,
  which is durable work of its own: it can be listed, it survives a restart and nothing
  ever approves it automatically. Approving runs the call with the arguments that were
  approved; denying gives the call its denial as its result, which the result hooks see
  like any other result. Once the work is cancelled, a decision comes too late.
  (pico v3 §8.6, §6.4)

  Scenario: Approving a held tool call runs it with the approved arguments
    Given an agent session with conversation "A" whose tool calls need approval
    And the policy asks to approve the arguments {"path": "safe.txt"}
    And the model will call the tools "read"
    And the model will answer "Read it."
    When the user asks "Read the file" in "A"
    And "A" works until it settles
    Then 1 approval is waiting for a decision
    And no tool ran
    When the waiting approval is granted
    And "A" works until it settles
    Then the tool "read" ran with {"path": "safe.txt"}
    And the result of the call in "A" is "read safe.txt"
    And no approval is waiting for a decision
    And the answer to "Read the file" is "Read it."

  Scenario: Denying a held tool call writes its denial as the tool's result
    Given an agent session with conversation "A" whose tool calls need approval
    And the model will call the tools "read"
    And the model will answer "I was not allowed to read it."
    When the user asks "Read the file" in "A"
    And "A" works until it settles
    Then 1 approval is waiting for a decision
    When the waiting approval is denied
    And "A" works until it settles
    Then no tool ran
    And the result hook processed "denied by approval"
    And the result of the call in "A" is the error "denied by approval"
    And the answer to "Read the file" is "I was not allowed to read it."

  Scenario: A decision after cancellation is refused
    Given an agent session with conversation "A" whose tool calls need approval
    And the model will call the tools "read"
    When the user asks "Read the file" in "A"
    And "A" works until it settles
    Then 1 approval is waiting for a decision
    When "A" is aborted
    And the approval is granted after the cancellation
    Then it is rejected as CommandRejectedError
    And nothing was written
    When "A" works until it settles
    Then no approval is waiting for a decision
    And no tool ran
    And the result of the call in "A" is the error "aborted"

  Scenario: Pending approvals survive a restart
    Given an agent session with conversation "A" whose tool calls need approval
    And the model will call the tools "read"
    And the model will answer "Read it after the restart."
    When the user asks "Read the file" in "A"
    And "A" works until it settles
    Then 1 approval is waiting for a decision
    When the agent session is closed and opened again
    And "A" works until it settles
    Then 1 approval is waiting for a decision
    And no tool ran
    When the waiting approval is granted
    And "A" works until it settles
    Then the tool "read" ran with {}
    And the answer to "Read the file" is "Read it after the restart."
