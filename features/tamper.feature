Feature: Tamper-evident history
  Every commit of a session carries a link in a hash chain: a digest of the link before it
  and of the exact stored events of the commit. Verifying recomputes the chain from the
  stored history alone, so an event edited, removed or inserted behind pico's back is
  found at the commit that held it, and verifying changes nothing. (issue 13)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2, m3"

  Scenario: A session that pico wrote verifies
    When "F" is forked from "A" at entry "m2"
    And the session's history is verified
    Then the verification covers every stored event

  Scenario: An edited event is detected at the commit that held it
    When the stored event of entry "m2" is edited outside pico
    And the session's history is verified
    Then the verification reports that history was changed where entry "m2" was committed
    And verifying stored nothing
    When "A" receives the messages "m4"
    Then the transcript of "A" is "m1, m2, m3, m4"

  Scenario: A removed event is detected at the commit that held it
    When the stored event of entry "m2" is removed outside pico
    And the session's history is verified
    Then the verification reports that history was changed where entry "m2" was committed
