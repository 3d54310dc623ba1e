Feature: A model served over the OpenAI API
  A session's model can be a real server speaking the OpenAI Chat Completions API. What
  the server says about a failed request decides what happens to the question: a server
  that is rate limited is asked again once the wait it named has passed; a request too
  long for the model's context makes the conversation compacted once and the question
  asked again; a tool call whose arguments cannot be read is answered with an error and
  the tool is not run. Every attempt is part of the session's history.

  Background:
    Given a session whose model is served over the OpenAI API

  Scenario: A rate-limited request is retried after the server's retry-after
    Given the server will refuse the next request as rate limited for 7 seconds
    And the server will then answer "after the wait"
    When the user asks the server "hello"
    Then the question waits 7 seconds before it is asked again
    And the server was asked 1 time
    When 7 seconds pass for the server
    Then "hello" is answered with "after the wait"
    And the server was asked 2 times

  Scenario: A request whose context is too long is compacted and retried
    Given the conversation already has 2 answered questions
    And the server will refuse the next request as too long for the model's context
    And the server will then answer "the summary of it all"
    And the server will then answer "answered with less context"
    When the user asks the server "one more question"
    And the question settles
    Then the conversation was compacted once
    And "one more question" is answered with "answered with less context"
    And the last request to the server carried "the summary of it all"

  Scenario: A tool call with unreadable arguments is answered with an error and not run
    Given the server will call the tool "read" with the arguments {"path": "a.py
    And the server will then answer "sorry, let me retry"
    When the user asks the server "read a.py"
    And the question settles
    Then the tool "read" was not run
    And the server was sent an error result for that call
    And "read a.py" is answered with "sorry, let me retry"
