Feature: Tracing what a session does
  An embedding service sees a session's work in its own tracing: every run of a task is one
  span, and the model requests, tool calls and recorded changes it makes are inside it. A
  model request says which model it asked, how many tokens it used and why it stopped; a
  failed one says whether it will be retried. Without a tracer nothing is recorded. (issue 17)

  Scenario: An agent turn is traced as one span per task with its model request and tool call inside
    Given a traced agent session with conversation "A"
    And the model will call the tools "read"
    And the model will answer "Found it."
    When the user asks "Where is the bug?" in "A"
    And "A" works until it settles
    Then the answer to "Where is the bug?" is "Found it."
    And the trace has the task runs "generation, tool, post_tools, generation"
    And every model request in the trace is inside a "generation" task run
    And the model requests stopped for "tool_use, end_turn" and used the tokens the session recorded
    And the tool call "read" is inside the "tool" task run with the outcome "ok"
    And every change the tasks recorded is inside the run of its task

  Scenario: A model request that will be retried is traced as a failure with its retry class
    Given a traced agent session with conversation "A"
    And the model will be overloaded once, asking to retry after 2 seconds
    And the model will answer "Back again."
    When the user asks "Hello" in "A"
    And "A" works until it settles
    Then the answer to "Hello" is "Back again."
    And the first model request in the trace failed as "retryable"
    And the last model request in the trace stopped for "end_turn"

  Scenario: A tool that fails is traced with the outcome "error"
    Given a traced agent session with conversation "A"
    And the tool "read" will fail
    And the model will call the tools "read"
    And the model will answer "It broke."
    When the user asks "Read it" in "A"
    And "A" works until it settles
    Then the answer to "Read it" is "It broke."
    And the tool call "read" is inside the "tool" task run with the outcome "error"
