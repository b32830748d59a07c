"""A platform that keeps a connection open (conversations.platforms.connection), run by
real workers against a real WebSocket server: one connection per channel across all
workers (a lease), resumed from the cursor it stored after a drop, and what the platform
sends again after the resume admitted once (tests/socket_platform/ is the platform)."""

import asyncio
import json
import sys
import threading

import pytest
from websockets.asyncio.server import serve

from conversations.models import InboundMessage
from tests.conftest import run_python, wait_until

pytestmark = pytest.mark.e2e

EXTRA = {"AGENTLOOP_EXTRA_PLATFORMS": "sock=tests.socket_platform.SocketPlatform"}
MESSAGES = {seq: {"id": f"m{seq}", "chat": "c1", "from": "ana", "text": text}
            for seq, text in ((1, "hola"), (2, "quiero reservar"), (3, "para mañana"))}


class SocketServer:
    """The platform's side, in a thread of its own: the first connection sends seq 1 and
    2, each acknowledged, then drops (no close frame, as a network failure does); the
    next ones send again from the cursor the client resumes after — seq 2, which it
    already has, then 3 — and stay open."""

    def __init__(self):
        self.hellos, self.acks = [], []
        self.open = self.most_open = 0
        self.ready, self.loop, self.stopped = threading.Event(), None, None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.thread.join(10)

    async def _main(self):
        self.loop, self.stopped = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self._connection, "127.0.0.1", 0) as server:
            self.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
            self.ready.set()
            await self.stopped.wait()

    async def _connection(self, socket):
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            resume = json.loads(await socket.recv())["resume"]
            self.hellos.append(resume)
            first = len(self.hellos) == 1
            for seq in (1, 2) if first else range(resume, 4):
                await socket.send(json.dumps({"seq": seq, "message": MESSAGES[seq]}))
                self.acks.append(json.loads(await socket.recv())["ack"])
            if first:
                socket.transport.abort()  # dropped
                return
            await socket.wait_closed()
        finally:
            self.open -= 1


def test_a_connection_resumes_after_a_drop_and_admits_what_is_sent_again_once(processes):
    with SocketServer() as platform:
        command = [sys.executable, "manage.py", "addchannel", "sock1", "--kind", "sock", "--url", platform.url,
                   "--agent", "pull"]
        done = run_python(command, env=processes.env(**EXTRA), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        processes.worker(**EXTRA)
        processes.worker(**EXTRA)  # a second worker: still one connection (the channel's lease)

        wait_until(lambda: platform.acks[-1:] == [3], timeout=60, message="seq 3 acknowledged after the resume")
        # The drop came after seq 2 was stored: the connection resumed from it, not from scratch.
        assert platform.hellos == [None, 2]
        assert platform.acks == [1, 2, 2, 3]  # seq 2 sent twice (at least once), acknowledged twice
        stored = sorted(InboundMessage.objects.values_list("platform_message_id", "text"))
        assert stored == [("m1", "hola"), ("m2", "quiero reservar"), ("m3", "para mañana")]
        assert platform.most_open == 1
