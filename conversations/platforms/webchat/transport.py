"""The web chat's transport: replies and "typing…" pushed to the page's live group."""

from agentloop.core import live
from conversations.media import links
from delivery.models import Outcome
from delivery.previews import Preview, PreviewResult
from delivery.transports import SendResult, Target, Transport


class LivePreview(Preview):
    """The reply so far, pushed to the page (`preview` events; the page shows it in a
    bubble the final `reply` replaces)."""

    interval = 0.1  # a page takes pushes far faster than a chat platform

    def __init__(self, target: Target, turn_id: int):
        self.group = live.conversation_group(target.conversation_id)
        self.event = {"kind": "preview", "conversation": target.conversation_id, "turn": turn_id}

    async def show(self, text: str) -> PreviewResult:
        try:
            await live.apublish([self.group], {**self.event, "text": text})
        except Exception:  # e.g. Redis unreachable: a preview is best effort
            return PreviewResult(False)
        return PreviewResult(True)

    async def discard(self) -> None:
        try:
            await live.apublish([self.group], {**self.event, "kind": "preview_end"})
        except Exception:
            pass  # best effort


class WebchatTransport(Transport):
    """The reply is pushed to the conversation's live group (`webchat.<conversation id>`),
    across processes (see agentloop.core.live); the row stays readable, and the page reloads
    it on reconnect."""

    supports_typing = True
    typing_refresh = 4.0  # the page shows a typing signal for 6 s (static/console/playground.js)

    async def send_text(self, target: Target, text: str) -> SendResult:
        try:
            event = {"kind": "reply", "conversation": target.conversation_id, "text": text,
                     "reply_to": target.reply_target}
            if target.buttons:  # the page shows them and sends a tap back over its socket
                event["buttons"] = [{"label": label, "data": data} for label, data in target.buttons]
            await live.apublish([live.conversation_group(target.conversation_id)], event)
        except Exception as exc:  # e.g. Redis unreachable
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__}: {exc}")
        return SendResult.delivered()

    async def send_files(self, target: Target, files: list, caption: str) -> SendResult:
        """A reply's file, pushed as links the page shows (a thumbnail for an image),
        signed and expiring like every file link (conversations.media.links)."""
        shown = [{"name": item.name, "type": item.type, "size": item.size,
                  "url": links.path_for_outbound(item.file, item.type, item.name)} for item in files]
        try:
            await live.apublish([live.conversation_group(target.conversation_id)], {
                "kind": "reply", "conversation": target.conversation_id, "text": caption, "files": shown,
                "reply_to": target.reply_target})
        except Exception as exc:  # e.g. Redis unreachable
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__}: {exc}")
        return SendResult.delivered()

    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        return LivePreview(target, turn_id)

    async def send_typing(self, target: Target) -> None:
        await live.apublish([live.conversation_group(target.conversation_id)], {
            "kind": "typing", "conversation": target.conversation_id})
