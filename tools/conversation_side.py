"""What tools asks of the conversations app above it: the one call that points up the
layer order (.importlinter: conversations → tools), as an interface tools owns.

Tools acts for conversations but some of its outcomes belong to them: a person's
decision on a proposal becomes a note for the agent and a message to the user; an API
or MCP request names a conversation (or an agent key, a channel) that tools must find
without importing the app that owns it. Where tools has a foreign key into conversations
(Confirmation.conversation, McpServer.channels) it goes through it instead: the schema
already declares that dependency.

The implementation lives in conversations and is named by dotted path in the setting
AGENTLOOP_CONVERSATION_SIDE (agentloop/wiring.py), resolved once by agentloop.core.plugins, the
way Django resolves EMAIL_BACKEND: no registration at start-up, no module global.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from agentloop.core import plugins

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


class Platform(Protocol):
    """A channel's platform, as tools reads it (conversations.platforms.base.Platform)."""

    @property
    def user_can_confirm(self) -> bool: ...

    @property
    def has_buttons(self) -> bool: ...


class Channel(Protocol):
    """conversations.models.Channel, as tools reads it."""

    @property
    def pk(self) -> Any: ...  # Django's pk is untyped (Model.pk)

    @property
    def slug(self) -> str: ...

    @property
    def language(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def platform(self) -> Platform: ...


class Contact(Protocol):
    """conversations.models.Contact, as tools reads it (who answers a question)."""

    @property
    def display_name(self) -> str: ...

    @property
    def username(self) -> str: ...


class Conversation(Protocol):
    """conversations.models.Conversation, as tools reads it (a scope's owner, who answers)."""

    @property
    def pk(self) -> Any: ...  # Django's pk is untyped (Model.pk)

    @property
    def contact_id(self) -> int: ...

    @property
    def contact(self) -> Contact: ...

    @property
    def channel(self) -> Channel: ...

    @property
    def sender_id(self) -> str: ...


class ConversationSide(Protocol):
    """conversations.tool_side.ConversationSide implements it."""

    def inform(self, conversation_id: int, *, for_agent: str, for_user: StrOrPromise = "") -> bool:
        """A decision reaches its conversation: a note for the agent's next turn and,
        when `for_user` is given, a message to the user. False: no such conversation.
        Called inside the caller's transaction."""
        ...

    def conversation_for_key(self, key: Any, conversation_id: object) -> Conversation:  # key: an AgentKey
        """The conversation, if it is in one of the agent key's channels; raises the
        API's NotFound otherwise."""
        ...

    def agent_key_for(self, raw: str) -> Any:  # conversations.models.AgentKey, or None
        """The live agent key whose secret is `raw`, or None."""
        ...

    def channel(self, slug: str) -> Channel | None: ...

    def channels(self) -> Sequence[Channel]:
        """Every channel, by slug."""
        ...

    def turn_running_at(self, conversation_id: int, worker: str, at: datetime) -> int | None:
        """The id of the conversation's turn that `worker` was running at `at`, or None."""
        ...


@functools.cache
def conversation_side() -> ConversationSide:
    """The implementation named by settings.AGENTLOOP_CONVERSATION_SIDE, one per process.

    It points up, against the layer order: a decision on a proposal ends in a note and a
    message in its conversation, and an API request names a conversation; both belong to
    conversations, the app above tools. So tools owns the interface and conversations fills it."""
    return cast("ConversationSide", plugins.named("AGENTLOOP_CONVERSATION_SIDE")())
