"""Slack's message shapes and names, shared by the transport and the stream (no client
here, so the streaming module can use them without importing the transport)."""

import hashlib

from delivery import chunks

SECTION_UNITS = 3000  # a Block Kit section's text


def escape(text: str) -> str:
    """Slack reads `&`, `<` and `>` as markup (links, mentions): a reply's own are escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def place(chat_id: str, thread: str) -> tuple[str, str]:
    """(Slack channel id, thread ts) of a chat (`C…` or `C…:<thread ts>`) and a thread."""
    channel_id, _, chat_thread = chat_id.partition(":")
    return channel_id, thread or chat_thread


def question_blocks(text: str, buttons) -> list:
    """A question and its answer buttons (tools.confirmations: (label, data) pairs)."""
    styles = ("primary", "danger")
    elements = [{"type": "button", "action_id": f"agentloop_confirm_{i}", "value": data,
                 "text": {"type": "plain_text", "text": label, "emoji": True},
                 **({"style": styles[i]} if i < len(styles) else {})} for i, (label, data) in enumerate(buttons)]
    section = escape(chunks.split(text, SECTION_UNITS)[0])
    return [{"type": "section", "text": {"type": "mrkdwn", "text": section}},
            {"type": "actions", "block_id": "agentloop_confirm", "elements": elements}]


def token_key(token: str) -> str:
    """A bot's name in shared keys (the pacing budget, caches): never the token itself."""
    return hashlib.sha256(str(token).encode()).hexdigest()[:16]
