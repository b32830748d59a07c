"""A transport's coroutine run from a synchronous test: on an event loop of its own, the
platform's HTTP clients opened on that loop closed before the loop ends (a client left
open on a closed loop fails the next use of it)."""

import asyncio


def run_then_close(coro, close_clients):
    """`coro`'s result; `close_clients`: the platform's coroutine function that closes them."""
    async def then_close():
        try:
            return await coro
        finally:
            await close_clients()

    return asyncio.run(then_close())
