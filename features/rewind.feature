Feature: Rewinding a conversation
  Rewinding goes back to an earlier point of a conversation: the work it is doing now is
  stopped and its cleanup finishes first, then a fork starts from that point with the
  context and remembered state it had there. The target is checked before anything is
  stopped, so a wrong target stops nothing. Keeping the work running forks without
  stopping anything. (pico v3 §9.1, §6.4, §3.3)

  Background:
    Given an agent session with conversation "A"

  Scenario: Rewinding a working conversation stops its turn, then forks at the target
    Given the model will answer "hi there"
    And the model will call the tools "read"
    When the user asks "hello" in "A"
    And "A" works until it settles
    And the user asks "check x" in "A"
    And "A" starts working
    And "A" is rewound to entry "hello" as "B"
    Then "check x" is cancelled
    And "A" has no work left
    And the work of "A" had settled before "B" was made
    And "B" was forked from "A" after the commit of "hello"
    And the context of "B" is "hello"
    And "B" has no work left

  Scenario: Rewinding while keeping the work running stops nothing
    Given the model will call the tools "read"
    And the model will answer "all read"
    When the user asks "check x" in "A"
    And "A" starts working
    And "A" is rewound to entry "check x" as "B", keeping its work running
    Then nothing in "A" is marked for cancellation
    And the context of "B" is "check x"
    When "A" finishes its work
    Then the answer to "check x" is "all read"

  Scenario: Rewinding to a point inside a commit is refused and stops nothing
    Given the model will call the tools "read"
    And the model will answer "all read"
    When the user asks "check x" in "A"
    And "A" starts working
    And "A" tries to rewind to the sequence number of "check x"
    Then it is rejected as InvalidPositionError
    And nothing was written
    And nothing in "A" is marked for cancellation
    When "A" finishes its work
    Then the answer to "check x" is "all read"

  Scenario: Rewinding an idle conversation is a fork
    Given the model will answer "hi there"
    When the user asks "hello" in "A"
    And "A" works until it settles
    And "A" is rewound to entry "hello" as "B"
    And "C" is forked from "A" at entry "hello"
    Then "B" and "C" start from the same snapshot
    And "hello" is done
