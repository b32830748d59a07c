"""The bearer token on every activity the Bot Connector POSTs to the bot's messaging
endpoint, verified as Microsoft documents it ("Authenticate requests from the Bot
Connector service to your bot"), with PyJWT:

1. the OpenID metadata document (its `issuer` and `jwks_uri`) and the signing keys it
   names are fetched under one overall deadline, at most MAX_BYTES each, and kept
   KEYS_MAX_AGE seconds (Microsoft: refresh at least once a day); a token naming a key id
   they lack fetches them again (the keys roll), at most once per REFETCH_EVERY seconds
   so that made-up key ids cannot make us hammer the identity provider;
2. the token: RS256, signed by the key its `kid` names; `iss` the metadata's issuer
   (https://api.botframework.com); `aud` the bot's app id; `exp`/`nbf` within
   CLOCK_SKEW (Microsoft allows 5 minutes);
3. the key's `endorsements`, when it has some, name the activity's channelId ("msteams");
4. the token's `serviceUrl` claim equals the activity's serviceUrl.

Not the SDK's JwtTokenValidator: see the package's docstring."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
import jwt

from agentloop.core.caches import BoundedCache
from agentloop.core.tls import shared_tls_context

DEADLINE = 5.0  # seconds, each fetch whole
MAX_BYTES = 256 * 1024
KEYS_MAX_AGE = 3600.0
REFETCH_EVERY = 30.0
CLOCK_SKEW = 300  # seconds: Microsoft's documented tolerance

_documents: BoundedCache[str, dict[str, Any]] = BoundedCache(maxsize=32, max_age=KEYS_MAX_AGE)
_fetched_at: BoundedCache[str, float] = BoundedCache(maxsize=32)
_fetching = threading.Lock()


class Refused(Exception):
    """The token is not the Bot Connector's for this bot (the reason, for the 401)."""


class Unavailable(Exception):
    """The metadata or the keys could not be fetched (503: nothing was admitted, the Bot
    Connector sends the activity again)."""


def claims(token: str, app_id: str, metadata_url: str, channel_id: str = "", service_url: str = "") -> Mapping[str, Any]:
    """The token's verified claims for an activity of `channel_id` from `service_url`;
    raises Refused (or Unavailable)."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise Refused(f"not a JWT: {exc}") from None
    if header.get("alg") != "RS256":
        raise Refused(f"algorithm {str(header.get('alg'))[:20]!r} is not RS256")
    kid = str(header.get("kid") or "")
    metadata = document(metadata_url)
    issuer, keys_url = str(metadata.get("issuer") or ""), str(metadata.get("jwks_uri") or "")
    if not issuer or not keys_url:
        raise Unavailable("the OpenID metadata names no issuer or jwks_uri")
    key = signing_key(keys_url, kid)
    if key is None:
        raise Refused(f"no signing key {kid[:60]!r} in the published keys")
    try:
        found: dict[str, Any] = jwt.decode(
            token, jwt.PyJWK(key).key, algorithms=["RS256"], audience=app_id, issuer=issuer, leeway=CLOCK_SKEW,
            options={"require": ["exp", "iss", "aud"]})
    except (jwt.PyJWTError, ValueError) as exc:
        raise Refused(str(exc)[:200]) from None
    endorsements = key.get("endorsements")
    if isinstance(endorsements, list) and channel_id and channel_id not in endorsements:
        raise Refused(f"the signing key does not endorse the channel {channel_id[:40]!r}")
    claimed = str(found.get("serviceUrl") or found.get("serviceurl") or "")
    if service_url and claimed.rstrip("/") != service_url.rstrip("/"):
        raise Refused("the token's serviceUrl is not the activity's")
    return found


def signing_key(keys_url: str, kid: str) -> dict[str, Any] | None:
    """The JWK `kid` names among those published at `keys_url`; fetched again (not more
    often than REFETCH_EVERY) when it is not among them."""
    key = _key_in(_documents.get(keys_url), kid)
    if key is not None:
        return key
    with _fetching:
        held = _documents.get(keys_url)
        key = _key_in(held, kid)
        if key is not None:
            return key
        last = _fetched_at.get(keys_url)
        if held is not None and last is not None and time.monotonic() - last < REFETCH_EVERY:
            return None  # an unknown key id: refused, no new fetch
        _fetched_at.set(keys_url, time.monotonic())
        return _key_in(_documents.set(keys_url, fetch(keys_url)), kid)


def _key_in(keys: dict[str, Any] | None, kid: str) -> dict[str, Any] | None:
    for key in (keys or {}).get("keys") or []:
        if isinstance(key, dict) and key.get("kid") == kid:
            return key
    return None


def document(url: str) -> dict[str, Any]:
    """The OpenID metadata at `url`, cached."""
    held = _documents.get(url)
    if held is None:
        with _fetching:
            held = _documents.get(url) or _documents.set(url, fetch(url))
    return held


def fetch(url: str) -> dict[str, Any]:
    """GET a JSON document under one overall deadline and a size limit."""
    ends = time.monotonic() + DEADLINE
    data = b""
    try:
        with httpx.Client(timeout=DEADLINE, verify=shared_tls_context()) as client, \
                client.stream("GET", url) as response:
            for piece in response.iter_bytes():
                data += piece
                if len(data) > MAX_BYTES or time.monotonic() > ends:
                    raise Unavailable(f"{url} too large or too slow")
            status = response.status_code
    except httpx.HTTPError as exc:
        raise Unavailable(f"{url} could not be fetched: {type(exc).__name__}") from None
    if status != 200:
        raise Unavailable(f"{url} answered HTTP {status}")
    try:
        found = json.loads(data)
    except ValueError:
        raise Unavailable(f"{url} is not JSON") from None
    if not isinstance(found, dict):
        raise Unavailable(f"{url} is not a JSON object")
    return found


def forget() -> None:
    """Drop the cached documents (tests; a key roll needs none of it)."""
    for cache in (_documents, _fetched_at):
        cache.clear()
