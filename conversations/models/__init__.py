"""Layer 1's tables: who talks to us, what they said, and when each burst becomes a turn.

State machines are written down once here (the *State enums and their TRANSITIONS);
every transition goes through the model's checked `transition()` (agentloop.core.states):
a compare-and-swap `filter(pk=…, state__in=old).update(…)` that refuses a move the
table does not allow.

The package, by table: `channels`, `messages` (contacts, conversations, inbound
messages), `buffers`, `media` (the files users send), `turns` (turns, worker heartbeats, context notes), `routing` (routing rules), `reactions`, `keys`,
`edits`, `addresses` (where a platform wants a chat's replies sent). Every model is
imported here, so Django finds them all; the migrations name
the channel's callable defaults at this path (`conversations.models._default_greetings`,
`_default_conjunctions`, `_platform_choices`), so they are imported here too.
"""

from conversations.models.addresses import PlatformAddress  # noqa: F401
from conversations.models.buffers import BufferState, FlushReason, MessageBuffer  # noqa: F401
from conversations.models.channels import (  # noqa: F401
    Channel,
    ChannelManager,
    DoubleTexting,
    EditsPolicy,
    GroupReplies,
    StaleRecoveries,
    StatusReaction,
    TypingMode,
    _default_conjunctions,
    _default_greetings,
    _platform_choices,
)
from conversations.models.edits import EditOutcome, MessageEdit  # noqa: F401
from conversations.models.keys import AgentKey, AgentKeyManager  # noqa: F401
from conversations.models.media import SETTLED, MediaFile, MediaState  # noqa: F401
from conversations.models.messages import (  # noqa: F401
    Contact,
    Conversation,
    ConversationState,
    Disposition,
    InboundMessage,
    MessageKind,
)
from conversations.models.reactions import InboundReaction, ReactionOutcome  # noqa: F401
from conversations.models.routing import ContactAttribute, RoutingRule  # noqa: F401
from conversations.models.turns import ContextNote, Turn, TurnState, WorkerHeartbeat  # noqa: F401
