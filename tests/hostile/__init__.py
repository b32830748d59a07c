"""Hostile input, one module per boundary (docs/security.md): what a platform user, an
agent key, an operator or anyone on the network can send at each door, and what the door
holds. Each finding of a review adds its test here, written to fail before its fix.

- test_webhooks.py: the platforms' inbound URLs and the web server in front of them
- test_api.py: the REST API (agent keys, operator tokens)
- test_mcp.py: /mcp (agentloop's tools served) and the MCP client (servers we call)
- test_admin.py: what staff can reach through the admin and the console
- test_media.py: files and URLs that reach the workers: images, downloads, backups
"""
