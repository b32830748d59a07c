"""Streamed replies (issue 25, docs/streaming.md): 20 private chats at once, each answered
by the openai agent streaming 3 s of text from the local OpenAI-compatible server, the
replies going to the local Bot API.

Figures: the time from the model's first token (the fake's first content chunk written)
to the user's first preview (the Bot API's first sendMessageDraft for that chat), p50 and
p99; beside it the same channels with streaming off, where the first text the user sees
is the final, after the whole answer; and Bot API calls per streamed answer, at a slow
and a fast token rate (they must stay ≤ 1 per second of streaming + 1).

    .venv/bin/python -m tests.bench streaming
"""

import math

STREAMS = 20
SECONDS = 3.0
KEY_ENV = {"BENCH_OPENAI_API_KEY": "sk-bench"}


def bench_streaming(bench):
    """`bench`: tests.bench's helpers (report, web_server, worker, stop, wait_until, percentile)."""
    report, percentile = bench.report, bench.percentile
    from conversations.models import Channel
    from tests.fakes.openai_api import Delay, FakeOpenAI, Reply
    from tests.fakes.telegram_api import FakeBotAPI

    rates = {"slow": 15, "fast": 150}  # pieces in SECONDS: 5/s and 50/s
    figures = {}
    with FakeBotAPI() as bot_api, FakeOpenAI() as model:
        channel = Channel.objects.create(slug="tg", kind="telegram", agent="openai", platform_settings={
            "bot_token": _token(), "webhook_secret": _secret(), "api_base": bot_api.url, **_unpaced()},
            agent_config={"base_url": model.url, "model": "fake-model", "api_key_env": "BENCH_OPENAI_API_KEY"})
        web, url = bench.web_server()
        procs = [web, bench.worker(**KEY_ENV)]
        servers = (url, bot_api, model, bench.wait_until)
        try:
            for name, pieces in rates.items():
                text = " ".join(f"w{i}" for i in range(pieces))
                model.default = Reply(text, pace=SECONDS / pieces)
                figures[name] = _round(servers, first_chat=1000 * len(figures) + 10_000)
            channel.streaming = False
            channel.save()
            model.default = Delay(SECONDS, then=Reply("w " * 15))  # 3 s of writing, the answer whole at the end
            figures["off"] = _round(servers, first_chat=50_000, streamed=False)
        finally:
            for proc in procs:
                bench.stop(proc)
    slow, fast, off = figures["slow"], figures["fast"], figures["off"]
    p50, p99 = percentile(slow["latency"], 50), percentile(slow["latency"], 99)
    report("streaming", f"{STREAMS} concurrent streams of {SECONDS:g} s: model's first token -> user's first "
                        f"preview p50 {1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms (targets 150 / 400 ms: "
                        f"{'met' if p50 <= 0.15 and p99 <= 0.4 else 'NOT MET'}); streaming off, the first text "
                        f"the user sees is the final: model's first token -> final p50 "
                        f"{1000 * percentile(off['latency'], 50):.0f} ms, p99 "
                        f"{1000 * percentile(off['latency'], 99):.0f} ms")
    for name, figure in (("5 tokens/s", slow), ("50 tokens/s", fast)):
        calls, over = figure["calls"], max(figure["over"])
        report("streaming", f"Bot API calls per streamed answer at {name} over about {SECONDS:g} s: mean "
                            f"{sum(calls) / len(calls):.1f}, max {max(calls)} (drafts + the final; target: at most "
                            f"one per started second of the answer's own streaming + 1, the worst answer "
                            f"{over:+d} against it: {'met' if over <= 0 else 'NOT MET'})")


def _round(servers, first_chat, streamed=True):
    """STREAMS chats write at once; (first token -> first text seen) per chat, and the
    Bot API calls (drafts and sendMessage) each answer took."""
    url, bot_api, model, wait_until = servers
    import threading

    from tests.support import local_http
    from tests.support.e2e import SECRET, update

    chats = [first_chat + i for i in range(STREAMS)]

    def post(chat):
        local_http.post(f"{url}/webhooks/telegram/tg/", json=update(chat, f"stream {chat}?"),
                        headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)

    threads = [threading.Thread(target=post, args=(chat,)) for chat in chats]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    def finals():
        return [c for c in bot_api.calls("sendMessage") if int(c.params["chat_id"]) in chats]

    wait_until(lambda: len(finals()) >= STREAMS, 60, "every final")
    requests = {r.messages[-1]["content"]: r for r in model.requests() if r.messages[-1]["content"].startswith("stream")}
    latency, calls, over = [], [], []
    for chat in chats:
        key = f"stream {chat}?"
        mine = [c for c in bot_api.calls() if c.method in ("sendMessageDraft", "sendMessage")
                and int(c.params.get("chat_id", 0)) == chat]
        first_seen = min(c.at for c in mine)
        if not streamed:
            latency.append(first_seen - requests[key].at)
            continue
        first_token, last_token = model.first_tokens[key], model.last_tokens[key]
        latency.append(first_seen - first_token)
        calls.append(len(mine))
        # The bound: a preview per started second of streaming, and the final.
        over.append(len(mine) - (math.ceil(last_token - first_token) + 1))
    return {"latency": latency, "calls": calls, "over": over}


def _token():
    from tests.support.e2e import TOKEN

    return TOKEN


def _secret():
    from tests.support.e2e import SECRET

    return SECRET


def _unpaced():
    from tests.support.e2e import UNPACED

    return UNPACED
