Feature: Bad input is refused and nothing changes
  A durable harness stores exactly what it was given or nothing at all. A value that is
  not JSON, an id that is not an id, a position that is not in the context: each is refused
  with an error that names what was wrong, nothing is written, and the session goes on
  working as before. (pico v3 §4.1, §3.1)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"
    And "plan" is a sticky conversation value

  Scenario Outline: A value that is not JSON is refused and nothing changes
    When "A" tries to set "plan" to <value>
    Then it is rejected as InvalidJsonError
    And the error names "<where>"
    And nothing was written
    And "A" reads "plan" as absent
    When "A" receives the messages "m2"
    Then the transcript of "A" is "m1, m2"

    Examples:
      | value                                  | where                 |
      | not a number                           | nan                   |
      | infinity                               | inf                   |
      | a pair of numbers                      | tuple                 |
      | a set of numbers                       | set                   |
      | raw bytes                              | bytes                 |
      | a decimal number                       | Decimal               |
      | an object whose key is a number        | object key 1          |
      | an object holding a lone surrogate     | lone surrogate        |
      | a list nested 201 levels deep          | deeper than 200       |

  Scenario Outline: A message that is not JSON is refused and nothing changes
    When "A" tries to receive a message with <value>
    Then it is rejected as InvalidJsonError
    And nothing was written
    And the transcript of "A" is "m1"

    Examples:
      | value                                  |
      | not a number                           |
      | a lone surrogate in its text           |
      | metadata that is a list                |
      | metadata holding a lone surrogate key  |

  Scenario Outline: An id that is not an id is refused, on every backend the same way
    When "A" tries to compact through the id <id>
    Then it is rejected as InvalidArgumentError
    And the error names "through"
    And nothing was written
    And the context of "A" is "m1"

    Examples:
      | id                    |
      | true                  |
      | 1.0                   |
      | "1"                   |
      | 0                     |
      | -1                    |
      | 9223372036854775808   |

  Scenario: A well-formed id that does not exist is simply not found
    Then the entry numbered 9223372036854775807 is not found
    And the task numbered 9223372036854775807 is not found

  Scenario: Compacting through an entry that is not in the context is not a stale prefix
    Given "A" has the note "n1" that is not in context
    When "A" tries to compact through "n1"
    Then it is rejected as NotInContextError
    And nothing was written
    And the context of "A" is "m1"
