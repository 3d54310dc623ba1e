Feature: A collapse interrupted by a crash
  A collapse asks the model for a summary of the conversation so far and puts it in place
  of the older context. When the owner of the session goes away in the middle, the next
  owner finishes the collapse. A summary that was already recorded, with what the model
  reported it cost, is published as it is: the model is not asked for it again and its
  cost is counted once. With no summary recorded, the model is asked again within the
  collapse's retry budget; once that is spent the collapse fails and the context stays as
  it was.

  Background:
    Given a session with conversation "A" and a summarizer
    And "A" has the messages "q1, a1, q2, a2, q3, a3"

  Scenario: A collapse interrupted after its summary was recorded publishes that summary on recovery without asking the model again
    Given the summarizer will answer "the story so far" at a cost of 120 input and 30 output tokens
    And the owner will go away right after the summary is recorded
    When "A" starts the collapse "C"
    And the owner goes away
    And the session is opened again with a new summarizer
    And "A" is driven
    Then task "C" is "done"
    And the context of "A" starts with the summary "the story so far"
    And the summarizer was asked 0 times
    And the collapse "C" cost 120 input and 30 output tokens

  Scenario: A collapse interrupted before its summary was recorded asks the model again
    Given the summarizer will not answer
    When "A" starts the collapse "C"
    And the owner goes away
    And the session is opened again with a new summarizer that will answer "the story, again" at a cost of 50 input and 10 output tokens
    And "A" is driven
    Then task "C" is "done"
    And the context of "A" starts with the summary "the story, again"
    And the summarizer was asked 1 times
    And the collapse "C" cost 50 input and 10 output tokens

  Scenario: An interrupted collapse with no retries left fails and leaves the context as it was
    Given the summarizer will not answer
    And a collapse may ask the model only once
    When "A" starts the collapse "C"
    And the owner goes away
    And the session is opened again with a new summarizer that will answer "too late" at a cost of 5 input and 1 output tokens
    And "A" is driven
    Then task "C" is "failed"
    And the summarizer was asked 0 times
    And the context of "A" is "q1, a1, q2, a2, q3, a3"
