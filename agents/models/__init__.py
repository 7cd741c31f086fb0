"""Models an agent can think with: the protocol, the scripted model and OpenAI-compatible."""
