"""Helpers for the SMS (Twilio) tests: a channel pointed at the local fake Twilio API,
its public base URL the one Twilio is said to call (the signature covers it)."""


from conversations.platforms.sms.transport import close_clients
from tests.fakes.twilio_api import ACCOUNT_SID, AUTH_TOKEN, BENCH_PUBLIC, FROM  # noqa: F401  (BENCH_PUBLIC: the bench's)
from tests.support.loops import run_then_close

PUBLIC = "https://sms.example.com"  # behind a proxy: the address Twilio calls, not the one the process sees


def sms_settings(fake, public_base=PUBLIC, **overrides):
    values = {"account_sid": ACCOUNT_SID, "auth_token": AUTH_TOKEN, "from_number": FROM, "public_base": public_base,
              "api_base": fake.url}
    return {**values, **overrides}


def sms_channel(make_channel, fake, slug="sms", public_base=PUBLIC, **fields):
    overrides = {name: fields.pop(name) for name in ("account_sid", "auth_token", "from_number", "api_base",
                                                     "chat_interval", "messages_per_second") if name in fields}
    return make_channel(slug, kind="sms", platform_settings=sms_settings(fake, public_base, **overrides), **fields)


def run(coro):
    """Run a transport's coroutine, then close the SMS clients it opened on that loop."""
    return run_then_close(coro, close_clients)
