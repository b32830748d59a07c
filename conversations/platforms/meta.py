"""Meta's plumbing, shared by the platforms Meta runs (WhatsApp, Messenger, Instagram):
not a platform, a module at the platform contract's level (`.importlinter` lets every
platform import it, as base, inbound and webhooks).

- the webhook's verification handshake (GET hub.mode=subscribe, hub.verify_token,
  hub.challenge echoed) and the X-Hub-Signature-256 check of every POST (sha256= and the
  hex HMAC-SHA256 of the raw body keyed by the app secret, compared in constant time);
- the Graph API's HTTP exchange (plain httpx: Meta publishes no maintained Python SDK for
  the WhatsApp Cloud API or the Messenger Send API), one client per event loop;
- the Graph error envelope ({"error": {"message", "type", "code", "error_subcode",
  "error_data", "fbtrace_id"}}) read into a `Fault` and classified into the ledger's
  outcomes: the codes every Graph API shares here, a platform's own tables beside them.

| code | meaning | outcome |
|---|---|---|
| 4, 17, 32, 613, 80002, 80006, 80007, 130429, 131056 | app, user, page, call-rate and business use-case rate limits, throughput | flood: the wait Meta estimates (X-Business-Use-Case-Usage), else FLOOD_BACKOFF |
| the platform's `unreachable` table | the person cannot be reached (blocked, gone, outside the window) | permanent |
| the platform's `refused` table | this message refused (a template) | permanent, the chat stays reachable |
| 190, 0 | the access token expired or is invalid | channel blocked |
| 1, 2, 1200, 131000, any 5xx, 408 | Meta's side | temporary |
| other 4xx | this request refused | permanent ("rejected: …") |
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from conversations import reactions
from conversations.ingest import Admission
from conversations.platforms.inbound import Refused, Request, hmac_sha256, same, signed
from conversations.platforms.webhooks import Answer
from delivery.models import Outcome
from delivery.transports import LoopClients, SendResult

SIGNATURE_HEADER = "X-Hub-Signature-256"
# Graph's rate-limit errors carry no Retry-After; the business use-case header, when Meta
# sends one, estimates the minutes until access is regained. A minute otherwise: it clears
# per-second and pair limits with room to spare. A flood wait is not a resend.
FLOOD_BACKOFF = 60.0
FLOOD_CODES = frozenset({4, 17, 32, 613, 80002, 80006, 80007, 130429, 131056})
TEMPORARY_CODES = frozenset({1, 2, 1200, 131000})
# The token is dead: every send of the channel would fail alike until an operator replaces
# it, so the channel is blocked (its rows wait, no attempt spent).
TOKEN_DEAD_CODES = frozenset({0, 190})
USAGE_HEADERS = ("x-business-use-case-usage", "x-page-usage", "x-app-usage")


# --- the webhook ---------------------------------------------------------------------------


def signature(app_secret: str, body: bytes) -> str:
    """What X-Hub-Signature-256 holds: "sha256=" and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac_sha256(app_secret, body)


def verify_signature(request: Request, app_secret: str) -> Answer | None:
    """None for a POST Meta signed with this app's secret; else 401 (no header), 403 (a
    wrong one, or no secret configured), 413 (the body was too large to check)."""
    return signed(request, SIGNATURE_HEADER, app_secret, "--app-secret", "app secret",
                  lambda body: signature(app_secret, body))


def counted(ignored: int, results: list[object], other: Callable[[object], str]) -> Answer:
    """What became of a webhook body's items, counted (a Meta platform's 200): admitted,
    duplicates, refused, ignored, reactions; `other` names the platform's own results (a
    receipt's outcome, a tap's status)."""
    tally = {"admitted": 0, "duplicates": 0, "refused": 0, "ignored": ignored}
    for result in results:
        add = 1
        if isinstance(result, Refused):
            key = "refused"
        elif isinstance(result, Admission):
            key = "duplicates" if result.duplicate else "admitted"
        elif isinstance(result, reactions.ReactionResult):  # a note for the next turn, or a question answered
            key = "ignored" if result.outcome == reactions.IGNORED else "reactions"  # not on a message of ours
            add = int(not result.duplicate)
        else:
            key = other(result)
        tally[key] = tally.get(key, 0) + add
    return Answer(200, {"ok": True, **tally})


