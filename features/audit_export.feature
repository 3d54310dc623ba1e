Feature: The audit export an auditor reads
  An auditor reads every stored event of a session, in the order it was stored, each with
  when it was stored (UTC), who held the session when it was written, and what it says:
  message contents read as the values they are, never as JSON text inside JSON. The export
  can be narrowed to a conversation, a task, event types, a time range or a position range;
  a filter that names nothing pico stores is refused. (issue 13)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2"

  Scenario: Every event is exported in storage order, with who and when
    When the session is closed and opened again
    And "A" receives the messages "m3"
    And the auditor exports the session's history
    Then the export has every stored event once, in storage order
    And every exported event says when it was stored, in UTC
    And "m1, m2" were written by the session's first owner and "m3" by its second
    And the content of message "m2" reads as the text "m2", not as JSON inside JSON

  Scenario: The auditor narrows the export to one conversation
    When "F" is forked from "A" at entry "m1"
    And "F" receives the messages "f1"
    And the auditor exports only the events of conversation "F"
    Then every exported event names conversation "F"
    And the export shows message "f1" and not message "m2"

  Scenario: The auditor narrows the export to a position range
    When the auditor notes the position of the last stored event as "before m3"
    And "A" receives the messages "m3, m4"
    And the auditor exports only the events after position "before m3"
    Then the export shows message "m3" and not message "m2"

  Scenario: An unknown event type is refused
    When the auditor exports only the events of type "Conversation.Appended"
    Then the export is refused, naming "Conversation.Appended"
