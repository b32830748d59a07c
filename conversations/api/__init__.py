"""REST API for external agents (agent keys; DRF): messages into api channels, turns,
conversation reads. The tools behind the action guard are in tools/api.py.

The package, by section: `access` (what an agent key may reach), `messages` (in, and
edits), `turns` (for external agents), `reading` (a conversation, long-polled),
`streaming` (its replies as they are written: SSE), `schedules` (messages that go out by themselves).
"""

from conversations.api.access import Conflict, channel_for_key, conversation_for_key  # noqa: F401
from conversations.api.messages import (  # noqa: F401
    MESSAGE_ID_CHARS,
    AdmissionSerializer,
    ChannelMessagesView,
    EditResultSerializer,
    InboundMessageSerializer,
    MessageEditSerializer,
    MessageEditView,
)
from conversations.api.reading import (  # noqa: F401
    ConversationMessagesQuery,
    ConversationMessagesView,
    CursorField,
    LongPolls,
    TimelineItemSerializer,
    TimelinePageSerializer,
    TooManyWaiting,
)
from conversations.api.schedules import (  # noqa: F401
    ConversationSchedulesView,
    NewScheduleSerializer,
    ScheduleSerializer,
)
from conversations.api.streaming import ConversationStreamQuery, ConversationStreamView, Streams  # noqa: F401
from conversations.api.turns import (  # noqa: F401
    TurnClaimView,
    TurnDoneSerializer,
    TurnDoneView,
    TurnListQuery,
    TurnListView,
    TurnReplySerializer,
    TurnReplyView,
    TurnSerializer,
)
