Feature: Checking a stored session finds damage that nothing else would notice
  An operator can verify a session on demand: every stored event still reads, no event is
  missing from any conversation's history, and every transcript, context and value the
  session answers from is exactly what replaying its history gives. Checking only reads:
  it changes nothing and the owner keeps working. (issue 10, "Damaged files")

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2, m3"

  Scenario: A session that pico wrote checks clean
    When "F" is forked from "A" at entry "m2"
    And "A" is compacted through "m2" with summary "s"
    And the session is checked
    Then the check finds nothing wrong

  Scenario: An entry altered outside pico is reported by its id, and checking changes nothing
    When entry "m2" is altered outside pico
    And the session is checked
    Then the check reports that entry "m2" differs from its history
    And checking stored nothing
    When "A" receives the messages "m4"
    Then the transcript of "A" is "m1, m2, m3, m4"

  Scenario: A lost event is reported as a gap in the conversation's history
    When an event of "A" is lost outside pico
    And the session is checked
    Then the check reports a gap in the history of "A"
