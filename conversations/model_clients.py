"""Clients of OpenAI-compatible servers (the agent's model, transcription), one per event
loop, server, key and timeout, in a bounded cache."""

import asyncio
from collections.abc import Hashable

import openai

from agentloop.core.caches import BoundedCache

# Bounded: one per (event loop, server, key, timeout); a client pushed out is left to the
# garbage collector (it may be mid-request in a turn).
_clients: BoundedCache[Hashable, openai.AsyncOpenAI] = BoundedCache(maxsize=64)


def client_for(base_url: str | None, api_key: str, timeout: float) -> openai.AsyncOpenAI:
    """One client per event loop and server (its connection pool belongs to the loop).
    The SDK's own retries are off: a retried request after a timeout could repeat a
    turn's effects, and the turn's outcome must be decided here."""
    key = (id(asyncio.get_running_loop()), base_url, api_key, timeout)
    client = _clients.get(key)
    if client is None:
        client = _clients.set(key, openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                                                      max_retries=0))
    return client
