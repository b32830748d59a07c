"""A cheap HTTP/1.1 load generator (raw asyncio streams, keep-alive), run as its own
process so the client never competes with the server for the GIL.

    python -m tests.bench.loadgen --url http://127.0.0.1:8000/path --n 3000
    python -m tests.bench.loadgen --url …/webhooks/slack/sl/ --kind slack --secret S --seconds 4
        # another platform's webhook payloads, each signed as that platform signs them
        # (--kind telegram, whatsapp, slack, google_chat, teams, messenger, instagram, sms: bodies();
        # its bearer as a --header)
    python -m tests.bench.loadgen --url … --seconds 10   # as many as it takes in 10 s
    python -m tests.bench.loadgen --url … --seconds 600 --rate 300 --returning-after 9000
        # paced (open loop): message i is due at began + i / rate; odd messages numbered
        # above 9,000 come back to the chat of an earlier even one (chat_index)
Prints one JSON line: {"n", "seconds", "rate", "errors", "statuses", "p50_ms", "p99_ms",
"began", "ended", "per_client"} (the latencies: request written to response read, per
request; began and ended: time.monotonic(), which every process of the machine reads
alike; per_client: how many each connection sent, which says which messages went), and
when paced "per_bucket": per --bucket seconds of schedule (after the first --lead-in seconds,
whose figure is "lead_in"), the messages due then, how many were accepted, their POST
p50/p99 and how late the latest of them was sent ("lag_max_ms"), and "paced": the --rate,
--returning-after and --lead-in it kept.
"""

import argparse
import asyncio
import json
import time
from collections import Counter
from urllib.parse import urlsplit


def chat_index(i, returning_after=0):
    """Which chat message i of a paced run (counted from --offset) belongs to: its own, or with
    `returning_after` G (even), every odd message i > G comes back to the chat of message
    i - G - 1, an even one: each even message's chat writes once more, G + 1 messages later."""
    if returning_after and i % 2 == 1 and i > returning_after:
        return i - returning_after - 1
    return i


def telegram_body(i, conversations, photo=False, chat_number=None):
    """Message number i: a text message, or (`photo`) a photo with a caption as Telegram
    sends it: three sizes, each with its file ids (a file of its own per message). Its
    chat: 1,000,000 + (`chat_number`, by default i) % conversations."""
    chat = 1_000_000 + (i if chat_number is None else chat_number) % conversations
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


