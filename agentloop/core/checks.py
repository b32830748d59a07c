"""`manage.py check --deploy`: what Django's own deployment checks cannot know about us."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

UNTRUSTED_PROXY = checks.Warning(
    "SECURE_PROXY_SSL_HEADER says a proxy is in front, but AGENTLOOP_TRUSTED_PROXIES is empty: "
    "the web server sees every client at the proxy's address, and five wrong admin passwords from "
    "anyone lock that username out for everyone.",
    hint="Set AGENTLOOP_TRUSTED_PROXIES to the proxy's address (docs/operations.md, Behind a proxy).",
    id="agentloop.W001")


@checks.register(checks.Tags.security, deploy=True)
def proxy_is_trusted(*, app_configs: Sequence[AppConfig] | None, databases: Sequence[str] | None,
                     **kwargs: Any) -> list[checks.CheckMessage]:
    if settings.SECURE_PROXY_SSL_HEADER and not settings.AGENTLOOP_TRUSTED_PROXIES:
        return [UNTRUSTED_PROXY]
    return []
