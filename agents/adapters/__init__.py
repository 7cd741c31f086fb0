"""Adapters: another framework's agent as a Cairn agent kind, one module per framework.

Each makes an agent of its framework a `cairn.agent` kind (`CodeAgent`) that a worker's
module exposes: `pydantic_ai` (a PydanticAI `Agent`), `openai_agents` (an OpenAI Agents
SDK `Agent`), `langgraph` (a compiled LangGraph graph). Each sends the framework's model
calls through the step's model (`AgentContext.converse`: counted, traced, journaled),
keeps the framework's own history as JSON in the agent's state (so a restore rewinds it
with everything else), and runs the agent once a step on what teammates sent it
(`cairn.agents.adapters.base`). Importing this package imports no framework; each
module needs its extra (`pip install 'cairn-agents[pydantic-ai]'`, ...). docs/adapters.md
is the guide.
"""
