Feature: Testing your own agent, and embedding pico in a service's container
  A team tests its own tools on a throwaway session: the model is scripted, the clock is
  fake and moves by itself when a retry waits, and an expectation about the transcript
  that does not hold fails with what differs. A service that wires pico through its own
  dependency-injector container overrides pico's model and clock without touching pico,
  and an override of the wrong kind is refused, naming what was overridden. (issue 17)

  Scenario: A turn that calls the team's tool is read back as a transcript
    Given a test rig with the tool "order_status" and a scripted model
    And the scripted model will look up order "A-1" and then answer "A-1 has shipped."
    When the test runs the turn "Where is A-1?"
    Then the rig's turn is "done"
    And the rig's transcript is "user: Where is A-1? | tool_call: order_status {"order": "A-1"} | tool: A-1 is shipped | assistant: A-1 has shipped."

  Scenario: The team's tool failing is an error result the model sees
    Given a test rig with the tool "order_status" and a scripted model
    And the scripted model will look up order "Z-9" and then answer "I cannot find it."
    When the test runs the turn "Where is Z-9?"
    Then the rig's turn is "done"
    And the rig's tool results are "order_status: KeyError: 'no order Z-9' (error)"

  Scenario: A wrong expectation fails with the difference
    Given a test rig with the tool "order_status" and a scripted model
    And the scripted model will answer "Hello there."
    When the test runs the turn "hi"
    Then expecting the transcript "user: hi | assistant: Hi!" fails showing "-('assistant', 'Hi!')" and "+('assistant', 'Hello there.')"

  Scenario: A rate-limited model is retried on the fake clock, and nobody sleeps
    Given a test rig with the tool "order_status" and a scripted model
    And the scripted model is rate limited for 20 seconds and then answers "Hello."
    When the test runs the turn "hi"
    Then the rig's turn is "done"
    And the rig's clock moved 20 seconds
    And the scripted model was asked 2 times

  Scenario: A service's container overrides pico's model and clock
    Given a service container whose model answers "Hi from the service." and whose clock is fake
    When the service opens its harness and the user asks "hello"
    Then the service's answer is "Hi from the service."
    And the service's model was sent the system prompt "Be brief."

  Scenario: An override of the wrong kind is refused, naming it
    Given a service container whose model answers "unused" and whose clock is fake
    When the service overrides its clock with "noon"
    Then opening the service's harness fails with a configuration error naming "clock"
