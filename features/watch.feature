Feature: Watching a conversation
  A watcher first receives the conversation as it is committed: the newest transcript
  entries, its live work and its queued input. Then it receives every new commit that
  touches the conversation, once, in order and whole: the entries one command appended
  arrive together, and commits of other conversations are left out. A watch registered
  while a command is being committed sees that command exactly once: either in its first
  view or as a new commit, never both and never neither. A watcher that falls behind is
  told to rebind and starts again from a fresh view; a watcher that fails never undoes a
  commit. (pico v3 §9.4, §10.2 "Watch registration races a commit")

  Background:
    Given a session with conversation "A"
    And the session has another conversation "B"
    And "A" has the messages "hello, hi"

  Scenario: A watcher sees the transcript, then each new commit whole
    When "W" watches "A"
    Then "W" first sees the transcript "hello, hi"
    When one command appends "q1, q2" to "A" and selects them
    And "B" receives the messages "elsewhere"
    And "A" receives the messages "q3"
    Then "W" saw the commits "q1 + q2; q3"

  Scenario: A watch registered while a commit is in flight sees it exactly once
    Given a command appending "racing" to "A" is being committed
    When "W" watches "A"
    Then "W" first sees the transcript "hello, hi"
    When the command being committed completes
    And "A" receives the messages "after"
    Then "W" saw the commits "racing; after"

  Scenario: A watch registered just after a commit has it in its first view only
    Given a command appending "racing" to "A" is being committed
    When the command being committed completes
    And "W" watches "A"
    Then "W" first sees the transcript "hello, hi, racing"
    When "A" receives the messages "after"
    Then "W" saw the commits "after"

  Scenario: A slow watcher is told to rebind, and a new watch starts from everything
    When "S" watches "A" without reading, with room for 3 events
    And "A" receives the messages "m1, m2, m3, m4"
    Then "S" saw the commits "m1; m2" and was told to rebind
    When "T" watches "A"
    Then "T" first sees the transcript "hello, hi, m1, m2, m3, m4"

  Scenario: A failing watcher does not undo the commit
    When "F" watches "A" and fails on every commit
    And "A" receives the messages "kept"
    Then "F" was told that it failed
    And the transcript of "A" is "hello, hi, kept"
    When "A" receives the messages "also kept"
    Then "F" saw the commits "kept; also kept"
