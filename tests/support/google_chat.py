"""Helpers for the Google Chat tests: a channel pointed at the local fakes (Chat API,
token endpoint, certificates), its audience the project number."""

from tests.fakes.google_chat_api import PROJECT_NUMBER


def google_chat_settings(fake, **overrides):
    values = {"service_account_key": fake.service_account_key(), "audience": PROJECT_NUMBER,
              "api_base": fake.api_base, "token_uri": fake.token_uri, "certs_url": fake.certs_url("chat")}
    return {**values, **overrides}


def google_chat_channel(make_channel, fake, slug="gc", settings=None, **fields):
    overrides = {name: fields.pop(name) for name in ("audience", "certs_url", "api_base", "token_uri")
                 if name in fields}
    return make_channel(slug, kind="google_chat",
                        platform_settings=settings or google_chat_settings(fake, **overrides), **fields)
