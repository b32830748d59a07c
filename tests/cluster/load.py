"""Steady webhook load over several web hosts, open loop: message i is due at i / rate
seconds whatever the servers do, so a dead host shows as failed POSTs, not as a slower
client.

Conversation c (chat 2_000_000 + c) always goes first to host c % len(hosts): half of
the conversations through each of two hosts. Like Telegram, a POST that is not answered
2xx is delivered again (the same update); like a load balancer in front of the hosts,
the next try goes to the next host. A message is given up `give_up` seconds after it was
due. Every message whose POST got a 2xx was accepted: it must be in a turn.

    python -m tests.cluster.load --url http://10.213.0.11:8000 --url http://10.213.0.12:8000 \\
        --slug cluster --secret S --rate 30 --seconds 60 --conversations 300
prints one JSON line per message ({"i", "chat", "text", "accepted_at", "host", "tries"}) and
a summary line.
"""

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

FIRST_CHAT = 2_000_000
FIRST_UPDATE = 70_000_000
POST_TIMEOUT = 3.0  # seconds; a hung host is tried again elsewhere
RETRY_PAUSE = 0.25


@dataclass
class Message:
    i: int
    chat: int
    text: str
    due: float  # seconds after the start
    home: int  # index of the host tried first
    accepted_at: float | None = None  # seconds after the start, when a 2xx came back
    host: int | None = None
    # [host, status or error, seconds after the start when it ended, when it was sent] per try
    tries: list = field(default_factory=list)

    @property
    def platform_id(self):
        """How the product names the message (Telegram: "<chat>:<message_id>")."""
        return f"{self.chat}:{self.i + 1}"


def guarded(i, every):
    """Every `every`-th message asks for a booking: a guarded tool call (tests/cluster/agent.py)."""
    return every and i % every == every - 1


def plan(rate, seconds, conversations, hosts, book_every=5):
    messages = []
    for i in range(int(rate * seconds)):
        conversation = i % conversations
        text = f"mensaje {i} de la carga" + (f" book #{i}" if guarded(i, book_every) else "") + "."
        messages.append(Message(i=i, chat=FIRST_CHAT + conversation, text=text, due=i / rate,
                                home=conversation % hosts))
    return messages


def update(message):
    return {"update_id": FIRST_UPDATE + message.i, "message": {
        "message_id": message.i + 1, "date": int(time.time()), "text": message.text,
        "from": {"id": message.chat, "is_bot": False, "first_name": "Carga"},
        "chat": {"id": message.chat, "type": "private", "first_name": "Carga"}}}


async def deliver(message, clients, path, headers, started, give_up, retry_cap=RETRY_PAUSE):
    """POST until a 2xx, moving to the next host after each failure; the pause between
    tries doubles from RETRY_PAUSE up to `retry_cap`, as a platform's redelivery backs off
    (a fixed pause through an outage of many seconds sends every pending message again
    four times a second)."""
    host = message.home
    body = update(message)
    pause = RETRY_PAUSE
    while True:
        sent = round(time.monotonic() - started, 3)
        try:
            response = await clients[host].post(path, json=body, headers=headers)
            outcome = response.status_code
        except httpx.HTTPError as error:
            outcome = type(error).__name__
        now = time.monotonic() - started
        message.tries.append([host, outcome, round(now, 3), sent])
        if isinstance(outcome, int) and 200 <= outcome < 300:
            message.accepted_at, message.host = now, host
            return
        if now > message.due + give_up:
            return
        host = (host + 1) % len(clients)
        await asyncio.sleep(pause)
        pause = min(pause * 2, retry_cap)


async def run(urls, slug, secret, messages, started=None, give_up=20.0, retry_cap=RETRY_PAUSE):
    """Send `messages` on their schedule; returns them with their outcomes. `started`
    (time.monotonic()) is the schedule's zero, so a caller can time faults against it."""
    started = started or time.monotonic()
    path = f"/webhooks/telegram/{slug}/"
    headers = {"X-Telegram-Bot-Api-Secret-Token": secret}
    # No cap on connections: through an outage of many seconds, with a cap (64) httpx's pool
    # kept reporting PoolTimeout long after the hosts answered again (seen in the failover
    # test: a request timed out or cancelled mid-way can leave its slot taken), and the
    # load stopped though the product was accepting (a probe beside it got 200s).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    clients = [httpx.AsyncClient(base_url=url, timeout=POST_TIMEOUT, limits=limits) for url in urls]
    try:
        tasks = []
        for message in messages:
            delay = started + message.due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(deliver(message, clients, path, headers, started, give_up, retry_cap)))
        await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.aclose()
    return messages


def accepted_rate(messages, start, end):
    """Messages accepted (2xx) per second between `start` and `end` seconds."""
    count = sum(1 for m in messages if m.accepted_at is not None and start <= m.accepted_at < end)
    return count / (end - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", action="append", required=True, help="A web host's base URL (repeat).")
    parser.add_argument("--slug", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--book-every", type=int, default=5)
    args = parser.parse_args()
    messages = plan(args.rate, args.seconds, args.conversations, len(args.url), args.book_every)
    asyncio.run(run(args.url, args.slug, args.secret, messages))
    for message in messages:
        print(json.dumps(asdict(message)))
    accepted = sum(1 for m in messages if m.accepted_at is not None)
    print(json.dumps({"messages": len(messages), "accepted": accepted,
                      "rate": accepted_rate(messages, 0, args.seconds)}))


if __name__ == "__main__":
    main()
