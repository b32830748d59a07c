"""The question that asks a conversation's own user to confirm a proposal (`approval =
user`; tools.confirmations takes the answer): written with the proposal, in its
transaction, and withdrawn when the proposal expires unanswered.

Below the guard: the guard opens and expires proposals (tools.guard.proposals), so the
question it asks and withdraws stands under it; the answer, which applies or rejects the
proposal through tools.approvals, stands above both (tools.confirmations).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone, translation
from django.utils.translation import gettext as _

from agentloop.core import languages
from delivery import ledger
from delivery.models import OutboundKind
from tools import fingerprint
from tools.models import ActionClaim, Confirmation, Proposal, ProposalState

if TYPE_CHECKING:
    from tools.conversation_side import Channel


def ask(proposal: Proposal, claim: ActionClaim) -> Confirmation | None:
    """Called inside the proposal's transaction: the question exists exactly when the
    proposal does, and the ledger sends it at least once."""
    if claim.conversation_id is None:
        return None  # no chat to ask in: an operator decides, as under `operator`
    confirmation = Confirmation(proposal=proposal, conversation_id=claim.conversation_id, asked_at=proposal.created_at)
    try:
        # conversations' Conversation, through the confirmation's own foreign key (tools
        # cannot import the app above it; the schema already declares that it points there).
        conversation = confirmation.conversation
    except ObjectDoesNotExist:
        return None  # the conversation is gone
    with translation.override(languages.for_conversation(conversation)):
        text = question_text(claim, conversation.channel)
    confirmation.text = text
    confirmation.save(force_insert=True)
    row = ledger.enqueue(conversation, text, kind=OutboundKind.NOTICE)
    Confirmation.objects.filter(pk=confirmation.pk).update(question=row)
    confirmation.question = row
    return confirmation


def has_buttons(channel: Channel) -> bool:
    return channel.platform.has_buttons


def question_text(claim: ActionClaim, channel: Channel) -> str:
    text = _("Please confirm: %(action)s.") % {"action": describe(claim.action, claim.arguments)}
    if has_buttons(channel):
        return text
    return text + "\n" + _("Reply yes or no.")


def describe(action: str, arguments: dict[str, Any] | None) -> str:
    """What the action will do, in plain words (the dashboard shows the same call as JSON),
    in the active language."""
    args = arguments or {}
    if action == "calendar_create_event":
        text = _("create the calendar event “%(title)s” on %(when)s") % {
            "title": args.get("title", ""), "when": _when(args.get("start_datetime"))}
        if args.get("end_datetime"):
            text += " " + _("until %(when)s") % {"when": _when(args["end_datetime"])}
        if args.get("location"):
            text += " " + _("at %(place)s") % {"place": args["location"]}
        return text
    if action == "calendar_delete_event":
        return _("delete the calendar event %(event)s") % {"event": args.get("event_id", "")}
    if action == "email_send":
        to = args.get("to")
        to = ", ".join(to) if isinstance(to, list) else to
        return _("send the email “%(subject)s” to %(to)s") % {"subject": args.get("subject", ""), "to": to}
    shown = ", ".join(f"{k}: {v}" for k, v in args.items() if not isinstance(v, (dict, list)))
    return action.replace("_", " ") + (f" ({shown})" if shown else "")


def _when(value: object) -> str:
    try:
        moment = fingerprint.parse_moment(value).astimezone(fingerprint.default_zone())
    except (ValueError, TypeError):
        return str(value)
    return f"{moment:%a} {moment.day} {moment:%b %Y, %H:%M}"


@dataclass(frozen=True)
class Reply:
    """What a tap gets: `toast` for the tapper (answerCallbackQuery), `outcome` the
    question's new text ("" = leave it), `status` for the webhook's answer and logs."""

    status: str
    toast: str
    outcome: str = ""


def _local(moment: datetime | None) -> str:
    return timezone.localtime(moment, fingerprint.default_zone()).strftime("%H:%M") if moment else "?"


def reply_to_tap(confirmation: Confirmation, proposal: Proposal, won: bool) -> Reply:
    """What a tap is told and the question becomes, in the chat's language."""
    with translation.override(languages.for_conversation(confirmation.conversation)):
        return _outcome(confirmation.text, proposal, won)


def _outcome(question: str, proposal: Proposal, won: bool) -> Reply:
    at = _local(proposal.decided_at)
    state = proposal.state
    if state == ProposalState.EXPIRED:
        when = _local(proposal.expires_at)
        return Reply("expired", _("This request expired at %(time)s; nothing was done.") % {"time": when},
                     f"{question}\n\n" + _("⌛ Expired at %(time)s: not done.") % {"time": when})
    if state == ProposalState.REJECTED:
        return Reply("rejected" if won else "already_rejected",
                     _("OK, it will not be done.") if won else _("Already declined at %(time)s.") % {"time": at},
                     f"{question}\n\n" + _("❌ Declined at %(time)s: not done.") % {"time": at})
    if not won:
        return Reply("already_confirmed", _("Already confirmed at %(time)s.") % {"time": at},
                     _confirmed_line(question, proposal, at))
    toasts: dict[str, str] = {
        ProposalState.APPLIED: _("Done ✅"), ProposalState.FAILED: _("Confirmed, but it could not be done."),
        ProposalState.APPLYING: _("Confirmed; checking whether it went through.")}
    toast = toasts.get(state, _("Confirmed."))
    return Reply("confirmed", toast, _confirmed_line(question, proposal, at))


def _confirmed_line(question: str, proposal: Proposal, at: str) -> str:
    if proposal.state == ProposalState.APPLIED:
        line = _("✅ Confirmed at %(time)s: done.")
    elif proposal.state == ProposalState.FAILED:
        line = _("⚠️ Confirmed at %(time)s, but it could not be done.")
    else:
        line = _("⏳ Confirmed at %(time)s; checking whether it was done.")
    return f"{question}\n\n" + line % {"time": at}


def withdraw_question(proposal_id: int) -> None:
    """A question whose proposal expired unanswered (the guard's sweep) loses its buttons
    and says so, in the chat; best effort (a later tap is told the same)."""
    confirmation = (Confirmation.objects.select_related("question", "conversation__channel", "proposal")
                    .filter(proposal_id=proposal_id).first())
    if confirmation is None or confirmation.proposal.state != ProposalState.EXPIRED:
        return
    channel = confirmation.conversation.channel
    outcome = reply_to_tap(confirmation, confirmation.proposal, False).outcome
    channel.platform.question_decided(channel, confirmation, outcome, "expired")

