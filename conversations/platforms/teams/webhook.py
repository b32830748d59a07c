"""The bot's messaging endpoint: /webhooks/teams/<slug>/ (the Azure Bot's "Messaging
endpoint").

Every activity carries `Authorization: Bearer <JWT>` (verify.claims): none, or a token
that fails (signature, key, expiry, audience, issuer, endorsement, serviceUrl) → 401; a
channel without an app id to check it for → 403; the identity provider unreachable →
503; nothing is stored before the check passes. Then the body: over
AGENTLOOP_MAX_BODY_BYTES → 413, not an activity → 400.

Activities: a message is admitted through the same ingest as any platform's (dedup by
its activity id, windows, double texting, control commands), a messageUpdate applied as
an edit, a messageDelete as a deletion, each answered 200 `{}` once its transaction
committed — every reply goes through the ledger, whatever happens to the request. An
`adaptiveCard/action` invoke (a question's button) is decided and answered at once with
its invokeResponse (cards.invoked); a `fileConsent/invoke` (a file's consent card
accepted or declined) uploads the file once (files.consented) and is answered 200 `{}`;
other invokes 200 `{}`; anything else (members added,
typing, reactions) is acknowledged. A failure of ours answers 500: the Connector retries,
and the dedup makes the retry safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conversations.deletions import DeletionResult
from conversations.edits import EditResult
from conversations.ingest import Admission
from conversations.platforms.inbound import Parsed, Received, Refused, Request, Webhook, missing, unconfigured
from conversations.platforms.teams import activities, verify
from conversations.platforms.teams.cards import ACTION, invoked
from conversations.platforms.teams.files import CONSENT_INVOKE, consented
from conversations.platforms.webhooks import Answer, error

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

ACKNOWLEDGED = Answer(200, {})


class TeamsActivities(Webhook):
    refusal_source = "teams activities"

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        app_id = str(channel.setting("app_id") or "")
        if not app_id:
            return unconfigured("app_id", "--app-id")
        supplied = request.header("Authorization") or ""
        scheme, _, token = supplied.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return missing("Authorization: Bearer")
        channel_id, service_url = activities.peek(request.body)
        try:
            verify.claims(token.strip(), app_id, str(channel.setting("openid_metadata_url")), channel_id, service_url)
        except verify.Refused as exc:
            return error(401, f"the bearer token is not the Bot Connector's for this bot: {exc}")
        except verify.Unavailable as exc:
            return error(503, str(exc))
        return None

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            activity = activities.read(request.body or b"")
        except activities.NotAnActivity as exc:
            return error(400, f"not a Bot Connector activity: {exc}")
        if activity.type == activities.INVOKE:
            if activity.name == CONSENT_INVOKE:
                return Answer(200, consented(channel, activity))
            return Answer(200, invoked(channel, activity)) if activity.name == ACTION else ACKNOWLEDGED
        found = activities.parse(activity)
        if isinstance(found, activities.Ignored):
            return error(400, f"not a whole Teams activity: {found.why}") if found.why == "incomplete" \
                else ACKNOWLEDGED
        items: list[object] = [*found] if isinstance(found, list) else [found]
        return Parsed(items)

    def answer(self, received: Received, results: list[object]) -> Answer:
        """`{}` whatever became of the items (posting nothing): the reply is the ledger's."""
        for result in results:
            if not isinstance(result, (Refused, Admission, EditResult, DeletionResult)):
                raise TypeError(f"no answer for {result!r}")
        return ACKNOWLEDGED
