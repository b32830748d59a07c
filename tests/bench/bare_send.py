"""The recovery benchmark's reference: the same messages sent through the same client
(python-telegram-bot on our aiohttp layer, the worker's ReplyBot.send_message_id, as
many connections per bot as the worker uses) to the same local Bot API server, all at
once — no ledger, no database."""

import argparse
import asyncio
import json
import time

from conversations.platforms.telegram.bot import ReplyBot
from conversations.platforms.telegram.request import AiohttpRequest


async def main(url, token, n, chats, connections):
    bot = ReplyBot(token, base_url=f"{url.rstrip('/')}/bot", request=AiohttpRequest(connections=connections),
                       get_updates_request=AiohttpRequest(connections=1))
    began = time.monotonic()
    await asyncio.gather(*(bot.send_message_id(str(1000 + i % chats), f"bare {i}") for i in range(n)))
    elapsed = time.monotonic() - began
    await bot.request.shutdown()
    print(json.dumps({"sent": n, "seconds": elapsed}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--n", type=int)
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.token, args.n, args.chats, args.connections))
