"""Teams' native streaming (docs/streaming.md, docs/teams.md; Microsoft: "Stream bot
messages"): in a personal chat, the reply shows while it is written as one streamed
message, and the final is that message.

- **Where**: a personal (one-to-one) chat — Teams streams nowhere else; its chat id is
  the person's (29:…). A chat or a bot that refuses (403 ContentStreamNotAllowed, 400 "streaming
  API is not enabled") is not asked again for UNAVAILABLE_FOR seconds: its previews are
  the edited message other chats get.
- **While the agent writes**: POST a `typing` activity with the whole text so far and a
  `streaminfo` entity (streamType `streaming`, streamSequence 1, 2, 3…); the first answer
  (201) names the stream (its id, the message's), the next carry it (202). At most one
  update every STREAM_INTERVAL seconds (Microsoft: buffer 1.5 to 2 s, never faster than
  one a second), each only after the one before was answered. One stream per chat: a
  turn's preview is the chat's only one, and the ledger ends it before the next turn's.
- **The final** is the ledger's (delivery.ledger.sending.send_over_preview calls
  TeamsTransport.edit_text): a `message` activity with the whole final text (a
  question's card with it: attachments go in the final only) and streaminfo streamType
  `final` with the stream's id, no sequence. A stream this process did not start (a
  re-run after a crash) or one Teams ended already (its two-minute limit) is not
  finished this way: the message is replaced (PUT), and failing that the ledger deletes
  it and sends the final fresh.
- **A 429** stops this turn's updates; the final still goes once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from microsoft_agents.activity import Activity, Attachment
from microsoft_agents.activity.entity import StreamInfo

from agentloop.core.caches import BoundedCache
from conversations.platforms.teams.wire import CARD, card, is_user
from delivery import chunks
from delivery.models import Outcome
from delivery.previews import CURSOR, Preview, PreviewResult
from delivery.transports import SendResult

if TYPE_CHECKING:  # for annotations only
    from conversations.platforms.teams.transport import TeamsTransport
    from delivery.transports import Target

STREAM_INTERVAL = 1.5
UNAVAILABLE_FOR = 600.0
PREVIEW_DEADLINE = 5.0  # seconds for one stream update: a preview never waits long
MAX_PREVIEW_UNITS = 8000  # a streamed message shows at most one message's worth (transport.MAX_UNITS)

# stream id -> the next streamSequence, for the streams this process started and has not ended.
_streams: BoundedCache[str, int] = BoundedCache(maxsize=4096, max_age=600.0)
# (app id, chat) -> True: Teams refused a stream there lately.
_unavailable: BoundedCache[tuple[str, str], bool] = BoundedCache(maxsize=4096, max_age=UNAVAILABLE_FOR)


def _place(transport: TeamsTransport, target: Target) -> tuple[str, str]:
    return str(transport.channel.setting("app_id") or ""), target.chat_id


def can_stream(transport: TeamsTransport, target: Target) -> bool:
    personal = is_user(target.chat_id) or target.chat_id.startswith("a:")
    return personal and _unavailable.get(_place(transport, target)) is None


def streaming(stream_id: str) -> bool:
    """A stream this process started and has not ended."""
    return bool(stream_id) and _streams.get(stream_id) is not None


def _refused_streaming(result: SendResult) -> bool:
    return result.outcome == Outcome.PERMANENT and (
        "ContentStreamNotAllowed" in result.error or "streaming api is not enabled" in result.error.lower()
        or "HTTP 403" in result.error)


class TeamsStream(Preview):
    """One turn's streamed message in a personal chat."""

    is_message = True
    interval = STREAM_INTERVAL

    def __init__(self, transport: TeamsTransport, target: Target, message_id: str = "") -> None:
        self.transport, self.target, self.stream_id = transport, target, message_id
        # A stream an earlier run of the turn left (the worker was killed): its sequence
        # is unknown here, so nothing more is streamed to it; the final replaces it.
        self.reused = bool(message_id)
        self.sent = ""

    async def show(self, text: str) -> PreviewResult:
        if self.reused:
            return PreviewResult(False, stop=True)
        text = text.removesuffix(CURSOR).rstrip()
        if chunks.units(text) > MAX_PREVIEW_UNITS:
            text = chunks.split(text, MAX_PREVIEW_UNITS)[0]  # the final, chunked by the ledger, says the rest
        if not text or text == self.sent:
            return PreviewResult(False)
        sequence = _streams.get(self.stream_id) if self.stream_id else 1
        if sequence is None:
            return PreviewResult(False, stop=True)  # ended (or forgotten): nothing more is streamed
        info: dict[str, Any] = {"stream_type": "streaming", "stream_sequence": sequence}
        if self.stream_id:
            info["stream_id"] = self.stream_id
        url = await self.transport.url(self.target.chat_id)
        if isinstance(url, SendResult):
            return PreviewResult(False, flood=url.outcome == Outcome.FLOOD, stop=url.outcome != Outcome.NOT_SENT)
        result = await self.transport.call("POST", url,
                                           _wire(Activity(type="typing", text=text, entities=[StreamInfo(**info)])),
                                           limit=PREVIEW_DEADLINE, needs_id=not self.stream_id)
        if result.ok:
            if not self.stream_id:
                self.stream_id = result.platform_message_id
            _streams.set(self.stream_id, sequence + 1)
            self.sent = text
            return PreviewResult(True, message_id=self.stream_id)
        if result.outcome == Outcome.NOT_SENT:
            return PreviewResult(False)  # never left: the next update tries again
        if not self.stream_id and _refused_streaming(result):
            _unavailable.set(_place(self.transport, self.target), True)  # the next turns get edited previews
        if self.stream_id and result.outcome != Outcome.FLOOD:
            _streams.pop(self.stream_id)  # what it shows is unknown, or Teams ended it: updates stop
        # A 429: updates stop (the final pays nothing). A first update that may have landed
        # unseen: no second stream (the final goes as a message of its own).
        return PreviewResult(False, flood=result.outcome == Outcome.FLOOD, stop=True)

    async def discard(self) -> None:
        if self.stream_id:
            _streams.pop(self.stream_id)
            await self.transport.delete_message(self.target, self.stream_id)


