"""A transport's coroutine run from a synchronous test: on an event loop of its own, the
platform's HTTP clients opened on that loop closed before the loop ends (a client left
open on a closed loop fails the next use of it).

Through asgiref's `async_to_sync`, not `asyncio.run`: the coroutine's database calls
(`sync_to_async`, thread-sensitive, as the ledger's are) then run on the test's own
thread, on its connection and inside its transaction. On a thread of their own they
opened a second connection, and on SQLite its first write waited for the test's
transaction to let go of the write lock: 30 s, then the send failed ("no send slot could
be reserved": a paced send woken late by a starved machine takes a fresh slot, a write)."""

from asgiref.sync import async_to_sync


def run_then_close(coro, close_clients):
    """`coro`'s result; `close_clients`: the platform's coroutine function that closes them."""
    async def then_close():
        try:
            return await coro
        finally:
            await close_clients()

    return async_to_sync(then_close)()
