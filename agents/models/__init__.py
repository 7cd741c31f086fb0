"""Models an agent can think with: the protocol, the providers (scripted, openai, anthropic)."""
