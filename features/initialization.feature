Feature: A fork starts with the sticky state it is given
  A fork inherits rewindable state through its boundary by itself. Sticky state is
  different: a fork starts with none of it, unless it is told which values to copy from
  the source as the source is now, and which values to start with instead. Values are
  copied, not linked; lists are never copied by accident. (pico v3 §4.3, §9.1)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1"
    And "model" is a sticky conversation value
    And "thinking" is a sticky conversation value
    And "tools" is a sticky conversation value
    And "notes" is a sticky conversation list
    And "plan" is a rewindable conversation value
    And "A" sets "model" to "small"
    And "A" sets "thinking" to "low"

  Scenario: Selected values are copied from the source as it is now, then overridden
    Given "A" sets "model" to "large"
    When a fork initialization copies "model, thinking"
    And the initialization sets "thinking" to "high"
    And the initialization sets "tools" to ["read", "grep"]
    And "B" is forked from "A" at entry "m1" with that initialization
    Then "B" reads "model" as "large"
    And "B" reads "thinking" as "high"
    And "B" reads "tools" as ["read", "grep"]
    And "A" reads "thinking" as "low"
    And "A" reads "tools" as absent
    When "A" sets "model" to "medium"
    Then "B" reads "model" as "large"

  Scenario: Values given alone start the fork, and nothing else is copied
    When the initialization sets "model" to "tiny"
    And "B" is forked from "A" at entry "m1" with that initialization
    Then "B" reads "model" as "tiny"
    And "B" reads "thinking" as absent
    When "A" sets "thinking" to "max"
    Then "B" reads "thinking" as absent

  Scenario: A selected value the source does not have stays absent
    When "A" deletes "thinking"
    And a fork initialization copies "thinking, tools"
    And "B" is forked from "A" at entry "m1" with that initialization
    Then "B" reads "thinking" as absent
    And "B" reads "tools" as absent

  Scenario: A value that is not JSON is refused and nothing is written
    When the initialization sets "tools" to NaN
    And a fork of "A" at entry "m1" with that initialization is attempted
    Then it is rejected as InvalidJsonError
    And nothing was written

  Scenario Outline: A fork does not initialize <what>
    When a fork initialization copies "<name>"
    And a fork of "A" at entry "m1" with that initialization is attempted
    Then it is rejected as AddressPolicyError
    And nothing was written

    Examples:
      | what                                         | name  |
      | a list                                       | notes |
      | a rewindable value, which it inherits anyway | plan  |
