"""The bearer token on every request Google Chat sends to the app's endpoint, verified
as Google documents it ("Verify requests from Google Chat"), with google-auth:

- Authentication Audience "HTTP endpoint URL": an OIDC ID token signed by Google
  (issuer accounts.google.com, Google's OAuth 2 certificates), `aud` the endpoint's URL,
  `email` chat@system.gserviceaccount.com, verified;
- "Project number": a JWT signed by chat@system.gserviceaccount.com (its issuer, and its
  own x509 certificates), `aud` the project number.

Either way the signature, the expiry and the audience are google-auth's
(`id_token.verify_token`), the issuer ours. The certificates are fetched under one
overall deadline, at most CERTS_MAX_BYTES of them, and kept CERTS_MAX_AGE seconds; a
token naming a key id they lack fetches them again (Google rotates its keys), at most
once per REFETCH_EVERY seconds so that made-up key ids cannot make us hammer Google.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from google.auth import exceptions as google_exceptions
from google.auth import jwt, transport
from google.oauth2 import id_token

from agentloop.core.caches import BoundedCache

CHAT_ISSUER = "chat@system.gserviceaccount.com"
CHAT_CERTS = "https://www.googleapis.com/service_accounts/v1/metadata/x509/chat@system.gserviceaccount.com"
GOOGLE_CERTS = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
CERTS_DEADLINE = 5.0  # seconds, the whole fetch
CERTS_MAX_BYTES = 256 * 1024
CERTS_MAX_AGE = 3600.0  # Google's certificates live for days; a rotated one is fetched by its key id
REFETCH_EVERY = 30.0
CLOCK_SKEW = 30  # seconds of drift allowed on iat and exp

_certs: BoundedCache[str, dict[str, Any]] = BoundedCache(maxsize=16, max_age=CERTS_MAX_AGE)
_fetched_at: BoundedCache[str, float] = BoundedCache(maxsize=16)
_fetching = threading.Lock()


class Refused(Exception):
    """The token is not Google Chat's for this app (the reason, for the 403)."""


class Unavailable(Exception):
    """Google's certificates could not be fetched (the request is refused with a 503:
    nothing was admitted, Chat may send it again)."""


def certs_url_for(audience: str, configured: str = "") -> str:
    if configured:
        return configured
    return GOOGLE_CERTS if audience.startswith(("http://", "https://")) else CHAT_CERTS


def claims(token: str, audience: str, certs_url: str = "") -> Mapping[str, Any]:
    """The token's verified claims; raises Refused (or Unavailable)."""
    by_url = audience.startswith(("http://", "https://"))
    url = certs_url_for(audience, certs_url)
    try:
        kid = jwt.decode_header(token).get("kid")  # type: ignore[no-untyped-call]  # google-auth: untyped; the header only
    except (ValueError, TypeError, google_exceptions.GoogleAuthError) as exc:
        raise Refused(f"not a JWT: {exc}") from None
    certs = certificates(url, str(kid or ""))
    try:
        found = id_token.verify_token(token, _Served(certs), audience=audience, certs_url=url,
                                      clock_skew_in_seconds=CLOCK_SKEW)
    except (ValueError, google_exceptions.GoogleAuthError) as exc:
        raise Refused(str(exc)[:200]) from None
    issuer = str(found.get("iss") or "")
    if by_url:
        if issuer not in GOOGLE_ISSUERS:
            raise Refused(f"issuer {issuer[:80]!r} is not Google's")
        if found.get("email") != CHAT_ISSUER or found.get("email_verified") is not True:
            raise Refused(f"the token is not Google Chat's (email {str(found.get('email'))[:80]!r})")
    elif issuer != CHAT_ISSUER:
        raise Refused(f"issuer {issuer[:80]!r} is not {CHAT_ISSUER}")
    return found


def certificates(url: str, kid: str) -> dict[str, Any]:
    """Google's certificates at `url` ({key id: PEM}), cached; fetched again when `kid`
    is not among them (not more often than REFETCH_EVERY)."""
    held = _certs.get(url)
    if held is not None and (not kid or kid in held):
        return held
    with _fetching:
        held = _certs.get(url)
        if held is not None and (not kid or kid in held):
            return held
        last = _fetched_at.get(url)
        if held is not None and last is not None and time.monotonic() - last < REFETCH_EVERY:
            return held  # a key id they lack: refused by the check, no new fetch
        _fetched_at.set(url, time.monotonic())
        return _certs.set(url, fetch(url))


def fetch(url: str) -> dict[str, Any]:
    """GET the certificates under one overall deadline and a size limit."""
    ends = time.monotonic() + CERTS_DEADLINE
    data = b""
    try:
        with httpx.Client(timeout=CERTS_DEADLINE) as client, client.stream("GET", url) as response:
            for piece in response.iter_bytes():
                data += piece
                if len(data) > CERTS_MAX_BYTES or time.monotonic() > ends:
                    raise Unavailable(f"Google's certificates at {url} too large or too slow")
            status = response.status_code
    except httpx.HTTPError as exc:
        raise Unavailable(f"Google's certificates could not be fetched: {type(exc).__name__}") from None
    if status != 200:
        raise Unavailable(f"Google's certificates answered HTTP {status}")
    try:
        found = json.loads(data)
    except ValueError:
        raise Unavailable("Google's certificates are not JSON") from None
    if not isinstance(found, dict):
        raise Unavailable("Google's certificates are not a JSON object")
    return found


def forget() -> None:
    """Drop the cached certificates (tests; an operator changing keys needs none of it)."""
    for cache in (_certs, _fetched_at):
        cache.clear()


class _Response(transport.Response):
    def __init__(self, data: bytes) -> None:
        self._data = data

    @property
    def status(self) -> int:
        return 200

    @property
    def headers(self) -> dict[str, str]:
        return {"content-type": "application/json"}

    @property
    def data(self) -> bytes:
        return self._data


class _Served(transport.Request):
    """google-auth's HTTP request, answered with the certificates already fetched (the
    fetch is ours: deadline, size limit, cache)."""

    def __init__(self, certs: dict[str, Any]) -> None:
        self._data = json.dumps(certs).encode()

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                 timeout: Any = None, **kwargs: Any) -> _Response:
        return _Response(self._data)
