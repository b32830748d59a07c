"""The proxies whose forwarded headers the web server believes (AGENTLOOP_TRUSTED_PROXIES).

Read by settings, so: the standard library and Django's exceptions only. uvicorn takes
what is given here (agentloop/web_server.py) but reads an entry it cannot parse as a
name to compare literally, silently: an operator's typo (`10.0.0.0/33`, `10.0.0.1/8`)
would trust nobody, or the wrong host, without a word. Here it stops the start instead.
"""

import ipaddress

from django.core.exceptions import ImproperlyConfigured


def trusted_networks(entries: list[str]) -> list[str]:
    """The entries, each an address or a network (CIDR, host bits zero); anything else
    refused at start-up. `*` (believe anyone) is refused too: a client could then be whoever
    it says."""
    trusted = []
    for entry in (item.strip() for item in entries):
        if not entry:
            continue
        try:
            ipaddress.ip_network(entry)
        except ValueError:
            raise ImproperlyConfigured(
                f"AGENTLOOP_TRUSTED_PROXIES: {entry!r} is not an IP address or network "
                "(e.g. 10.0.0.5 or 10.0.0.0/8, host bits zero)") from None
        trusted.append(entry)
    return trusted
