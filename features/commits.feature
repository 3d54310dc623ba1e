Feature: Ids are allocated per command, and a commit is the unit of history
  Every mutation takes the next number of one session-wide sequence while its command is
  being built. A command that fails takes none. A fork selects a whole commit, never part
  of one. (pico v3 §3.1, §3.3)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"

  Scenario: One command numbers its mutations consecutively
    When one command appends "x, y" to "A" and selects them
    Then "y" is numbered right after "x"
    And the commit of "x" ends at 1 after "y"
    And the commit of "y" ends at 1 after "y"

  Scenario: A rejected command consumes no number
    When one command appends "x, y" to "A" and selects them
    And a command that appends "lost" to "A" fails
    And "A" receives the messages "w"
    Then "w" is numbered right after the commit of "x"
    And the transcript of "A" is "m1, x, y, w"

  Scenario: Forking at either entry of one commit selects the same snapshot
    When one command appends "x, y" to "A" and selects them
    And "A" receives the messages "later"
    And "F1" is forked from "A" at entry "x"
    And "F2" is forked from "A" at entry "y"
    Then "F1" and "F2" start from the same snapshot
    And "F1" was forked from "A" after the commit of "y"
    And the context of "F1" is "m1, x, y"

  Scenario: A position inside a commit is not a fork target
    When one command appends "x, y" to "A" and selects them
    And a fork of "A" is attempted at the sequence number of "x"
    Then it is rejected as InvalidPositionError
    And nothing was written
