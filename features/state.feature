Feature: Scoped state rewinds with history where it is meant to
  Values and lists live beside the transcript. Rewindable conversation state follows the
  fork boundary; sticky state keeps only its current contents and is copied only when asked;
  working state lives until its scope is retired. (pico v3 §4)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"
    And "plan" is a rewindable conversation value
    And "model" is a sticky conversation value
    And "moves" is a rewindable conversation list
    And "notes" is a sticky conversation list

  Scenario: A rewindable list read through earlier positions
    When "A" appends "A" to "moves"
    And "A" appends "B" to "moves"
    And the current position is remembered as "through B"
    And "A" clears "moves"
    And the current position is remembered as "after the clear"
    And "A" appends "C" to "moves"
    Then "A" read "moves" at position "through B" as ["A", "B"]
    And "A" read "moves" at position "after the clear" as []
    And "A" reads "moves" as ["C"]

  Scenario: Plan mode follows the fork boundary
    Given "A" sets "plan" to false
    And "A" has the messages "m2"
    And "A" sets "plan" to true
    When "B" is forked from "A" at entry "m2"
    Then "B" reads "plan" as false
    And "A" reads "plan" as true
    When "B" deletes "plan"
    Then "B" reads "plan" as absent
    And "A" reads "plan" as true
    When "B" sets "plan" to true
    Then "B" reads "plan" as true

  Scenario: A fork inherits list history but a local clear ends it
    Given "A" appends "A" to "moves"
    And "A" has the messages "m2"
    And "A" appends "late" to "moves"
    When "B" is forked from "A" at entry "m2"
    And "B" appends "B" to "moves"
    Then "B" reads "moves" as ["A", "B"]
    When "B" clears "moves"
    Then "B" reads "moves" as []
    And "A" reads "moves" as ["A", "late"]

  Scenario: Sticky state is copied only when selected, from the current source
    Given "A" sets "model" to "small"
    And "A" appends "remember this" to "notes"
    And "A" sets "model" to "large"
    When "B" is forked from "A" at entry "m1" copying "model"
    And "C" is forked from "A" at entry "m1"
    Then "B" reads "model" as "large"
    And "C" reads "model" as absent
    And "B" reads "notes" as []
    When "A" sets "model" to "medium"
    Then "B" reads "model" as "large"

  Scenario: Sticky lists keep only their current contents
    Given "A" appends "one" to "notes"
    When "A" clears "notes"
    And "A" appends "two" to "notes"
    Then "A" reads "notes" as ["two"]

  Scenario: Working state lives until its scope is retired
    Given the current position is remembered as "before working"
    When task "task-7" records the frames ["token 1", "token 2"]
    Then the frames of task "task-7" are ["token 1", "token 2"]
    And the main history did not advance
    When the session is closed and opened again
    Then the frames of task "task-7" are ["token 1", "token 2"]
    When "A" settles task "task-7" with the answer "final answer"
    Then the frames of task "task-7" are []
    And the context of "A" is "m1, final answer"
    When task "task-7" records the frames ["a new lifetime"]
    Then the frames of task "task-7" are ["a new lifetime"]
