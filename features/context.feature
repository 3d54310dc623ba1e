Feature: Context selects from the transcript
  A conversation keeps every entry it was given. Its context is the selection the model
  sees: compaction and reset change the selection, never the transcript. (pico v3 §2.3)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2, m3, m4"

  Scenario: Compaction replaces a prefix of the context with a summary
    When "A" is compacted through "m2" with summary "s1"
    Then the transcript of "A" is "m1, m2, m3, m4, s1"
    And the context of "A" is "s1, m3, m4"

  Scenario: Repeated compaction summarizes the previous summary too
    When "A" is compacted through "m2" with summary "s1"
    And "A" is compacted through "m3" with summary "s2"
    Then the context of "A" is "s2, m4"
    And the transcript of "A" is "m1, m2, m3, m4, s1, s2"

  Scenario: A handoff resets the context but keeps the transcript
    When "A" is compacted through "m2" with summary "s1"
    And "A" hands off with "h1"
    Then the transcript of "A" is "m1, m2, m3, m4, s1, h1"
    And the context of "A" is "h1"

  Scenario: Resetting to nothing leaves an empty context and the same transcript
    When the context of "A" is reset to nothing
    Then the context of "A" is empty
    And the transcript of "A" is "m1, m2, m3, m4"

  Scenario: An entry already selected cannot be selected again
    When "A" tries to select "m2"
    Then it is rejected as ContextEditError
    And nothing was written
    And the context of "A" is "m1, m2, m3, m4"

  Scenario: A note can be in the transcript without being in context
    Given "A" has the note "n1" that is not in context
    Then the transcript of "A" is "m1, m2, m3, m4, n1"
    And the context of "A" is "m1, m2, m3, m4"

  Scenario: Compaction never separates a tool call from its results
    When "A" receives an assistant message "call" calling tools "read, grep"
    And "A" receives the tool result "r-grep" for call "grep"
    And "A" receives the tool result "r-read" for call "read"
    And "A" tries to compact through "call"
    Then it is rejected as ExchangeSplitError
    And nothing was written
    When "A" is compacted through "r-read" with summary "s1"
    Then the context of "A" is "s1"

  Scenario: No reset while a tool call is unanswered
    When "A" receives an assistant message "call" calling tools "read"
    And "A" tries to reset its context to "m1"
    Then it is rejected as ExchangeSplitError
    And nothing was written
