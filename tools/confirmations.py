"""Confirmation by the user, in the chat, exactly once.

Under a tool policy with `approval = user`, the guard's proposal (tools.approvals) is
also a question to the conversation's own user, written to the delivery ledger in the
proposal's transaction (so it reaches the chat at least once, like a reply):

- Telegram: an inline keyboard, Yes / No. Each button's `callback_data` is
  `c:<token>:y|n`, the token 24 random bytes stored on the Confirmation row: opaque, not
  guessable, 34 bytes (Telegram allows 64). A forged or stale token finds no row and
  applies nothing. The tap is answered with answerCallbackQuery, and the question is
  edited (editMessageText, buttons removed) to show the outcome.
- The web chat (the console's playground): the same buttons on the reply bubble; a tap
  goes back over the page's websocket (agentloop.console.consumers), and the outcome is pushed
  to every page watching the conversation.
- A platform without buttons (WhatsApp): the question ends "Reply yes or no",
  and the conversation's next inbound message, when its whole text is one of the
  answer words below and a question is open, is consumed as the answer (it is stored,
  never given to the agent); anything else is an ordinary message. Not on a platform
  whose messages agent keys post (`api`): the asker could answer, so the guard refuses
  `approval = user` there and an inbound "yes" never answers (an operator decides).

Every answer goes through `approvals.apply` / `approvals.reject`: one compare-and-swap
from pending, so a double tap, a callback Telegram re-delivers, a replayed webhook or
two devices apply the action once; the others are told "Already confirmed at 10:02"
(the deployment's local time, AGENTLOOP_DEFAULT_TIME_ZONE). Only the conversation's
sender may answer (in a group, the person who asked). The decision is audited like an
operator's (actor and decided_by "user:<name> (<platform> <id>)") and reaches the
agent's next turn as a context note, as an operator's does.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction
from django.db.models import F
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from agentloop.core import languages, live
from agentloop.core.redaction import redact
from tools import approvals, guard
from tools.models import Confirmation, ProposalState
from tools.questions import Reply, has_buttons, reply_to_tap

if TYPE_CHECKING:
    from tools.conversation_side import Channel, Conversation

log = logging.getLogger(__name__)

# The whole text of a reply, case-insensitive, trailing "." or "!" allowed. Nothing
# looser: "yes, but tomorrow" is a message for the agent, not an answer.
YES_WORDS = frozenset({"yes", "sí", "si", "sim"})  # the words "Reply yes or no" asks for, in each catalog
NO_WORDS = frozenset({"no", "não", "nao"})
CALLBACK_DATA = re.compile(r"^c:([A-Za-z0-9_-]{16,40}):([yn])$")
TOAST_LIMIT = 200  # a tap's answer (Telegram's answerCallbackQuery text)


# --- asking -------------------------------------------------------------------------------


def buttons(confirmation: Confirmation) -> tuple[tuple[str, str], ...]:
    """Yes / No, in the language of the chat they are shown in."""
    with translation.override(languages.for_conversation(confirmation.conversation)):
        return ((_("✅ Yes, do it"), f"c:{confirmation.token}:y"), (_("❌ No"), f"c:{confirmation.token}:n"))


def buttons_for_rows(row_ids: Iterable[int]) -> dict[int, tuple[tuple[str, str], ...]]:
    """{ledger row id: buttons} for the questions among these rows whose proposal is
    still pending (a question sent late, after an operator decided, goes without)."""
    found = (Confirmation.objects.filter(question_id__in=list(row_ids), proposal__state=ProposalState.PENDING)
             .select_related("conversation__channel"))
    return {c.question_id: buttons(c) for c in found if c.question_id is not None and has_buttons(c.conversation.channel)}


# --- answering ------------------------------------------------------------------------------


def _name(conversation: Conversation) -> str:
    return conversation.contact.display_name or conversation.contact.username or conversation.sender_id


def decided_by(conversation: Conversation, name: str = "") -> str:
    return f"user:{name or _name(conversation)} ({conversation.channel.kind} {conversation.sender_id})"[:150]


def decide(confirmation: Confirmation, yes: bool, *, by: str) -> Reply:
    """Apply or reject the proposal through the operators' compare-and-swap; whoever
    loses the race (a second tap, a re-delivered callback) is told what was decided."""
    Confirmation.objects.filter(pk=confirmation.pk).update(taps=F("taps") + 1, last_tap_at=timezone.now())
    # With buttons the question itself is edited to show the outcome; without, a message says it.
    tell_user = not has_buttons(confirmation.conversation.channel)
    if yes:
        proposal, won = approvals.apply_once(confirmation.proposal_id, by=by, tell_user=tell_user)
    else:
        proposal, won = approvals.reject_once(confirmation.proposal_id, by=by, tell_user=tell_user)
    return reply_to_tap(confirmation, proposal, won)


def _invalid(channel: Channel) -> Reply:
    with translation.override(languages.choose(channel.language)):
        return Reply("invalid", _("This button is no longer valid."))


def tap(channel: Channel, data: str | None, *, sender_id: str, sender_name: str = "",
        chat_id: str = "") -> tuple[Reply, Confirmation | None]:
    """A button's data from a tap: (the reply, the Confirmation or None)."""
    match = CALLBACK_DATA.match(data or "")
    if not match:
        return _invalid(channel), None
    confirmation = (Confirmation.objects.select_related("conversation__contact", "conversation__channel")
                    .filter(token=match[1], conversation__channel_id=channel.pk).first())
    if confirmation is None or (chat_id and chat_id != confirmation.conversation.chat_id):
        log.warning("channel %s: a tap with unknown confirmation data from %s", channel.slug, redact(sender_id)[:50])
        return _invalid(channel), None
    conversation = confirmation.conversation
    if str(sender_id) != conversation.sender_id:
        with translation.override(languages.for_conversation(conversation)):
            toast = _("Only %(name)s can confirm this.") % {"name": _name(conversation)}
        return Reply("not_yours", toast[:TOAST_LIMIT]), confirmation
    reply = decide(confirmation, match[2] == "y", by=decided_by(conversation, sender_name))
    return reply, confirmation


