"""The real model providers (issue 17): adapters from the ``ModelProvider`` port to the
vendors' official SDKs, each an optional extra (``pico-harness[openai]``,
``pico-harness[anthropic]``), imported only when used."""
