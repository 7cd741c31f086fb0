"""MCP servers as tools on Cairn's workers.

`config` reads a worker's servers (the `mcpServers` JSON shape), `names` maps spec names
(`mcp:<server>`, `mcp:<server>/<tool>`) and model-facing names (`<server>__<tool>`),
`manager` keeps the sessions (`McpManager`), `results` renders what a call returned for a
model (text, and images beside it), and `tools` makes registry entries of the servers'
tools. Importing this package does not import the `mcp` SDK; `manager` and `results` do
(`pip install 'cairn-agents[mcp]'`).
"""

from cairn.agents.mcp.config import McpServer, load_mcp_config
from cairn.agents.mcp.names import MCP_REF, parse_ref, tool_name

__all__ = ["MCP_REF", "McpServer", "load_mcp_config", "parse_ref", "tool_name"]
