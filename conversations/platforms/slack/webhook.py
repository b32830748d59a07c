"""Slack's request URLs: /webhooks/slack/<slug>/ (the Events API) and
/webhooks/slack/<slug>/interactivity/ (clicks on a question's buttons).

Every request is signed (inbound.signature): no signature or timestamp header → 401;
a wrong signature, a timestamp more than 5 minutes from our clock (a replay), or a
channel without a signing secret → 403; nothing is stored before the check passes.
Then the body: over AGENTLOOP_MAX_BODY_BYTES → 413 (Django's limit), not an envelope →
400.

The Events API's `url_verification` is answered with its challenge; an `event_callback`
is admitted through the same ingest as any platform's (dedup, windows, double texting,
control commands) and answered 200 once its transaction committed — Slack redelivers
anything it got no 2xx for within 3 s, and the redelivery (`X-Slack-Retry-Num`) stops
at the dedup. What we do not act on (bots, our own messages, other subtypes) is
answered 200 too, so Slack stops sending it.
Channel messages that do not mention the app are stored like any other (the channel's
`group_replies` decides at the flush whether they are answered or kept as context).
A failure of ours answers 500 (a database outage 503, the middleware): Slack's retry is
the recovery.

Both URLs are conversations.platforms.inbound webhooks (the steps: find the channel,
authenticate, parse, admit); the Events API's is `lean`: under daphne its POSTs skip
Django's request stack and are admitted in batches (conversations/lean_ingest.py), with
these same answers.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from conversations import deletions, edits, reactions
from conversations.ingest import Admission
from conversations.models import Conversation
from conversations.platforms.inbound import (
    Parsed,
    Received,
    Refused,
    Request,
    Webhook,
    missing,
    same,
    unconfigured,
    wrong,
)
from conversations.platforms.slack import inbound as parsing
from conversations.platforms.slack.buttons import clicked
from conversations.platforms.slack.names import PER_THREAD
from conversations.platforms.webhooks import Answer, error
from delivery.models import OutboundMessage

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel


def check(channel: Channel, signature: str | None, timestamp: str | None, body: bytes | None,
          now: float | None = None) -> Answer | None:
    """None when the request is Slack's, signed with the channel's secret, and fresh;
    else the refusal. `now`: our clock (seconds since the epoch)."""
    secret = channel.setting("signing_secret")
    if not secret:
        return unconfigured("signing secret", "--signing-secret")
    if signature is None or timestamp is None:
        return missing(parsing.SIGNATURE_HEADER, parsing.TIMESTAMP_HEADER)
    if body is None:
        return error(413, "request body too large")
    if not parsing.fresh(timestamp, time.time() if now is None else now):
        return error(403, f"stale {parsing.TIMESTAMP_HEADER}: more than 5 minutes from our clock")
    if not same(parsing.signature(secret, timestamp, body), signature.strip()):
        return wrong(parsing.SIGNATURE_HEADER)
    return None


class SlackRequests(Webhook):
    """What both of Slack's request URLs share: the signature."""

    refusal_source = "slack events"

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        return check(channel, request.header(parsing.SIGNATURE_HEADER), request.header(parsing.TIMESTAMP_HEADER),
                     request.body)


class SlackEvents(SlackRequests):
    """The Events API's request URL: one event an envelope."""

    url_name = "events"
    lean = True

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            envelope = json.loads(request.body or b"")
            if not isinstance(envelope, dict):
                raise ValueError("not an object")
            if envelope.get("type") == "url_verification":
                return Answer(200, {"challenge": str(envelope.get("challenge", ""))})
            if envelope.get("type") != "event_callback":
                return Answer(200, {"ok": True, "admitted": 0, "ignored": [f"type:{envelope.get('type')}"]})
            parsed = parsing.parse(envelope, conversations=channel.setting("conversations"),
                                   bot_in_thread=lambda slack_channel, thread_ts: bot_in_thread(
                                       channel, slack_channel, thread_ts))
        except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
            return error(400, f"not a Slack Events API envelope: {exc}")
        # One event: one of them, or nothing.
        found: list[object] = [*parsed.messages, *parsed.edits, *parsed.deletions, *parsed.reactions]
        if not found:
            return Answer(200, {"ok": True, "admitted": 0, "ignored": parsed.ignored})
        return Parsed(found[:1])

    def answer(self, received: Received, results: list[object]) -> Answer:
        """200 whatever became of the event (Slack would resend it otherwise): a refusal
        is audited, an edit or a deletion of a message we never received audited and ignored."""
        [result] = results
        if isinstance(result, Refused):
            return Answer(200, {"ok": True, "admitted": 0, "refused": result.problem})
        if isinstance(result, reactions.ReactionResult):
            return Answer(200, {"ok": True, "admitted": 0, "reaction": result.outcome, "duplicate": result.duplicate})
        if isinstance(result, deletions.DeletionResult):
            return Answer(200, {"ok": True, "admitted": 0, "deletions": 1, "deletion": result.outcome,
                                "duplicate": result.duplicate})
        if isinstance(result, edits.EditResult):
            return Answer(200, {"ok": True, "admitted": 0, "edits": 1, "edit": result.outcome,
                                "duplicate": result.duplicate})
        if isinstance(result, Admission):
            return Answer(200, {"ok": True, "admitted": int(not result.duplicate), "duplicates": int(result.duplicate)})
        raise TypeError(f"no answer for {result!r}")


class SlackInteractivity(SlackRequests):
    """The interactivity request URL: a click on a question's buttons (`block_actions`),
    form-encoded as `payload=<JSON>`, decided at once (its answer is all there is)."""

    route = "<slug:slug>/interactivity/"
    url_name = "interactivity"

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            payload = json.loads(parse_qs((request.body or b"").decode(), strict_parsing=False).get("payload", [""])[0])
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as exc:
            return error(400, f"not a Slack interaction payload: {exc}")
        if payload.get("type") != "block_actions":
            return Answer(200, "")  # shortcuts, view submissions: nothing of ours
        return Answer(200, {"ok": True, "callback": clicked(channel, payload)})

    def answer(self, received: Received, results: list[object]) -> Answer:
        raise TypeError("a click is answered as it is parsed")


def bot_in_thread(channel: Channel, slack_channel: str, thread_ts: str) -> bool:
    """Whether the app has posted in this thread: a ledger row of this channel's
    conversations in that Slack channel went (or goes) into it. Through the
    conversations (their index on the chat) so only their few rows are read."""
    chats = [slack_channel, parsing.chat_of(slack_channel, thread_ts, thread_ts, PER_THREAD)]
    talks = Conversation.objects.filter(channel=channel, chat_id__in=chats).values("pk")
    return OutboundMessage.objects.filter(conversation_id__in=talks, thread_id=thread_ts).exists()
