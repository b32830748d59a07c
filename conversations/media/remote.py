"""Files given by an `https` URL (the API channel's `media_url`), fetched by the worker
under an SSRF policy — never on the request path, and never from a place inside our
own network unless the channel names that host:

- only `https`, a host, no user-info, printable ASCII (checked at admission: `check_url`,
  a 400; the API's schema says the same as URL_PATTERN);
- the host is resolved and *every* address it resolves to is checked: loopback,
  private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, where cloud
  metadata lives; fe80::/10), multicast, unspecified and every other non-public address
  is refused, an IPv6 one carrying an IPv4 address (NAT64, 6to4, Teredo…) judged by
  that one (agentloop.core.addresses) — unless the host is in the channel's
  `allowed_media_hosts`;
- the connection goes to the address that was checked (pinned: no second lookup a
  rebinding DNS server could answer differently), while TLS verifies the certificate
  against the host's name (SNI) and `Host` names it too;
- redirects are followed (at most MAX_REDIRECTS), each to an `https` URL checked the
  same way; no proxy from the environment;
- the size cap and the overall deadline of every download (download.read_body).

A refusal is permanent: the file settles as failed, and the model is told why
("refused: the address is private (files.example)")."""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import re
import socket
import ssl
from collections.abc import Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

import httpx
from django.conf import settings

from agentloop.core.addresses import address_problem  # the policy's judge of one address (also tools.mcp's)
from agentloop.core.redaction import redact, url_secrets
from agentloop.core.tls import shared_tls_context, tls_context_trusting
from conversations.ingest import MediaRef
from conversations.media.download import FileUnavailable, read_body
from conversations.media.uploads import kind_of

MAX_URL_CHARS = 500  # MediaFile.ref
MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


class Refused(FileUnavailable):
    """The policy will not fetch this URL: for good."""

    def __init__(self, why: str):
        super().__init__(f"refused: {why}", permanent=True)


@dataclass(frozen=True)
class Target:
    url: str
    host: str  # as in the URL, lowercased, without brackets
    port: int


PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# What a media_url is, in the OpenAPI schema's words too (the API's schema states it): https,
# a host (a name, an IPv4 address, an IPv6 one in brackets), a port, a path of printable
# ASCII (anything else percent-encoded). No user-info: "@" cannot be in the host.
URL_PATTERN = rf"^https://(?:[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?|\[[0-9A-Fa-f:.]+\])(?::{PORT})?(?:[/?#][!-~]*)?$"
_URL = re.compile(URL_PATTERN)


def check_url(url: str) -> Target:
    """The URL's parts, or ValueError saying what is wrong with it (judged without any
    lookup: at admission, and again for every redirect)."""
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise ValueError("the URL has spaces or control characters in it")
    if not url.startswith("https://"):
        raise ValueError("only https URLs are fetched (it must begin with https://)")
    if "@" in re.split(r"[/?#]", url[len("https://"):], maxsplit=1)[0]:
        raise ValueError("the URL must not carry a user name or password")
    if not _URL.fullmatch(url):
        raise ValueError("the URL is malformed: https://host[:port]/path, with the path in printable ASCII "
                         "(anything else percent-encoded)")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 443
    except ValueError:  # an address in brackets that is not one
        return Target(url=url, host="", port=443)
    return Target(url=url, host=(host or "").lower(), port=port)


def kind_and_name(url: str) -> tuple[str, str]:
    """The message's media kind guessed from the URL's file name (only its mark in the
    text: what the file *is* is read from its bytes once fetched), and that name."""
    path = re.split(r"[?#]", url.removeprefix("https://"), maxsplit=1)[0].partition("/")[2]
    name = unquote(path.rsplit("/", 1)[-1])[:255]  # (not urlsplit: it refuses a bad [address])
    mime = mimetypes.guess_type(name)[0] or ""
    return (kind_of(mime) if mime else "document"), name


def media_ref(url: str, kind: str = "") -> MediaRef:
    """The MediaRef of a file given by URL: one file per channel per URL (the same URL
    sent again is fetched once)."""
    guessed, name = kind_and_name(url)
    return MediaRef(key=f"url:{hashlib.sha256(url.encode()).hexdigest()}", ref=url, kind=kind or guessed,
                    file_name=name)


async def pinned_address(target: Target, allowed_hosts: Collection[str]) -> str:
    """The address to connect to: the host's first, once every one it resolves to is
    public (or the host is allowed)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FileUnavailable(f"the host {target.host} could not be resolved ({exc.strerror})") from None
    addresses = [str(info[4][0]) for info in found]  # an IP address's text (an int only for AF_UNIX-like families)
    if not addresses:
        raise FileUnavailable(f"the host {target.host} has no address")
    if target.host not in allowed_hosts:
        for address in addresses:
            if why := address_problem(address):
                raise Refused(f"{why} ({target.host})")
    return addresses[0]


def tls_context() -> ssl.SSLContext:
    bundle = settings.AGENTLOOP_MEDIA_URL_CA_BUNDLE
    return tls_context_trusting(str(bundle)) if bundle else shared_tls_context()


async def fetch_url(url: str, limit: int, deadline: float, allowed_hosts: Collection[object] = ()) -> bytes:
    """The bytes at `url`, at most `limit` of them, within `deadline` seconds in all
    (DNS, connection, redirects and reading), under the policy above."""
    allowed = {str(h).lower() for h in allowed_hosts}
    secrets = url_secrets(url)
    try:
        return await asyncio.wait_for(_follow(url, limit, deadline, allowed), deadline)
    except TimeoutError:
        raise FileUnavailable(f"the download did not finish within {deadline:g} s") from None
    except httpx.HTTPError as exc:
        raise FileUnavailable(redact(f"the download failed: {type(exc).__name__}: {exc}", secrets)) from None


async def _follow(url: str, limit: int, deadline: float, allowed: Collection[str]) -> bytes:
    async with httpx.AsyncClient(timeout=deadline, follow_redirects=False, trust_env=False, verify=tls_context(),
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for hop in range(MAX_REDIRECTS + 1):
            try:
                target = check_url(url)
            except ValueError as exc:
                raise Refused(f"{'a redirect: ' if hop else ''}{exc}") from None
            if not target.host:
                raise Refused("the URL's host is not an address")
            address = await pinned_address(target, allowed)
            async with _get(client, target, address) as response:
                location = response.headers.get("location")
                if response.status_code not in REDIRECTS or not location:
                    return await read_body(response, limit, who="the server")
            url = urljoin(url, location)
        raise Refused(f"more than {MAX_REDIRECTS} redirects")


def _get(client: httpx.AsyncClient, target: Target, address: str) -> AbstractAsyncContextManager[httpx.Response]:
    """GET the target's path from `address`, the name in SNI (and the certificate checked
    against it) and in Host."""
    parts = urlsplit(target.url)
    netloc = f"[{address}]" if ":" in address else address
    path = parts.path or "/"
    pinned = f"https://{netloc}:{target.port}{path}" + (f"?{parts.query}" if parts.query else "")
    name = f"[{target.host}]" if ":" in target.host else target.host
    host_header = name if target.port == 443 else f"{name}:{target.port}"
    return client.stream("GET", pinned, headers={"Host": host_header},
                         extensions={"sni_hostname": target.host})
