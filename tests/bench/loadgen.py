"""A cheap HTTP/1.1 load generator (raw asyncio streams, keep-alive), run as its own
process so the client never competes with the server for the GIL.

    python -m tests.bench.loadgen --url http://127.0.0.1:8000/path --kind telegram --n 3000
    python -m tests.bench.loadgen --url … --seconds 10   # as many as it takes in 10 s
Prints one JSON line: {"n", "seconds", "rate", "errors", "statuses", "p50_ms", "p99_ms",
"began", "ended", "per_client"} (the latencies: request written to response read, per
request; began and ended: time.monotonic(), which every process of the machine reads
alike; per_client: how many each connection sent, which says which messages went).
"""

import argparse
import asyncio
import json
import time
from collections import Counter
from urllib.parse import urlsplit


def telegram_body(i, conversations, photo=False):
    """A text message, or (`photo`) a photo with a caption as Telegram sends it: three
    sizes, each with its file ids (a file of its own per message)."""
    chat = 1_000_000 + i % conversations
    message = {"message_id": i + 1, "date": int(time.time()),
               "from": {"id": chat, "is_bot": False, "first_name": "Bench"},
               "chat": {"id": chat, "type": "private", "first_name": "Bench"}}
    if photo:
        message["caption"] = f"boleta {i} y"
        message["photo"] = [{"file_id": f"AgACAgEAAxkBAAI{i:08d}{side}", "file_unique_id": f"AQAD{i:08d}{side}",
                             "width": side, "height": side * 3 // 4, "file_size": side * 90} for side in (90, 320, 800)]
    else:
        message["text"] = f"mensaje {i} y"
    return json.dumps({"update_id": 10_000_000 + i, "message": message}).encode()


async def client(host, port, path, headers, bodies, statuses, latencies):
    """One keep-alive connection POSTing `bodies` (any iterable) one after the other; how
    many it sent."""
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    for body in bodies:
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{headers}\r\n").encode()
        began = time.perf_counter()
        writer.write(head + body)
        await writer.drain()
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - began)
        statuses[int(status_line.split()[1])] += 1
        sent += 1
    writer.close()
    return sent


def percentile_ms(seconds, p):
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000 if ordered else None


def timed_bodies(args, c, until):
    """Client c's bodies until the clock says `until`: messages offset + c, + c + concurrency, …"""
    k = 0
    while time.monotonic() < until:
        yield telegram_body(args.offset + c + k * args.concurrency, args.conversations, args.photo)
        k += 1


async def main(args):
    url = urlsplit(args.url)
    headers = "".join(f"{h}\r\n" for h in args.header)
    statuses, latencies = Counter(), []
    began, started = time.monotonic(), time.perf_counter()
    if args.seconds:
        slices = [timed_bodies(args, c, began + args.seconds) for c in range(args.concurrency)]
    else:
        bodies = [telegram_body(args.offset + i, args.conversations, args.photo) for i in range(args.n)]
        slices = [bodies[c::args.concurrency] for c in range(args.concurrency)]
    per_client = await asyncio.gather(*(client(url.hostname, url.port, url.path, headers, s, statuses, latencies)
                                        for s in slices))
    seconds, sent = time.perf_counter() - started, sum(statuses.values())
    ok = sum(v for k, v in statuses.items() if k < 300)
    print(json.dumps({"n": sent, "seconds": seconds, "rate": ok / seconds, "errors": sent - ok,
                      "statuses": dict(statuses), "p50_ms": percentile_ms(latencies, 50),
                      "p99_ms": percentile_ms(latencies, 99), "began": began, "ended": time.monotonic(),
                      "per_client": per_client}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="POST for this long instead of --n messages (message k of client c: offset + c + k * concurrency)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--photo", action="store_true", help="photo messages with a caption, not text")
    asyncio.run(main(parser.parse_args()))
