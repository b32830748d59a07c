"""Slack's Events API intake (issue 28): signed `event_callback` requests, a new DM per
event (the peer workload's shape), POSTed to the web server while the worker runs the
pipeline (windows, turns, replies through slack-sdk to a local fake Web API).

Two figures: at a fixed 200 events/s, the acknowledgement time of each request from the
moment it was due (queueing included: p50, p99; target p99 <= 300 ms, Slack's limit is
3 s); and flat out (16 keep-alive connections, each sending as soon as it is answered),
events acknowledged per second.

    .venv/bin/python -m tests.bench slack

The load generator runs as its own process (`python -m tests.bench.slack --url … --secret
…`), so it never competes with the servers here for the GIL; it signs every request as
Slack does.
"""

import argparse
import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

SECRET = "bench-signing-secret"
TOKEN = "xoxb-bench-0000000000-0000000000000-benchbenchbenchbenchbench"


def envelope(i: int) -> bytes:
    ts = f"{int(time.time())}.{i % 1_000_000:06d}"
    event = {"type": "message", "user": f"U{i:010d}", "text": f"mensaje {i} y", "ts": ts, "event_ts": ts,
             "channel": f"D{i:010d}", "channel_type": "im", "client_msg_id": f"{i:032x}", "team": "T0BENCH"}
    return json.dumps({"token": "x", "team_id": "T0BENCH", "api_app_id": "A0BENCH", "type": "event_callback",
                       "event_id": f"Ev{i:012d}", "event_time": int(time.time()), "event": event,
                       "authorizations": [{"user_id": "U0BENCHBOT", "is_bot": True, "team_id": "T0BENCH"}]}).encode()


def signed_head(host, port, path, body, secret):
    stamp = str(int(time.time()))
    signature = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Slack-Request-Timestamp: {stamp}\r\n"
            f"X-Slack-Signature: v0={signature}\r\n\r\n").encode()


async def connection(url, secret, jobs, statuses, latencies):
    """One keep-alive connection: each job is (index, due time or None: at once)."""
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    for index, due in jobs:
        if due is not None and due > time.perf_counter():
            await asyncio.sleep(due - time.perf_counter())
        body = envelope(index)
        began = time.perf_counter()
        writer.write(signed_head(url.hostname, url.port, url.path, body, secret) + body)
        await writer.drain()
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - (due if due is not None else began))
        statuses[int(status_line.split()[1])] += 1
    writer.close()


async def load(args):
    url = urlsplit(args.url)
    statuses, latencies = Counter(), []
    start = time.perf_counter() + 0.2
    jobs = [(args.offset + i, start + i / args.rate if args.rate else None) for i in range(args.n)]
    slices = [jobs[c::args.concurrency] for c in range(args.concurrency)]
    began = time.perf_counter()
    await asyncio.gather(*(connection(url, args.secret, s, statuses, latencies) for s in slices))
    seconds = time.perf_counter() - max(began, start if args.rate else began)
    ok = sum(v for k, v in statuses.items() if k < 300)
    ordered = sorted(latencies)

    def ms(p):
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000

    print(json.dumps({"n": args.n, "seconds": seconds, "rate": ok / seconds, "errors": args.n - ok,
                      "statuses": dict(statuses), "p50_ms": ms(50), "p99_ms": ms(99), "max_ms": ms(100)}))


def run_load(url, n, offset, rate=0.0, concurrency=16):
    out = subprocess.run([sys.executable, "-m", "tests.bench.slack", "--url", url, "--secret", SECRET, "--n", str(n),
                          "--offset", str(offset), "--rate", str(rate), "--concurrency", str(concurrency)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_slack(report, web_server, worker, stop, unpaced):
    from conversations.models import Channel, InboundMessage
    from tests.fakes.slack_api import FakeSlackAPI

    with FakeSlackAPI() as fake:
        Channel.objects.create(slug="sl", kind="slack", platform_settings={
            "bot_token": TOKEN, "signing_secret": SECRET, "api_base": fake.url,
            **{k: v for k, v in unpaced.items() if k != "group_messages_per_minute"}})
        web, base = web_server()
        procs = [web, worker()]
        try:
            url = f"{base}/webhooks/slack/sl/"
            run_load(url, 300, 0)  # warm-up: imports, connections, the first conversations
            paced = run_load(url, 2000, 1_000_000, rate=200)
            flat = run_load(url, 3000, 2_000_000)
            replies = len(fake.calls("chat.postMessage"))
        finally:
            for proc in procs:
                stop(proc)
        stored = InboundMessage.objects.count()
    report("slack", f"200 events/s for 10 s (new DM each), acknowledged from the moment each was due: p50 "
                    f"{paced['p50_ms']:.1f} ms, p99 {paced['p99_ms']:.1f} ms, max {paced['max_ms']:.0f} ms "
                    f"(target p99 <= 300 ms: {'met' if paced['p99_ms'] <= 300 else 'NOT MET'}), "
                    f"{paced['errors']} not 2xx")
    report("slack", f"flat out, 16 connections: {flat['rate']:.0f} events acknowledged/s (p50 {flat['p50_ms']:.1f} ms, "
                    f"p99 {flat['p99_ms']:.1f} ms), {flat['errors']} not 2xx; {stored} messages stored, "
                    f"{replies} replies posted by the worker meanwhile")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="events per second overall (0: flat out)")
    parser.add_argument("--concurrency", type=int, default=16)
    asyncio.run(load(parser.parse_args()))