def bodies(kind, secret, conversations, photo=False):
    """Message i of `kind` as that platform POSTs it: a function of i giving the body, or
    (its own header lines, the body) when the platform signs each request. The chat is
    1,000,000 + i % conversations, as telegram_body's. The other platforms' shapes come
    from their fakes (tests/fakes/), imported only when asked for."""
    if kind == "telegram":
        return lambda i: telegram_body(i, conversations, photo)
    if kind == "whatsapp":
        from tests.fakes import graph_api
        from tests.support.whatsapp import PHONE

        def whatsapp(i):
            wa_id = str(5_491_100_000_000 + i % conversations)
            message = graph_api.text_message(wa_id, f"mensaje {i} y", wamid=f"wamid.BENCH{i:012d}")
            raw = json.dumps(graph_api.webhook_body(PHONE, messages=[message])).encode()
            return f"X-Hub-Signature-256: {graph_api.signature(secret, raw)}\r\n", raw
        return whatsapp
    if kind in ("messenger", "instagram"):
        from tests.fakes import graph_api, graph_messenger
        from tests.support.messenger import ACCOUNTS

        def meta(i):  # a person per chat, one event per body, signed with the app secret
            psid = str(6_645_000_000_000_000 + i % conversations)
            event = graph_messenger.text_event(psid, ACCOUNTS[kind], f"mensaje {i} y", mid=f"m_BENCH{kind}{i:012d}")
            raw = json.dumps(graph_messenger.event_body(ACCOUNTS[kind], event, kind=kind)).encode()
            return f"X-Hub-Signature-256: {graph_api.signature(secret, raw)}\r\n", raw
        return meta
    if kind == "slack":
        from tests.fakes import slack_api

        def slack(i):
            chat = f"D{1_000_000 + i % conversations:09d}"
            event = slack_api.message_event(f"U{1_000_000 + i % conversations:09d}", f"mensaje {i} y", channel=chat,
                                            ts=f"{int(time.time())}.{i % 1_000_000:06d}")
            raw = json.dumps(slack_api.envelope(event, event_id=f"Ev{i:012d}")).encode()
            return "".join(f"{k}: {v}\r\n" for k, v in slack_api.sign(secret, raw).items()), raw
        return slack
    if kind == "google_chat":
        from tests.fakes import google_chat_api

        def google_chat(i):  # a DM space per chat; the bearer is a --header (one token serves an hour)
            space = f"spaces/DMBENCH{1_000_000 + i % conversations}"
            event = google_chat_api.message_event(f"mensaje {i} y", space=space, name=f"{space}/messages/b{i}",
                                                  user=f"users/{1_000_000 + i % conversations}")
            event["space"] = {"name": space, "type": "DM", "spaceType": "DIRECT_MESSAGE", "singleUserBotDm": True}
            return json.dumps(event).encode()
        return google_chat
    if kind == "teams":
        from tests.fakes import teams_api

        def teams(i):  # a personal chat per person; the Connector's bearer is a --header (it serves an hour)
            user = f"29:bench-user-{1_000_000 + i % conversations}"
            activity = teams_api.message_activity(f"mensaje {i} y", user=user, activity_id=f"1{i:012d}",
                                                  conversation=teams_api.personal_conversation(user))
            return json.dumps(activity).encode()
        return teams
    if kind == "sms":
        from urllib.parse import urlencode

        from tests.fakes import twilio_api
        from tests.fakes.twilio_api import BENCH_PUBLIC

        def sms(i):  # a form post signed over the public URL Twilio calls (the bench's channel "b-sm")
            params = twilio_api.message_params(f"mensaje {i} y", sender=f"+569{10_000_000 + i % conversations}",
                                               message_sid=f"SM{i:032x}")
            signed = twilio_api.signature(f"{BENCH_PUBLIC}/webhooks/sms/b-sm/", params)
            return f"X-Twilio-Signature: {signed}\r\n", urlencode(params).encode()
        return sms
    raise SystemExit(f"unknown --kind {kind}")


async def client(host, port, path, headers, bodies, statuses, latencies, paced=None, answered_at=None):
    """One keep-alive connection POSTing `bodies` (any iterable: each bytes, or its own
    header lines and the bytes) one after the other; how many it sent. `paced`: {"due": [monotonic time per body], "records": list} to send each
    body no earlier than its time and note (due, lag, latency, status) for each.
    `answered_at`: a list given the monotonic time each POST was answered (None where it was refused)."""
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0
    for k, body in enumerate(bodies):
        if paced is not None:
            await asyncio.sleep(max(0.0, paced["due"][k] - time.monotonic()))
            lag = time.monotonic() - paced["due"][k]
        own, body = body if isinstance(body, tuple) else ("", body)
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{headers}{own}\r\n").encode()
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
        if paced is not None:
            paced["records"].append((paced["due"][k], lag, latencies[-1], int(status_line.split()[1])))
        if answered_at is not None:
            answered_at.append(time.monotonic() if int(status_line.split()[1]) < 300 else None)
        sent += 1
    writer.close()
    return sent


def percentile(values, p, empty=None):
    """The p-th percentile of `values` (nearest rank), `empty` when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else empty


def percentile_ms(seconds, p):
    value = percentile(seconds, p)
    return None if value is None else value * 1000


def timed_bodies(args, c, until, body):
    """Client c's bodies until the clock says `until`: messages offset + c, + c + concurrency, …"""
    k = 0
    while time.monotonic() < until:
        yield body(args.offset + c + k * args.concurrency)
        k += 1


