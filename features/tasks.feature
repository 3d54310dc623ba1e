Feature: Durable tasks and the scheduler
  Work is stored as tasks. A drive executes what is ready in its scope, waits for timers,
  and reports when the rest needs an outside event. Cancellation first selects work
  durably, then a drive performs each task's cleanup. (pico v3 §5, §6)

  Background:
    Given a session with conversation "A"

  Scenario: Dependencies mean terminal, not successful
    Given "A" has a task "first" that has failed
    And "A" has a task "second" that is done
    And "A" has a background task "watch" that waits for the outside
    And "A" has a foreground task "next" that runs after "first, second"
    And "A" has a background task "later" that runs after "watch"
    When the session is driven
    Then the drive ends "suspended"
    And task "next" has run
    And task "later" has not run
    And task "next" is "done"

  Scenario: A parent waits durably for its subagent, across a restart
    Given "A" has a foreground task "tool" that delegates to a subagent whose work needs permission "child-may-run"
    When "A" is driven
    Then the drive ends "suspended"
    And task "tool" waits durably for its subagent
    When the session is closed and opened again
    And "A" is driven with permission "child-may-run"
    Then the drive ends "idle"
    And task "tool" is "done"
    And task "tool" has the subagent's answer

  Scenario: Abort selects the required foreground work, then a drive cleans it up
    Given "A" has a background task "dep" that waits for the outside
    And "A" has a foreground task "fg" that runs after "dep"
    And "A" has a background task "bg" that waits for the outside
    When "A" is aborted
    Then tasks "dep, fg" are marked for cancellation
    And task "bg" is not marked for cancellation
    When "A" is driven
    Then the drive ends "idle"
    And tasks "dep, fg" are "aborted"
    And task "bg" is "waiting"
