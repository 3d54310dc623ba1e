Feature: A stream interrupted by a crash
  When the owner of a session goes away while the model is still streaming an answer, the
  next owner finds the request in flight. The part of the answer that was already saved
  becomes the answer, marked interrupted, and the model is not asked again for it. With
  nothing saved, the request is retried within its budget, or fails once it is spent; an
  answer is never made up.

  Background:
    Given an agent session with conversation "A"

  Scenario: The saved part of an interrupted answer is kept and marked interrupted
    Given the model will answer a story of 2000 characters
    When the user asks "tell me a story" in "A"
    And "A" starts working
    And "A" streams until 1024 characters of the answer are saved
    And the owner goes away mid-stream
    And the session is opened again with a new model
    And "A" works until it settles
    Then "tell me a story" is interrupted with the saved part of the answer
    And the model was asked 0 times
    And the transcript of "A" has the kinds "user, assistant"

  Scenario: An answer interrupted before any of it was saved is asked for again
    Given the model will answer a story of 2000 characters
    When the user asks "tell me a story" in "A"
    And "A" starts working
    And the owner goes away mid-stream
    And the session is opened again with a new model that will answer "a short story"
    And "A" works until it settles
    Then the answer to "tell me a story" is "a short story"
    And the model was asked 1 times

  Scenario: An interrupted answer with no retries left fails without an answer
    Given the model may be asked only once per turn
    And the model will answer a story of 2000 characters
    When the user asks "tell me a story" in "A"
    And "A" starts working
    And the owner goes away mid-stream
    And the session is opened again with a new model that will answer "a short story"
    And "A" works until it settles
    Then "tell me a story" is failed
    And the model was asked 0 times
    And the transcript of "A" has the kinds "user"
