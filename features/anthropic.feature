Feature: Claude through the Anthropic Messages API
  An agent session can run on Anthropic's models. The provider streams the answer, and
  pico decides what a failure means: an overloaded or rate-limited API is asked again,
  a prompt too long for the model is compacted, a bad key fails the input. The part of
  the context that does not change from one request to the next is marked for the
  prompt cache, and what the cache served is recorded with the answer. An abort stops
  the answer being streamed at once. (pico v3 §8.3, issue 17)

  Scenario: An overloaded provider is retried
    Given an agent session with conversation "A" on the Anthropic API
    And the Anthropic API will be overloaded once
    And the Anthropic API will answer "Back again."
    When the user asks "Are you there?" in "A"
    And "A" works until it settles
    Then the answer to "Are you there?" is "Back again."
    And the Anthropic API was asked 2 times

  Scenario: The stable prefix of the context is marked for the prompt cache and cache usage is recorded
    Given an agent session with conversation "A" on the Anthropic API with a system prompt and tools
    And the Anthropic API will answer "Cached." reading 900 prompt tokens from its cache and writing 40
    When the user asks "What changed?" in "A"
    And "A" works until it settles
    Then the answer to "What changed?" is "Cached."
    And the request marked the system prompt, the last tool and the final message for the prompt cache
    And the answer to "What changed?" records 900 prompt tokens read from the cache and 40 written

  Scenario: An abort stops the provider's stream
    Given an agent session with conversation "A" on the Anthropic API
    And the Anthropic API will stream an answer that never ends
    When the user asks "Tell me everything" in "A"
    And "A" starts working
    And the Anthropic API is streaming the answer
    And "A" is aborted
    Then the Anthropic API sees the connection close
    When "A" finishes its work
    Then "Tell me everything" is cancelled
    And the transcript of "A" has the kinds "user"
