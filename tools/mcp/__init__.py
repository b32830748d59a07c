"""MCP both ways.

As a client (`client`, `catalog`): an operator registers MCP servers (tools.mcp.models);
their tools are offered to the channels' agents next to the hosted tools, each one a
`registry.Tool` named `<server>__<tool>` so every call goes through the action guard the
hosted tools use (a ToolPolicy per MCP tool, its defaults read from the tool's
annotations — hints, trusted only for a server the operator marked trusted).

As a server (`server`): the hosted tools and the guard itself (`guard_claim`,
`guard_succeed`, `guard_fail`) served over streamable HTTP at `/mcp` to agent keys.
"""