def handshake(verify_token: str, query: Mapping[str, str]) -> Answer:
    """Meta's verification of a webhook's address: hub.mode=subscribe and our verify token
    (compared in constant time) → the hub.challenge echoed as text; anything else 403."""
    if verify_token and query.get("hub.mode") == "subscribe" and same(verify_token, query.get("hub.verify_token", "")):
        return Answer(200, query.get("hub.challenge", ""))
    return Answer(403, "verification refused")


# --- the Graph API's answers ---------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A refusal as the Graph API wrote it."""

    status: int
    code: int | None
    subcode: int | None
    said: str  # "HTTP 400, code 10: (#10) … (details)", for the ledger's error text
    regain_after: float | None = None  # seconds, from a usage header; None: not said


def fault_of(status: int, answer: Any, headers: Mapping[str, str] | None = None) -> Fault:
    """The Graph error envelope read defensively (any part may be missing or mistyped)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code") if isinstance(error.get("code"), int) else None
    subcode = error.get("error_subcode") if isinstance(error.get("error_subcode"), int) else None
    data = error.get("error_data")
    details = data.get("details") if isinstance(data, dict) else ""
    said = f"HTTP {status}" + (f", code {code}" if code is not None else "") + \
        (f"/{subcode}" if subcode is not None else "") + \
        (f": {error.get('message')}" if error.get("message") else "") + (f" ({details})" if details else "")
    return Fault(status, code, subcode, said, regain_after(headers or {}))


def regain_after(headers: Mapping[str, str]) -> float | None:
    """The longest `estimated_time_to_regain_access` (minutes) in Meta's usage headers, in
    seconds; None when no header says (or says 0)."""
    longest = 0.0
    for name in USAGE_HEADERS:
        raw = headers.get(name)
        if not raw:
            continue
        try:
            usage = json.loads(raw)
        except ValueError:
            continue
        entries = [e for v in usage.values() if isinstance(v, list) for e in v] if isinstance(usage, dict) else []
        for entry in [*entries, usage]:
            minutes = entry.get("estimated_time_to_regain_access") if isinstance(entry, dict) else None
            if isinstance(minutes, int | float) and not isinstance(minutes, bool) and 0 < minutes < 24 * 60:
                longest = max(longest, float(minutes) * 60)
    return longest or None


def lookup(table: Mapping[Any, str], fault: Fault) -> str | None:
    """A table's entry for (code, subcode), else for the code alone."""
    if fault.code is None:
        return None
    return table.get((fault.code, fault.subcode)) or table.get(fault.code)


def outcome(failed: Callable[..., SendResult], fault: Fault, unreachable: Mapping[Any, str],
            refused: Mapping[Any, str] | None = None) -> SendResult:
    """A refusal's outcome (the table in the module's docstring). `failed`: the
    transport's own (it masks the channel's secrets in the text it writes)."""
    if fault.code in FLOOD_CODES or (fault.code is None and fault.status == 429):
        wait = fault.regain_after or FLOOD_BACKOFF
        return failed(Outcome.FLOOD, f"rate limited, retried in {wait:g} s: {fault.said}", wait)
    gone = lookup(unreachable, fault)
    if gone:
        return failed(Outcome.PERMANENT, f"{gone} — {fault.said}")
    wrong = lookup(refused or {}, fault)
    if wrong:
        return failed(Outcome.PERMANENT, f"{wrong} — {fault.said}", chat_unreachable=False)
    if fault.code in TOKEN_DEAD_CODES:
        return failed(Outcome.CHANNEL_BLOCKED, f"the access token was refused (replace it): {fault.said}")
    if fault.code in TEMPORARY_CODES or fault.status >= 500 or fault.status == 408:
        return failed(Outcome.TEMPORARY, fault.said)
    return failed(Outcome.PERMANENT, f"rejected: {fault.said}")


# --- the HTTP exchange -----------------------------------------------------------------------

_clients = LoopClients()  # one httpx client per event loop, shared by Meta's platforms


def client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()


@dataclass(frozen=True)
class Exchanged:
    """One answer of the Graph API: its status, its JSON (None: not JSON), its headers."""

    status: int
    body: Any
    headers: Mapping[str, str]


async def call(method: str, url: str, token: str, timeout: float, extensions: dict[str, Any] | None = None,
               **kwargs: Any) -> Exchanged:
    """One request with the bearer token (never in the URL, where logs would keep it)."""
    response = await client().request(method, url, timeout=timeout, extensions=extensions,
                                      headers={"Authorization": f"Bearer {token}"}, **kwargs)
    try:
        body = response.json()
    except ValueError:
        body = None
    return Exchanged(response.status_code, body, {k.lower(): v for k, v in response.headers.items()})
