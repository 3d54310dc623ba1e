Feature: Jobs
  A job is an operating-system process a conversation starts: a build, a test suite, a
  crawler. Before the process starts, the session stores how it will be recognised and
  where its output goes; once it runs, the session stores which process it is; when it
  ends, one step stores how it ended (its exit code or signal and the end of its output).
  A job works in the background: the conversation's own work does not wait for it, and it
  is cancelled on its own. A job outlives the harness that started it: the next owner of
  the session adopts the same process instead of starting a second one. An agent's tool can
  hand its call to a job in the background: the call's result names the job at once, and
  the job's end is recorded later. (pico v3 §5.1, §5.6, §8.7, §9.3)

  Scenario: A job runs to its end and its result is recorded
    Given a job session with conversation "A"
    When "A" starts the job "J" running "echo hello; exit 3"
    And the session works until job "J" has settled
    Then job "J" exited with code 3, printing "hello"

  Scenario: Cancelling a running job stops its process
    Given a job session with conversation "A"
    When "A" starts the job "J" running "sleep 30"
    And job "J" is running
    And job "J" is cancelled from "A"
    And the session works until job "J" has settled
    Then job "J" was killed by SIGTERM

  Scenario: A job that outlives its harness is adopted by the next one
    Given a job session with conversation "A"
    When "A" starts the job "J" that runs until it is released
    And job "J" is running
    And the job session restarts
    Then job "J" is still running in the process it started in
    When job "J" is released
    And the session works until job "J" has settled
    Then job "J" exited with code 0, printing "released"
    And job "J" was run by one process

  Scenario: An agent's tool runs a job in the background and the turn goes on
    Given an agent session with conversation "P" and a tool "build" that runs "echo built" in the background
    And the model will call the tools "build"
    And the model will answer "started the build"
    When the user asks "build it" in "P"
    And "P" works until it settles
    Then the "build" call in "P" returned at once, naming its job
    And the answer to "build it" is "started the build"
    And the job started by "P" is later recorded as exited with code 0
