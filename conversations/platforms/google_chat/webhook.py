"""The app's HTTP endpoint: /webhooks/google_chat/<slug>/ (the Chat API configuration's
"HTTP endpoint URL").

Every request carries `Authorization: Bearer <JWT>` (verify.claims): none → 401; a token
that fails (signature, expiry, audience, issuer), or a channel without an audience to
check it for → 403; Google's certificates unreachable → 503; nothing is stored before the
check passes. Then the body: over AGENTLOOP_MAX_BODY_BYTES → 413, not a JSON event → 400.

Events: MESSAGE is admitted through the same ingest as any platform's (dedup by the
message's name, windows, double texting, control commands; a file uploaded with it is
fetched later by the worker: media.py) and answered `{}` once its
transaction committed — an empty answer posts nothing: every reply goes through the
ledger, whatever happens to the request. CARD_CLICKED (a question's button) is decided
and answered at once (cards.clicked). ADDED_TO_SPACE is acknowledged (its message, when
a mention added the app, admitted like any); REMOVED_FROM_SPACE and anything else are
acknowledged with `{}`. A failure of ours answers 500.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from conversations.ingest import Admission
from conversations.platforms.google_chat import events, verify
from conversations.platforms.google_chat.cards import clicked
from conversations.platforms.inbound import Parsed, Received, Refused, Request, Webhook, missing, unconfigured
from conversations.platforms.webhooks import Answer, error

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

ACKNOWLEDGED = Answer(200, {})


class GoogleChatEvents(Webhook):
    refusal_source = "google chat events"

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        audience = str(channel.setting("audience") or "")
        if not audience:
            return unconfigured("audience", "--audience")
        supplied = request.header("Authorization") or ""
        scheme, _, token = supplied.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return missing("Authorization: Bearer")
        try:
            verify.claims(token.strip(), audience, str(channel.setting("certs_url") or ""))
        except verify.Refused as exc:
            return error(403, f"the bearer token is not Google Chat's for this app: {exc}")
        except verify.Unavailable as exc:
            return error(503, str(exc))
        return None

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            event = json.loads(request.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            return error(400, f"not a Google Chat event: {exc}")
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return error(400, "not a Google Chat event: no 'type'")
        kind: str = event["type"]
        if kind == events.CARD_CLICKED:
            return Answer(200, clicked(channel, event))
        if kind not in (events.MESSAGE, events.ADDED_TO_SPACE) or not isinstance(event.get("message"), dict):
            return ACKNOWLEDGED  # REMOVED_FROM_SPACE, an ADDED_TO_SPACE without a message, …
        found = events.inbound_from(event)
        if isinstance(found, events.Ignored):
            return ACKNOWLEDGED if kind == events.ADDED_TO_SPACE or found.why == "empty" else \
                error(400, f"not a Google Chat message event: {found.why}")
        return Parsed(list(found))

    def answer(self, received: Received, results: list[object]) -> Answer:
        """`{}` whatever became of the message (and of each file it carried: one item
        each), posting nothing: the reply is the ledger's."""
        for result in results:
            if not isinstance(result, (Refused, Admission)):
                raise TypeError(f"no answer for {result!r}")
        return ACKNOWLEDGED