# --- the web chat -----------------------------------------------------------------------------


def handle_webchat_tap(channel: Channel, sender_id: str, sender_name: str, data: str) -> dict[str, Any]:
    """A tap on the playground's buttons, as the logged-in person (their sender id).
    Every page watching the conversation is shown the outcome (two devices agree)."""
    reply, confirmation = tap(channel, data, sender_id=sender_id, sender_name=sender_name)
    answer: dict[str, Any] = {"type": "confirmation", "data": data, "status": reply.status, "text": reply.toast}
    if confirmation is not None and reply.outcome:
        match = CALLBACK_DATA.match(data)
        assert match is not None  # the tap found its confirmation by it
        event = {"kind": "question_decided", "conversation": confirmation.conversation_id, "token": match[1],
                 "text": reply.outcome, "status": reply.status}
        with transaction.atomic():
            live.publish([live.conversation_group(confirmation.conversation_id)], event)
        answer["outcome"] = reply.outcome
    return answer


# --- a reply instead of a tap (platforms without buttons) ---------------------------------------


def answer_word(text: str | None) -> bool | None:
    """True for yes, False for no, None for anything else (the whole text counts)."""
    word = unicodedata.normalize("NFKC", text or "").casefold().strip().rstrip(".!").strip()
    if word in YES_WORDS:
        return True
    if word in NO_WORDS:
        return False
    return None


class Sent(Protocol):
    """An inbound message as an answer reads it (conversations' Message)."""

    @property
    def sender_name(self) -> str: ...


@dataclass
class PendingAnswer:
    """A reply that answers an open question, found while the message is admitted."""

    confirmation: Confirmation
    yes: bool

    def take(self, message: Sent) -> None:
        """The message was new (not a re-delivery): decide once its admission commits,
        outside that transaction (the action must never run in a transaction that could
        still roll back). A crash in between leaves the question open: answer again."""
        confirmation, yes = self.confirmation, self.yes
        by = decided_by(confirmation.conversation, message.sender_name)
        transaction.on_commit(lambda: _decide_logged(confirmation, yes, by))


def _decide_logged(confirmation: Confirmation, yes: bool, by: str) -> None:
    try:
        decide(confirmation, yes, by=by)
    except Exception:
        log.exception("answering confirmation %s failed; the question stays open", confirmation.pk)


def answer_from_text(channel: Channel, conversation: Conversation, text: str | None) -> PendingAnswer | None:
    """On a channel without buttons, a message whose whole text is yes/no while one of the
    conversation's questions is open answers the oldest open one (questions are answered
    in the order they were asked). None: an ordinary message. Cheap for every other
    message: no query unless the text is an answer word."""
    if has_buttons(channel):  # the tap answers there
        return None
    if not guard.user_can_confirm(channel):  # the asker could post this "yes": an operator decides
        return None
    yes = answer_word(text)
    if yes is None:
        return None
    confirmation = (Confirmation.objects.select_related("conversation__contact", "conversation__channel")
                    .filter(conversation_id=conversation.pk, proposal__state=ProposalState.PENDING,
                            proposal__expires_at__gt=timezone.now())
                    .order_by("asked_at", "pk").first())
    return None if confirmation is None else PendingAnswer(confirmation, yes)

