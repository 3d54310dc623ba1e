Feature: A JSONL session survives a crash in the middle of a write
  A JSONL session is a journal of plain lines, one per commit. A commit whose line a crash
  cut short was never made: opening drops that half line alone and the session continues.
  A complete line that is damaged is never dropped: opening refuses the session, names the
  line, and leaves every byte as it was. A task's working records live in their own file;
  once the task is settled they are gone, even when that file could not be removed, and a
  later task of the same name keeps its own records.
  (pico v3 §1.4, §4.6, §7.5, §10.2)

  Background:
    Given a session with conversation "A"
    And "A" has the messages "m1, m2"

  @exclusive
  Scenario: A commit cut short by a crash is dropped alone
    When the session stops while "m3" is half written to "A"
    Then the transcript of "A" is "m1, m2"
    When "A" receives the messages "m4"
    And the session is closed and opened again
    Then the transcript of "A" is "m1, m2, m4"

  @exclusive
  Scenario: A damaged complete line refuses the session and changes nothing
    When "A" receives the messages "m3"
    And the journal line holding "m2" is damaged
    And the session is opened again
    Then it is rejected as StorageCorruptError
    And the journal files are unchanged
    And opening it for reading only is rejected as StorageCorruptError too
    And the journal files are unchanged

  @exclusive
  Scenario: A settled task's records stay gone when their file could not be removed
    When task "t1" records the frames ["a", "b"]
    And "A" settles task "t1" with the answer "done" while its file cannot be removed
    Then the frames of task "t1" are []
    When the session is closed and opened again
    Then the frames of task "t1" are []
    And no file of task "t1" is left

  @exclusive
  Scenario: A task name used again keeps the new records when the old file lingers
    When task "t1" records the frames ["old"]
    And "A" settles task "t1" with the answer "done" while its file cannot be removed
    And task "t1" records the frames ["new"]
    And the session is closed and opened again
    Then the frames of task "t1" are ["new"]
