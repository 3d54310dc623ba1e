@persistent
Feature: A session moves to another backend unchanged, and its read model is rebuilt from its history
  A session's history is the truth; everything it answers from is derived from it. A
  migrator copies a session to another kind of storage and the copy proves itself equal:
  the same history, byte for byte, the same tamper-evident chain, the same answers. An
  operator whose read model was damaged behind pico's back rebuilds it from the history,
  and the session answers exactly as it did before. (issue 13)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2, m3"

  Scenario Outline: A session is migrated and proves equal
    When "F" is forked from "A" at entry "m2"
    And "A" is compacted through "m2" with summary "s"
    And the session is migrated to <storage>
    Then the migration proves the copy equal
    When the copy is opened in place of the session
    Then the transcript of "A" is "m1, m2, m3, s"
    And the context of "A" is "s, m3"
    And the transcript of "F" is "m1, m2"
    When "A" receives the messages "m4"
    Then the context of "A" is "s, m3, m4"

    Examples:
      | storage    |
      | SQLite     |
      | JSONL      |
      | PostgreSQL |

  Scenario: A copy is never written over an existing session
    When the session is migrated to SQLite
    And the session is migrated to SQLite again
    Then the migration is refused because the target already holds the session

  Scenario: An interrupted migration resumes where it stopped
    When "A" receives the messages "m4, m5, m6"
    And the session's migration to SQLite is interrupted after 2 batches
    And the session is migrated to SQLite
    Then the migration resumed after the interrupted copy and proves the copy equal

  @sql
  Scenario: A damaged read model is rebuilt from its events
    When "F" is forked from "A" at entry "m2"
    And entry "m2" is altered outside pico
    And entries "m1, m3" are lost from the read model outside pico
    And the read model is replayed from the history
    Then the replay lists entry "m2" as differing and entries "m1, m3" as missing
    When the read model is rebuilt from the history
    Then the replay finds the read model equal to its history
    And the transcript of "A" is "m1, m2, m3"
    And the transcript of "F" is "m1, m2"
