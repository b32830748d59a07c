"""Slack (Events API over HTTP, Web API through the official slack-sdk): everything
Slack means to agentloop.

- inbound.py: the request signature (v0, HMAC-SHA256 over `v0:timestamp:body`), and an
  Events API envelope into our Inbound messages and Edits (or a reason it is ignored)
- webhook.py: the Events API request URL (`url_verification`, `event_callback`) and the
  interactivity request URL (a click on a question's buttons)
- transport.py: sending with slack-sdk's AsyncWebClient (its own retries off: the ledger
  decides), each Web API error mapped to the ledger's outcomes, typing as the assistant
  thread's status where the app is an assistant
- buttons.py: a confirmation question as Block Kit buttons, a click decided exactly once,
  the question updated with the outcome (chat.update)

Identities: a message's dedup key is `<channel id>:<ts>` (Slack's `ts` is unique within a
channel, and the `message` and `app_mention` events of one message, and every retry of
either, carry the same one). A conversation's chat is the Slack channel id, or
`<channel id>:<thread ts>` when the channel keeps a conversation per thread; replies go
into the user's thread (in a channel, a thread under the user's message).

Channels (not DMs) are groups: which messages are answered is the channel's
`group_replies` (always / mention / never), as in Telegram groups (conversations.groups);
a message's mention flag is set here (inbound.addressed).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings
from conversations.platforms.slack.names import PER_CHANNEL, PER_THREAD

if TYPE_CHECKING:  # for annotations only
    from conversations.platforms.slack.webhook import SlackEvents

# `make run`'s demo channel: its settings from these environment variables.
ENVIRONMENT = {"bot_token": "SLACK_BOT_TOKEN", "signing_secret": "SLACK_SIGNING_SECRET"}


class SlackPlatform(Platform):
    kind = "slack"
    label = "Slack"
    has_buttons = True  # Block Kit buttons; a click comes back on the interactivity URL
    settings = {
        "bot_token": Setting(label=_("Bot token"), help=_("The app's Bot User OAuth Token (xoxb-…), from OAuth & Permissions."),
                             secret=True, required_to_send=True, option="--token"),
        "signing_secret": Setting(label=_("Signing secret"), help=_("The app's Signing Secret (Basic Information): checks X-Slack-Signature "
                                                                    "on every request."), secret=True, required_to_receive=True),
        "api_base": Setting(label=_("API base"), default="https://slack.com/api/", check=check_url, carries=("bot_token",),
                            help=_("Web API root; requests go to {api_base}{method}. Changing it asks for the "
                                   "bot token again.")),
        "conversations": Setting(label=_("Conversations"), default=PER_CHANNEL, choices=(PER_CHANNEL, PER_THREAD),
                                 help=_("One conversation per Slack channel (or DM) and person, or one per thread.")),
        # chat.postMessage: about 1 message per second per channel (short bursts allowed);
        # a workspace allows "several hundred messages per minute" in all.
        **pace_settings(per_second=4.0, chat_interval=1.0),
    }

    # The package's own modules are imported where they are used: they import models and
    # ingest, which the registry that loads this class from settings must not pull in.
    def transport(self, channel):
        from conversations.platforms.slack.transport import SlackTransport

        return SlackTransport(channel)

    async def close_clients(self) -> None:
        from conversations.platforms.slack.transport import close_clients

        await close_clients()

    def webhook(self) -> SlackEvents:
        """The Events API's request URL (lean: conversations/lean_ingest.py)."""
        from conversations.platforms.slack.webhook import SlackEvents

        return SlackEvents(self)

    def urls(self) -> list:
        from conversations.platforms.slack.webhook import SlackInteractivity

        return self.webhook().urls() + SlackInteractivity(self).urls()

    def question_decided(self, channel, confirmation, outcome: str, status: str) -> None:
        from conversations.platforms.slack.buttons import question_decided

        question_decided(channel, confirmation, outcome)

    def bootstrap(self, stdout) -> str:
        """With SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET set, a `slack` channel answers
        with the demo agent."""
        values = {name: os.environ.get(variable, "") for name, variable in ENVIRONMENT.items()}
        if not any(values.values()):
            return ""
        missing = [ENVIRONMENT[name] for name, value in values.items() if not value]
        if missing:
            return f"Slack: no channel, {', '.join(missing)} not set"
        self.demo_channel("slack", "Slack (demo agent)", values)
        return ("Slack channel 'slack': set the app's Event Subscriptions request URL to "
                "https://<your public host>/webhooks/slack/slack/ and its Interactivity request URL to "
                "https://<your public host>/webhooks/slack/slack/interactivity/ (docs/slack.md has the manifest)")
