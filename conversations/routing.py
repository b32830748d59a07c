"""Routing rules: which agent answers a turn (docs/routing.md).

A channel's rules (RoutingRule, edited inline on the channel's admin page) are tried in
order when a buffer is flushed into a turn (conversations.flushing): the first whose
every set criterion matches the burst — its chat, its thread or topic, a keyword in its
text, the sender's language, an attribute of the contact — chooses the agent and its
configuration; no rule matching, the channel's own agent answers. The turn records the
rule and why it matched (`Turn.routing_rule`, `Turn.route`), which the story page shows.

An agent hands its conversation to another with the guarded `handoff_to_agent` tool
(conversations.handoff_tools): the conversation is pinned to that rule's agent
(`Conversation.pinned_rule`), whatever the rules say, until /reset.

The rules are read through a small per-process cache (at most two seconds old, as the
channels are): a flush reads no table for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from agentloop.core.caches import BoundedCache
from audit.events import record
from audit.models import EventKind
from conversations.models import Contact, Conversation, RoutingRule

if TYPE_CHECKING:
    from conversations.models import Channel, InboundMessage, Turn

CACHE_SECONDS = 2.0
_rules: BoundedCache[int, list[RoutingRule]] = BoundedCache(maxsize=1000, max_age=CACHE_SECONDS)


def rules_of(channel_id: int) -> list[RoutingRule]:
    """The channel's rules in order (from the cache)."""
    found = _rules.get(channel_id)
    if found is None:
        found = _rules.set(channel_id, list(RoutingRule.objects.filter(channel_id=channel_id)
                                            .order_by("position", "pk")))
    return found


def forget_cached() -> None:
    _rules.clear()


def choose(conversation: Conversation,
           messages: Sequence[InboundMessage]) -> tuple[RoutingRule | None, str | None]:
    """(the rule, why) that routes this burst, or (None, None): the channel's own agent."""
    rules = rules_of(conversation.channel_id)
    if not rules:
        return None, None
    if conversation.pinned_rule_id is not None:
        pinned = next((rule for rule in rules if rule.pk == conversation.pinned_rule_id), None)
        if pinned is not None:
            return pinned, f"handed over to {pinned.name}"[:200]
    for rule in rules:
        why = matched(rule, conversation, messages)
        if why:
            return rule, f"rule {rule.name}: {why}"[:200]
    return None, None


def matched(rule: RoutingRule, conversation: Conversation, messages: Sequence[InboundMessage]) -> str:
    """Why `rule` matches the burst ("" when it does not): every criterion it sets must
    hold, and a rule that sets none matches nothing by itself."""
    reasons = []
    if rule.chat_id:
        if rule.chat_id != conversation.chat_id:
            return ""
        reasons.append(f"chat {rule.chat_id}")
    if rule.thread_id:
        if rule.thread_id != (messages[-1].thread_id if messages else ""):
            return ""
        reasons.append(f"thread {rule.thread_id}")
    if rule.keywords:
        keyword = _keyword_in(rule.keywords, messages)
        if not keyword:
            return ""
        reasons.append(f"keyword {keyword!r}")
    if rule.language:
        if not _same_language(rule.language, conversation.language):
            return ""
        reasons.append(f"language {rule.language}")
    if rule.contact_attribute:
        if not _contact_has(conversation.contact_id, rule.contact_attribute, rule.contact_value):
            return ""
        reasons.append(f"{rule.contact_attribute} {rule.contact_value}")
    return ", ".join(reasons)


def _keyword_in(keywords: str, messages: Sequence[InboundMessage]) -> str:
    texts = [message.text.casefold() for message in messages]
    for keyword in (word.strip() for word in keywords.split(",")):
        if keyword and any(keyword.casefold() in text for text in texts):
            return keyword
    return ""


def _same_language(wanted: str, language: str | None) -> bool:
    """"es" is the language of "es" and "es-AR" (any case, - or _)."""
    wanted, language = wanted.lower().replace("_", "-"), (language or "").lower().replace("_", "-")
    return language == wanted or language.startswith(wanted + "-")


def _contact_has(contact_id: int, attribute: str, value: str) -> bool:
    found = Contact.objects.filter(pk=contact_id).values_list(attribute, flat=True).first()
    return found is not None and str(found).casefold() == value.casefold()


def agent_of(turn: Turn) -> tuple[str, dict[str, Any]]:
    """(agent name, its config) that runs this turn: its rule's, else its channel's. A
    turn's rule is read with it (turns.start_many selects it)."""
    rule = turn.routing_rule if turn.routing_rule_id is not None else None
    if rule is not None:
        return rule.agent, rule.agent_config or {}
    channel = turn.conversation.channel
    return channel.agent, channel.agent_config


# --- an agent hands the conversation to another (the handoff_to_agent tool) ----------------


class UnknownAgent(LookupError):
    """No rule of the conversation's channel has that name."""


def hand_to_agent(conversation_id: int, agent: str, reason: str = "", by: str = "agent") -> bool:
    """Pin the conversation to the rule named `agent` (its next turns go to that agent
    until /reset), audited. True if this call moved it; False if it was pinned there
    already. Raises UnknownAgent for a name no rule of the channel has."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().select_related("channel").get(pk=conversation_id)
        rule = RoutingRule.objects.filter(channel_id=conversation.channel_id, name=agent).first()
        if rule is None:
            known = RoutingRule.objects.filter(channel_id=conversation.channel_id).values_list("name", flat=True)
            raise UnknownAgent(f"no agent named {agent!r} in this channel; known: {', '.join(known) or 'none'}")
        if conversation.pinned_rule_id == rule.pk:
            return False
        Conversation.objects.filter(pk=conversation_id).update(pinned_rule=rule)
        record(EventKind.AGENT_HANDOFF, conversation=conversation, actor=by, target=f"conversation {conversation_id}",
               summary=reason, to_agent=rule.name, agent=rule.agent)
    return True


def hand_over_for_tool(conversation_id: int, agent: str, reason: str = "") -> tuple[bool, str]:
    """hand_to_agent for the tool (conversations.handoff_tools): (moved, "") or (False, why it cannot)."""
    try:
        return hand_to_agent(conversation_id, agent, reason), ""
    except UnknownAgent as exc:
        return False, str(exc)


def unpin(conversation_id: int) -> None:
    """/reset: the conversation's turns go back to the rules."""
    Conversation.objects.filter(pk=conversation_id, pinned_rule__isnull=False).update(pinned_rule=None)


# --- the admin's edits, audited ------------------------------------------------------------


def describe(rule: RoutingRule) -> dict[str, Any]:
    """A rule as its audit event keeps it."""
    return {"name": rule.name, "position": rule.position, "chat_id": rule.chat_id, "thread_id": rule.thread_id,
            "keywords": rule.keywords, "language": rule.language, "contact_attribute": rule.contact_attribute,
            "contact_value": rule.contact_value, "agent": rule.agent}


def record_change(channel: Channel, by: str, added: Sequence[dict[str, Any]] = (),
                  changed: Sequence[dict[str, Any]] = (), deleted: Sequence[dict[str, Any]] = ()) -> None:
    """One audit event for a save of the channel's rules (the admin's inline)."""
    if not (added or changed or deleted):
        return
    names = [*(f"+{r['name']}" for r in added), *(f"~{r['name']}" for r in changed),
             *(f"-{r['name']}" for r in deleted)]
    record(EventKind.ROUTING_CHANGED, channel_slug=channel.slug, actor=by, target=f"channel {channel.slug}",
           summary=" ".join(names), added=list(added), changed=list(changed), deleted=list(deleted))
    forget_cached()
