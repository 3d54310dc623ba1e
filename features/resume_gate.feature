Feature: The resume gate
  A session opened for agent work records the configuration its work is written under:
  the model and provider, the system prompt (as a hash, never the text), the offered tools
  and the retry and context budgets. Reopening it under a different configuration does
  what the changed field's class says, and every change accepted is an event an auditor
  sees. (seed 000, issue 13)

  Scenario: A changed model refuses to resume
    Given an agent session working with model "m1" and system prompt "Be brief."
    When the session is reopened with model "m2"
    Then the reopening is refused naming the field "model"
    And nothing was written to the session
    And the session still reopens with model "m1"

  Scenario: A changed system prompt waits for acknowledgement
    Given an agent session working with model "m1" and system prompt "Be brief."
    When the session is reopened with system prompt "Be thorough." and the user asks "hello"
    Then no work runs and the model is not asked
    When the configuration change is acknowledged
    Then the auditor sees the change of "system" acknowledged
    And the user's question is answered

  Scenario: A removed tool gives an error result
    Given an agent session whose model calls the tools "ask" and then "write"
    And the call of "ask" waits for an answer from outside
    When the session is reopened without the tool "write"
    And the call of "ask" is answered
    Then the call of "write" gets an error result saying it is no longer offered
    And the removed tool "write" was never invoked
    And the auditor sees the change of "tool:write" accepted automatically

  Scenario: A larger retry budget applies to new attempts
    Given an agent session allowing 2 attempts per answer whose model was busy once
    When the session is reopened allowing 4 attempts while the model stays busy 3 more times
    Then the answer fails after 4 attempts in all
    And the auditor sees the change of "max_attempts" accepted automatically
