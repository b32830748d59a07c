"""A turn's streamed reply on the worker (docs/streaming.md): the text as the agent
writes it, its previews, and what of it is kept durably.

- **Previews are best effort.** The first goes out with the first delta; later ones at
  most every AGENTLOOP_PREVIEW_INTERVAL (Telegram; the web chat's own, faster), each
  showing the whole text so far with a cursor, never waiting for the agent: a preview
  in flight is simply followed by the newest text. A 429 stops the chat's previews for
  the rest of the turn; other failures skip one. A turn that starts while its channel's
  sends are held back (a 429's pause, a budget booked seconds ahead) shows none. The
  first preview shown ends the typing indicator.
- **The final is the ledger's.** When the agent answers, previews stop at once (a draft
  in flight is abandoned — the final is never delayed for a preview) except a group's
  preview message edit in flight, which is let land first (bounded): the final's edit
  must not be overwritten by a late preview. The preview message's id goes on the
  final's ledger row.
- **Durable, bounded.** A group's preview message id is written on the turn when it is
  sent (one write), so a re-run reuses it and a recovery edits or removes it. The text
  is saved on the turn only once the turn fired an effect (it will not be re-run), at
  most every AGENTLOOP_STREAM_SAVE_INTERVAL, and right before a guarded tool runs: a
  crash then sends what was saved, marked as interrupted (engine.give_up_turn).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from audit.failpoints import failpoint
from conversations import languages
from conversations.agents import Answer, answer_of
from conversations.models import Turn, TurnState
from delivery import ledger, pacing
from delivery.models import OutboundKind
from delivery.previews import CURSOR
from delivery.transports import Target, transport_for
from tools import registry

if TYPE_CHECKING:  # for annotations only
    from datetime import datetime

    from conversations.agents import Agent, TurnContext
    from conversations.worker.supervisor import Worker
    from delivery.previews import Preview

log = logging.getLogger(__name__)

# How long a group preview's edit in flight may hold the final back (it must land first).
MESSAGE_SETTLE = 2.0
# A channel whose next send is further away than this streams no previews (held_back).
HELD_BACK = 2.0
STOPPED_NOTE = _("⏹ Stopped.")


async def open_stream(worker: Worker, turn: Turn, agent: Agent, context: TurnContext) -> TurnStream | None:
    """A TurnStream if this turn streams (the agent can, with this channel's config, the
    channel's `streaming` is on, and its platform shows previews in this chat); None: the
    whole reply at once, as ever (WhatsApp, an API channel with a callback), or while
    the channel's sends are held back (`held_back`). The context's effect hooks are
    wrapped so the stream knows when to start saving."""
    channel = turn.conversation.channel
    if not (channel.streaming and agent.streams_for(context.config)):
        return None
    conversation = turn.conversation
    target = Target(conversation.chat_id, turn.reply_target, turn.thread_id, conversation_id=conversation.pk)
    transport = transport_for(channel)
    preview = transport.preview_for(target, turn.pk, turn.preview_message_id)
    if preview is None or await _held_back(worker, channel.pk, transport.pace(conversation.chat_id)):
        return None
    stream = TurnStream(worker, turn, preview)
    stream.wrap(context)
    return stream


class TurnStream:
    def __init__(self, worker: Worker, turn: Turn, preview: Preview) -> None:
        self.worker, self.turn, self.preview = worker, turn, preview
        self.text = ""
        self.first_delta_at: datetime | None = None  # when the first delta arrived (the story page shows it)
        self.previews = 0  # previews shown
        self.preview_message_id = turn.preview_message_id
        self.effect = bool(turn.fired_effect)
        self.stopped = False  # no more previews
        self.changed = asyncio.Event()
        self.previewer: asyncio.Task[None] | None = None
        self.showing = False  # a preview request in flight
        self.saving: asyncio.Task[None] | None = None
        self.saved_at = 0.0

    # --- the agent's side -----------------------------------------------------------

    def wrap(self, context: TurnContext) -> None:
        mark_effect, call_tool = context.mark_effect, context.call_tool

        async def marked() -> bool:
            assert mark_effect is not None  # put in its place only
            if not await mark_effect():
                return False
            await self.effect_fired()
            return True

        async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            assert call_tool is not None  # put in its place only
            if self.text and _guarded(name):
                await self.effect_fired()  # before the effect: a crash in it keeps the text
            return await call_tool(name, arguments)

        context.mark_effect = marked if mark_effect is not None else None
        context.call_tool = tool if call_tool is not None else None

    async def consume(self, items: AsyncIterator[str | Answer]) -> Answer:
        """Read the agent's stream to its Answer (the text so far, if it gave none)."""
        async for item in items:
            if isinstance(item, str):
                self.add(item)
            else:
                return answer_of(item)
        return Answer(self.text)

    def add(self, delta: str) -> None:
        if not delta:
            return
        if self.first_delta_at is None:
            self.first_delta_at = timezone.now()
        self.text += delta
        if not self.stopped:
            self.changed.set()
            if self.previewer is None:
                self.previewer = asyncio.create_task(self._previews())
        if self.effect and self.saving is None and time.monotonic() - self.saved_at >= self.save_interval:
            self.saving = asyncio.create_task(self._save())

    async def effect_fired(self) -> None:
        self.effect = True
        if self.text:
            await self._save()

    # --- previews ---------------------------------------------------------------------

    @property
    def interval(self) -> float:
        own = self.preview.interval
        return own if own is not None else float(settings.AGENTLOOP_PREVIEW_INTERVAL)

    @property
    def save_interval(self) -> float:
        return float(settings.AGENTLOOP_STREAM_SAVE_INTERVAL)

    async def _previews(self) -> None:
        while not self.stopped:
            await self.changed.wait()
            self.changed.clear()
            if self.stopped:
                return  # type: ignore[unreachable]  # close() stopped it meanwhile (mypy: not across the await)
            self.showing = True
            try:
                result = await self.preview.show(self.text + CURSOR)
            finally:
                self.showing = False
            if result.flood or result.stop:
                self.stopped = True  # the chat's previews end here; the final is the ledger's
                return
            if result.shown:
                await self._shown(result.message_id)
            if self.stopped:
                return  # type: ignore[unreachable]  # as above
            await asyncio.sleep(self.interval)

    async def _shown(self, message_id: str) -> None:
        self.previews += 1
        if self.previews == 1:
            self.worker.typing.turn_ended(self.turn)  # the preview says it: no typing over it
        if message_id and message_id != self.preview_message_id:
            self.preview_message_id = message_id
            try:
                await self.worker.db(record_preview, self.turn.pk, self.worker.owner, message_id)
            except Exception:
                log.warning("turn %s: its preview message could not be recorded", self.turn.pk)
        failpoint("stream.after_preview")

    async def close(self) -> str:
        """The agent is done (or stopped): no more previews. Returns the preview message
        the final must replace ("" if none)."""
        self.stopped = True
        self.changed.set()
        task = self.previewer
        if task is not None and not task.done():
            if self.preview.is_message and self.showing:
                await asyncio.wait([task], timeout=MESSAGE_SETTLE)
            task.cancel()
        return self.preview_message_id

    async def discard(self) -> None:
        """Cancelled by a new message (interrupt, rollback) or /reset: the preview goes."""
        await self.close()
        try:
            await self.preview.discard()
        except Exception:
            log.info("turn %s: its preview could not be removed", self.turn.pk)

    # --- durable --------------------------------------------------------------------

    async def _save(self) -> None:
        text, self.saved_at = self.text, time.monotonic()
        try:
            await self.worker.db(save_streamed, self.turn.pk, self.worker.owner, text)
        except Exception:
            log.warning("turn %s: its streamed text could not be saved", self.turn.pk)
        finally:
            self.saving = None

    async def save_now(self) -> None:
        """Before the turn is handed back (shutdown): a turn that acted keeps its text."""
        if self.effect and self.text:
            await self._save()


async def _held_back(worker: Worker, channel_id: int, pace: pacing.Pace | None) -> bool:
    try:
        return await worker.db(held_back, channel_id, pace)
    except Exception:  # the database away: previews are best effort, the turn is not (its own steps say the fault)
        return True


def held_back(channel_id: int, pace: pacing.Pace | None) -> bool:
    """Whether the channel's next send is more than HELD_BACK seconds away: a 429 paused
    it (the bot's key, or an unpaced channel's flood key), or its bot's budget is booked
    that far. Previews then would only earn another 429, or take slots replies need; the
    final goes through the ledger, which waits."""
    return pacing.waiting(pacing.flood_pause_key(pace, channel_id)) > HELD_BACK


def _guarded(name: str) -> bool:
    try:
        return bool(registry.get(name).guarded)
    except registry.UnknownTool:
        return False


# --- the database side ----------------------------------------------------------------


def record_preview(turn_id: int, owner: str, message_id: str) -> int:
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=owner).update(
        preview_message_id=str(message_id))


def save_streamed(turn_id: int, owner: str, text: str) -> int:
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=owner).update(streamed_text=text)


def record_streams(streams: list[tuple[int, TurnStream]]) -> None:
    """The streamed turns' facts for the story page (in the completion's transaction)."""
    for turn_id, stream in streams:
        Turn.objects.filter(pk=turn_id).update(first_delta_at=stream.first_delta_at, previews=stream.previews,
                                               preview_message_id=stream.preview_message_id)


def write_stopped(turn: Turn, said: str, preview_message_id: str) -> bool:
    """/stop mid-stream: what was said so far, marked as stopped (in the user's language),
    through the ledger (once: the turn's reply_text is its claim)."""
    text = f"{said.rstrip()}\n\n{languages.text_for(turn.conversation, STOPPED_NOTE)}"
    with transaction.atomic():
        if not Turn.objects.filter(pk=turn.pk, state=TurnState.CANCELLED, reply_text="").update(reply_text=text):
            return False
        ledger.enqueue_many([ledger.Reply(turn.conversation, text, OutboundKind.REPLY, turn=turn,
                                          reply_target=turn.reply_target, thread_id=turn.thread_id,
                                          preview_message_id=preview_message_id)])
    return True