async def finish(transport: TeamsTransport, target: Target, stream_id: str, text: str) -> SendResult:
    """The ledger's final over stream `stream_id`: a message activity ending it with
    `text` (and a question's card). Delivered: the stream's message is the final."""
    fields: dict[str, Any] = {"type": "message", "entities": [StreamInfo(stream_type="final", stream_id=stream_id)]}
    if target.buttons:
        fields["attachments"] = [Attachment(content_type=CARD, content=card(text, target.buttons))]
    else:
        fields.update(text=text, text_format="markdown")
    url = await transport.url(target.chat_id)
    if isinstance(url, SendResult):
        return url
    result = await transport.call("POST", url, _wire(Activity(**fields)), needs_id=False)
    if result.ok or result.outcome == Outcome.PERMANENT:
        _streams.pop(stream_id)  # ended, or Teams will take no more of it
    return SendResult.delivered(stream_id) if result.ok else result


def forget() -> None:
    """Drop what this process knows of streams (tests)."""
    for cache in (_streams, _unavailable):
        cache.clear()


def _wire(activity: Activity) -> dict[str, Any]:
    found: dict[str, Any] = activity.model_dump(mode="json", by_alias=True, exclude_none=True)
    for entity in found.get("entities") or []:  # the SDK's StreamInfo writes its unset fields empty
        if entity.get("type") == "streaminfo":
            for name in ("streamId", "streamResult", "feedbackLoopEnabled"):
                if entity.get(name) in ("", False):
                    entity.pop(name)
    return found
