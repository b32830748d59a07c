"""The paced drain (issue 29): new chats at 300/s for a few seconds against a local Bot API
that keeps Telegram's documented limits (30 messages/s per bot, 1/s per chat), the
channel at its defaults. Figures: sends per second in the steady drain beside the
limit the same server enforced, the share of 429s, and the share of labelled replies.

    .venv/bin/python -m tests.bench paced
"""

def bench_paced(report, web_server, worker, stop, wait_until, rate=300, seconds=5.0):
    from conversations.models import Channel
    from delivery.models import OutboundMessage
    from tests.end_to_end.test_paced_drain import post_at_rate
    from tests.fakes.telegram_api import FakeBotAPI, Limits
    from tests.support.e2e import SECRET, TOKEN

    limits = Limits()
    with FakeBotAPI(limits=limits) as fake:
        Channel.objects.create(slug="tg", kind="telegram", platform_settings={
            "bot_token": TOKEN, "webhook_secret": SECRET, "api_base": fake.url})
        web, url = web_server()
        procs = [web, worker()]
        try:
            chats = [9_000_000 + i for i in range(int(rate * seconds))]
            statuses = post_at_rate(_Web(url), "tg", chats, rate=rate, threads=8)
            accepted = statuses.count(200)
            wait_until(lambda: len(fake.sent_messages()) >= accepted, 60 + accepted / 20, "every reply delivered")
        finally:
            for proc in procs:
                stop(proc)
        sends = sorted(c.at for c in fake.calls("sendMessage"))
        accepted_sends = len(fake.sent_messages())
        # The steady drain: from the 100th send to the last (the first second's start-up aside).
        skip = min(len(sends) // 10, 100)
        window = sends[-1] - sends[skip]
        per_second = (accepted_sends - skip) / window if window > 0 else 0.0
        intake_end = sends[0] + seconds
        during_intake = sum(1 for t in fake.flood_times if t <= intake_end)
        labelled = OutboundMessage.objects.filter(needs_marker=True).count()
        flood_share = fake.floods / max(len(sends), 1)
    report("paced", f"{accepted} new chats at {rate}/s against a Bot API keeping Telegram's limits: drained at "
                    f"{per_second:.1f} sends/s vs the limit it enforced, {limits.per_bot}/s: ratio "
                    f"{per_second / limits.per_bot:.2f} (target >= 28/s: {'met' if per_second >= 28 else 'NOT MET'}); "
                    f"429s {fake.floods} of {len(sends)} sends = {100 * flood_share:.2f}% ({during_intake} while the "
                    f"intake ran; target <= 1%: "
                    f"{'met' if flood_share <= 0.01 else 'NOT MET'}); labelled {labelled} of {accepted_sends} "
                    f"(target 0: {'met' if labelled == 0 else 'NOT MET'})")


class _Web:
    """What post_at_rate needs of a web process: its URL."""

    def __init__(self, url):
        self.url = url