def per_bucket(records, began, bucket, lead_in=0.0):
    """Paced records grouped by when they were due, the first `lead_in` seconds apart:
    ([{"due", "accepted", "p50_ms", "p99_ms", "lag_max_ms"}, …], the lead-in's or None)."""
    groups, lead = {}, []
    for due, lag, latency, status in records:
        if due - began < lead_in:
            lead.append((lag, latency, status))
        else:
            groups.setdefault(int((due - began - lead_in) // bucket), []).append((lag, latency, status))
    return [figures(group) for _, group in sorted(groups.items())], (figures(lead) if lead else None)


def figures(group):
    return {"due": len(group), "accepted": sum(1 for *_, status in group if status < 300),
            "p50_ms": percentile_ms([latency for _, latency, _ in group], 50),
            "p99_ms": percentile_ms([latency for _, latency, _ in group], 99),
            "lag_max_ms": max(lag for lag, _, _ in group) * 1000}


async def main(args):
    url = urlsplit(args.url)
    headers = "".join(f"{h}\r\n" for h in args.header)
    statuses, latencies = Counter(), []
    began, started = time.monotonic(), time.perf_counter()
    paced = [None] * args.concurrency
    if args.rate:
        total = int(args.rate * args.seconds)
        numbers = [range(c, total, args.concurrency) for c in range(args.concurrency)]
        records = []
        paced = [{"due": [began + i / args.rate for i in numbers[c]], "records": records}
                 for c in range(args.concurrency)]
        slices = [(telegram_body(args.offset + i, args.conversations, args.photo,
                                 args.offset + chat_index(i, args.returning_after))
                   for i in numbers[c]) for c in range(args.concurrency)]
    elif args.seconds:
        body = bodies(args.kind, args.secret, args.conversations, args.photo)
        slices = [timed_bodies(args, c, began + args.seconds, body) for c in range(args.concurrency)]
    else:
        body = bodies(args.kind, args.secret, args.conversations, args.photo)
        made = [body(args.offset + i) for i in range(args.n)]
        slices = [made[c::args.concurrency] for c in range(args.concurrency)]
    accepted_at = [[] for _ in range(args.concurrency)]  # per client, each POST's answer time (--accepted-at)
    per_client = await asyncio.gather(*(client(url.hostname, url.port, url.path, headers, s, statuses, latencies,
                                               paced[c], accepted_at[c] if args.accepted_at else None)
                                        for c, s in enumerate(slices)))
    seconds, sent = time.perf_counter() - started, sum(statuses.values())
    ok = sum(v for k, v in statuses.items() if k < 300)
    print(json.dumps({"n": sent, "seconds": seconds, "rate": ok / seconds, "errors": sent - ok,
                      "statuses": dict(statuses), "p50_ms": percentile_ms(latencies, 50),
                      "p99_ms": percentile_ms(latencies, 99), "began": began, "ended": time.monotonic(),
                      "per_client": per_client, **({"accepted_at": accepted_at} if args.accepted_at else {}),
                      **(paced_figures(records, began, args) if args.rate else {})}))


def paced_figures(records, began, args):
    buckets, lead = per_bucket(records, began, args.bucket, args.lead_in)
    return {"per_bucket": buckets, "lead_in": lead,
            "paced": {"rate": args.rate, "returning_after": args.returning_after, "lead_in": args.lead_in}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="POST for this long instead of --n messages (message k of client c: offset + c + k * concurrency)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="with --seconds: send at this many messages/s (open loop), message i due at start + i / rate")
    parser.add_argument("--returning-after", type=int, default=0,
                        help="even G: odd messages after the G-th come back to the chat of message i - G - 1")
    parser.add_argument("--bucket", type=float, default=60.0, help="paced: seconds of schedule per figure")
    parser.add_argument("--lead-in", type=float, default=0.0,
                        help="paced: the first seconds of schedule are one figure of their own (\"lead_in\"), "
                             "the buckets start after them")
    parser.add_argument("--accepted-at", action="store_true",
                        help="print each POST's answer time too (monotonic, per client, in order; None if refused)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--photo", action="store_true", help="photo messages with a caption, not text")
    parser.add_argument("--kind", default="telegram", choices=("telegram", "whatsapp", "slack", "google_chat", "teams",
                                                                  "messenger", "instagram", "sms"),
                        help="whose webhook payloads (bodies()); paced runs are Telegram's")
    parser.add_argument("--secret", default="", help="the key each request is signed with (whatsapp, slack, "
                                                          "messenger, instagram)")
    asyncio.run(main(parser.parse_args()))
