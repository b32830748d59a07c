"""The console's websockets in tests: channels' test communicator on the real ASGI
application, whose handshake is given time for what it does (the consumer's session and
permission checks and the live relay's start, a few database steps). Channels' default
of 1 s timed out once in CI's busy phase (six tests on two cores)."""

from channels.testing import WebsocketCommunicator

from agentloop.asgi import application

CONNECT_TIMEOUT = 10


class ConsoleSocket(WebsocketCommunicator):
    def __init__(self, path, headers):
        super().__init__(application, path, headers=headers)

    async def connect(self, timeout=CONNECT_TIMEOUT):
        return await super().connect(timeout)
