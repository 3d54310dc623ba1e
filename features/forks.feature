Feature: Forks share history, not future changes
  A historical fork starts a new conversation at a past position. It shares the source's
  transcript up to that position without copying it, starts from the context that existed
  there, and from then on the two never affect each other. (pico v3 §2.4, §3.3, §7.7)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2"
    And the current position is remembered as "P"
    And "A" has the messages "m3, m4"

  Scenario: A fork shares the transcript prefix without copying it
    When "B" is forked from "A" at entry "m2"
    And "B" receives the messages "b1, b2"
    Then the transcript of "B" is "m1, m2, b1, b2"
    And entries "m1, m2" still belong to "A"
    And the transcript of "A" is "m1, m2, m3, m4"

  Scenario: A fork starts from the context that existed then, not today's context filtered
    When "A" is compacted through "m3" with summary "s1"
    And "A" hands off with "h1"
    And "B" is forked from "A" at position "P"
    Then the context of "B" is "m1, m2"
    And the context of "A" is "h1"
    And the context of "A" at position "P" was "m1, m2"

  Scenario: Later edits on either side never affect the other
    When "B" is forked from "A" at entry "m2"
    And the context of "A" is reset to nothing
    And "B" is compacted through "m2" with summary "sb"
    Then the context of "A" is empty
    And the context of "B" is "sb"
    And the transcript of "A" is "m1, m2, m3, m4"

  Scenario: A fork of a fork sees each ancestor only up to its own boundary
    When "B" is forked from "A" at entry "m2"
    And "B" receives the messages "b1, b2"
    And "C" is forked from "B" at entry "b1"
    And "C" receives the messages "c1"
    Then the transcript of "C" is "m1, m2, b1, c1"
    And the context of "C" is "m1, m2, b1, c1"

  Scenario: A fork cannot start in the middle of a tool exchange
    When "A" receives an assistant message "call" calling tools "read"
    And "X" tries to fork from "A" at entry "call"
    Then it is rejected as InvalidPositionError
    And nothing was written
