"""Helpers for the Teams tests: a channel pointed at the local fakes (identity provider,
token endpoint, Bot Connector), its app id the fake's."""


from conversations.platforms.teams.transport import close_clients
from tests.fakes.teams_api import APP_ID, APP_PASSWORD, TENANT
from tests.support.loops import run_then_close


def teams_settings(fake, **overrides):
    values = {"app_id": APP_ID, "app_password": APP_PASSWORD, "tenant_id": TENANT,
              "openid_metadata_url": fake.openid_url, "token_url": fake.token_url(), "service_url": fake.service_url}
    return {**values, **overrides}


def teams_channel(make_channel, fake, slug="teams", settings=None, **fields):
    overrides = {name: fields.pop(name) for name in ("app_id", "app_password", "tenant_id", "openid_metadata_url",
                                                     "token_url", "service_url", "chat_interval",
                                                     "messages_per_second") if name in fields}
    return make_channel(slug, kind="teams", platform_settings=settings or teams_settings(fake, **overrides), **fields)


def run(coro):
    """Run a transport's coroutine, then close the Teams clients it opened on that loop."""
    return run_then_close(coro, close_clients)
