"""The Bot Connector's wire, shared by the transport, the stream and the cards: where an
activity goes, an activity as the Connector takes it (the Agents SDK's model, camelCase,
no empty fields), a message and a question's Adaptive Card."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from microsoft_agents.activity import Activity, Attachment, ChannelAccount, ConversationParameters

CARD = "application/vnd.microsoft.card.adaptive"
VERB = "confirm"  # a question's Action.Execute verb


def is_user(chat_id: str) -> bool:
    """A personal chat's chat id: the person's Teams user id (29:…), not a conversation id
    (inbound: activities.message says why)."""
    return chat_id.startswith("29:")


def personal_conversation(channel: Any, user: str) -> tuple[str, dict[str, Any]]:
    """The Connector's "create conversation" for the bot and `user` (POST /v3/conversations):
    for a personal chat it answers the one that exists (Microsoft: proactive messages),
    so it turns a person's id into their chat's conversation id. (url, body)."""
    app_id, tenant = str(channel.setting("app_id") or ""), str(channel.setting("tenant_id") or "")
    fields: dict[str, Any] = {"is_group": False, "agent": ChannelAccount(id=f"28:{app_id}"),
                              "members": [ChannelAccount(id=user)]}
    if tenant:
        fields.update(tenant_id=tenant, channel_data={"tenant": {"id": tenant}})
    body: dict[str, Any] = ConversationParameters(**fields).model_dump(mode="json", by_alias=True, exclude_none=True)
    return f"{str(channel.setting('service_url')).rstrip('/')}/v3/conversations", body


def activities_url(channel: Any, conversation: str, activity_id: str = "", service_url: str = "") -> str:
    """The conversation's activities URL (and one activity's) at `service_url`: the
    conversation reference's, else the channel's setting."""
    base = (service_url or str(channel.setting("service_url"))).rstrip("/")
    url = f"{base}/v3/conversations/{quote(conversation, safe='')}/activities"
    return f"{url}/{quote(activity_id, safe='')}" if activity_id else url


def wire(activity: Activity) -> dict[str, Any]:
    """An activity as the Connector takes it (camelCase, no empty fields)."""
    found: dict[str, Any] = activity.model_dump(mode="json", by_alias=True, exclude_none=True)
    return found


def message(text: str, buttons: tuple[tuple[str, str], ...] = (), reply_to: str = "",
            activity_id: str = "") -> Activity:
    """A message activity: the text; a question is a card holding its text and buttons
    (the card a tap's answer puts in its place then holds the whole message)."""
    fields: dict[str, Any] = {"type": "message"}
    if reply_to:
        fields["reply_to_id"] = reply_to
    if activity_id:
        fields["id"] = activity_id
    if buttons:
        fields["attachments"] = [Attachment(content_type=CARD, content=card(text, buttons))]
    else:
        fields.update(text=text, text_format="markdown")
    return Activity(**fields)


def card(text: str, buttons: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """An Adaptive Card showing `text`, and a question's buttons (label, data): each an
    Action.Execute whose verb is `confirm` and whose data carries the question's (cards.py
    takes the tap). Version 1.4: Action.Execute's (Universal Actions)."""
    found: dict[str, Any] = {"type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                             "version": "1.4", "body": [{"type": "TextBlock", "text": text, "wrap": True}]}
    if buttons:
        found["actions"] = [{"type": "Action.Execute", "title": label, "verb": VERB, "data": {"data": data}}
                            for label, data in buttons]
    return found
