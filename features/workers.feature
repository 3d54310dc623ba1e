@postgres @workers
Feature: Workers and inboxes
  Many worker processes share one PostgreSQL database, and every session still has exactly
  one writer at a time. A worker picks the sessions that have work due, taking each one's
  lease in the same step, drives them, and releases a session once it has been idle; a
  session whose owner died is taken over once its lease expires. A process that does not
  own a session never writes its events: it leaves a command in the session's inbox, and
  the owner executes it under its request key, so that a retry never applies it twice,
  and replies. An inbox never creates a session.
  (pico v3 §1.2 "One writer per session", §6.6, §8.1; durable state, "Claiming a run";
  issue 16)

  Scenario: An input accepted by an API process is answered by a worker
    Given the session "S" exists
    And the workers' model will answer "Parsing recurses per token."
    And worker "W1" is serving the sessions
    When an API process asks "Why is parsing slow?" in "S"
    Then the inbox replies with the input "Why is parsing slow?" stored in "S"
    And "S" answers "Why is parsing slow?" with "Parsing recurses per token."
    And worker "W1" released "S" as idle
    And no worker holds "S"

  Scenario: Submitting the same request twice stores one input and gives one answer
    Given the session "S" exists
    And the workers' model will answer "Once."
    When an API process asks "Do it" in "S" with the request "req-1"
    And an API process asks "Do it" in "S" with the request "req-1" again
    Then the inbox of "S" holds 1 command
    And the second submission of "Do it" is the first one
    When worker "W1" is serving the sessions
    Then every submission of "Do it" gets the same reply
    And "S" answers "Do it" with "Once."
    When an API process asks "Do it" in "S" with the request "req-1" again
    Then every submission of "Do it" gets the same reply
    And the stored conversation of "S" is "user: Do it; assistant: Once."
    And the workers' model was asked 1 time

  Scenario Outline: Reusing a request key for a different command is refused and stores nothing
    Given the session "S" exists
    And the workers' model will answer "Only the first."
    When an API process asks "First question" in "S" with the request "req-1"
    And an API process tries to <how> "<text>" in "S" with the request "req-1"
    Then it is rejected as RequestKeyConflictError
    And the inbox of "S" holds 1 command
    When worker "W1" is serving the sessions
    Then "S" answers "First question" with "Only the first."
    And the stored conversation of "S" is "user: First question; assistant: Only the first."

    Examples:
      | how        | text             |
      | ask        | Another question |
      | steer with | First question   |

  Scenario: A command for an unknown session is refused and creates nothing
    When an API process tries to ask "Anyone there?" in "Nowhere"
    Then it is rejected as UnknownSessionError
    And "Nowhere" does not exist and nothing waits for it

  Scenario: A worker releases an idle session and another worker takes it next time
    Given the session "S" exists
    And the workers' model will answer "First answer."
    And the workers' model will answer "Second answer."
    And worker "W1" is serving the sessions under leases of 60 seconds
    When an API process asks "First" in "S"
    Then "S" answers "First" with "First answer."
    And worker "W1" released "S" as idle
    And no worker holds "S"
    When worker "W1" stops
    And worker "W2" is serving the sessions
    And an API process asks "Second" in "S"
    Then "S" answers "Second" with "Second answer."
    And worker "W2" released "S" as idle
    And worker "W1" took "S" 1 time
    And worker "W2" took "S" 1 time

  Scenario: Two workers never hold the same session at once, and every session is served
    Given the sessions "A, B, C, D, E, F" exist
    And the workers' model will call the tool "rendezvous" 4 times
    And the workers' model will answer "Served." 6 times
    When an API process asks "Serve me" in each of "A, B, C, D, E, F"
    And workers "W1, W2", each holding 2 sessions at a time, start serving at the same moment
    Then 4 sessions wait at the rendezvous at once
    And "W1" and "W2" each hold 2 of them under their own leases, none held by both
    When the rendezvous opens
    Then each of "A, B, C, D, E, F" answers "Serve me" with "Served."
    And each of "A, B, C, D, E, F" was taken by exactly one worker, once, and released as idle
    And the workers' model was asked 10 times

  Scenario: A session whose owner died is taken over after its lease expires
    Given the session "S" exists
    And the workers' model will answer "Back again."
    And the owner of "S" died holding its lease
    And worker "W1" is serving the sessions
    When an API process asks "Are you there?" in "S"
    Then no worker replies to "Are you there?" within 2 seconds
    And the lease of "S" still names the dead owner
    When the dead owner's lease of "S" expires
    Then the inbox replies with the input "Are you there?" stored in "S"
    And "S" answers "Are you there?" with "Back again."
    And worker "W1" took "S" 1 time
    And worker "W1" released "S" as idle

  Scenario: An approval decided through the inbox lets the held tool run and the turn finish
    Given the session "S" exists
    And the sessions' tool calls need approval
    And the workers' model will call the tool "read" with {"path": "notes.txt"}
    And the workers' model will answer "Read it."
    And worker "W1" is serving the sessions
    When an API process asks "Read my notes" in "S"
    Then an approval waits for a decision in "S"
    And the workers ran no tool
    When an API process grants the waiting approval of "S"
    Then the inbox replies with the id of that approval
    And "S" answers "Read my notes" with "Read it."
    And the workers ran the tool "read" with {"path": "notes.txt"}
    And no approval waits in "S"
