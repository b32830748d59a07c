"""Status reactions: a channel's optional "seen" reaction on the person's message (👀)
while its window and its turn run, replaced (✅, or Telegram's 👌) or removed when the
agent has answered (Channel.status_reaction).

Owned by the typing indicators (conversations/worker/typing.py), which already learn when
a window opens (their look) and when a turn starts and ends; the same rules apply —
every call is made here, on the worker's event loop, best effort: each within its
deadline, under the bot's pacing budget (delivery.pacing: a reaction takes a bot slot
only if one is free within RESERVE_HORIZON, so it never pushes a reply back; on an
unpaced channel it waits out a 429's pause only if it ends that soon), logged
once per fault, never awaited by a turn or a reply. The replacement waits for the "seen"
call of the same message to finish (never overtaken by it), at most CALL_DEADLINE.

What is remembered is this worker's: the messages it put 👀 on, per conversation
(bounded). With several workers the one that runs the turn replaces what it put there;
a window shown by one worker and answered by another keeps its 👀 where the first put it
on an earlier message of the burst (docs/buffer.md#reactions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentloop.core.backoff import FaultLog
from agentloop.core.caches import BoundedCache
from conversations.models import StatusReaction
from delivery import pacing
from delivery.transports import Target, transport_for

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from conversations.worker.dbthread import DatabaseThread
    from delivery.transports import Transport

log = logging.getLogger(__name__)

CALL_DEADLINE = 5.0  # one reaction call, all told
RESERVE_HORIZON = 2.0  # a reaction waits at most this long for a bot slot, else is skipped
MAX_SHOWN = 10_000  # conversations remembered with a reaction of ours on
MAX_MESSAGES = 10  # a burst's messages that carry one


@dataclass(eq=False)
class Shown:
    """The messages of one conversation we put the "seen" reaction on, not yet answered."""

    channel: Channel
    transport: Transport
    target: Target
    message_ids: list[str] = field(default_factory=list)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # message id -> its "seen" call


class StatusReactions:
    def __init__(self, db: DatabaseThread) -> None:
        self.db = db  # the typing indicators' database thread: never the turns'
        self.shown: BoundedCache[int, Shown] = BoundedCache(maxsize=MAX_SHOWN)  # conversation -> ours on it
        self.tasks: set[asyncio.Task[None]] = set()
        self.faults: BoundedCache[int, FaultLog] = BoundedCache(maxsize=256)  # channel -> its faults
        self.skipped = 0  # calls not made: no bot slot free in time (for tests and operators)

    def seen(self, channel: Channel, conversation_id: int, target: Target, message_id: str) -> None:
        """The person's message is waiting for an answer: 👀 on it (once per message)."""
        if not message_id or channel.status_reaction == StatusReaction.OFF:
            return
        transport = transport_for(channel)
        if transport.status_reactions is None:
            return
        shown = self.shown.get(conversation_id)
        if shown is None:
            shown = self.shown.set(conversation_id, Shown(channel, transport, target))
        if message_id in shown.message_ids or len(shown.message_ids) >= MAX_MESSAGES:
            return
        shown.message_ids.append(message_id)
        seen_emoji = transport.status_reactions[0]
        shown.tasks[message_id] = self._spawn(self._call(shown, message_id, seen_emoji, "", None))

    def answered(self, conversation_id: int) -> None:
        """The agent answered: each 👀 we put there becomes the done emoji, or goes."""
        shown = self.shown.pop(conversation_id)
        if shown is None:
            return
        emoji = shown.transport.status_reactions
        assert emoji is not None  # `seen` shows one only where the platform has reactions
        seen_emoji, done_emoji = emoji
        done = done_emoji if shown.channel.status_reaction == StatusReaction.SEEN_DONE else ""
        for message_id in shown.message_ids:
            self._spawn(self._call(shown, message_id, done, seen_emoji, shown.tasks.get(message_id)))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _call(self, shown: Shown, message_id: str, emoji: str, previous: str,
                    after: asyncio.Task[None] | None) -> None:
        """One reaction call, best effort: after the call it replaces, in a free bot slot."""
        faults = self._faults_for(shown.channel)
        try:
            if after is not None:
                await asyncio.wait_for(asyncio.shield(after), CALL_DEADLINE)
            if not await self._slot(shown):
                self.skipped += 1
                return
            await asyncio.wait_for(shown.transport.set_reaction(shown.target, message_id, emoji, previous),
                                   CALL_DEADLINE)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # best effort: never in a turn's or a reply's way
            faults.failed(exc)
            return
        faults.recovered()

    async def _slot(self, shown: Shown) -> bool:
        """Wait for a bot slot of the platform's budget (the chat's is the replies'); False
        when none is free within RESERVE_HORIZON."""
        pace = shown.transport.pace(shown.target.chat_id)
        if pace is None or not pace.bot_interval:
            # No budget to book, but a 429's pause holds all the same (the replies wait it out).
            wait = await self.db(pacing.waiting, pacing.flood_pause_key(pace, shown.channel.pk))
            if wait > RESERVE_HORIZON:
                return False
            await asyncio.sleep(wait)
            return True
        slot = await self.db(pacing.reserve, pacing.Pace(pace.bot, pace.bot_interval), RESERVE_HORIZON)
        if slot.delay is None:
            return False
        await asyncio.sleep(slot.delay)
        return True

    def _faults_for(self, channel: Channel) -> FaultLog:
        faults = self.faults.get(channel.pk)
        if faults is None:
            faults = self.faults.set(channel.pk, FaultLog(log, subject=f"status reactions of channel {channel.slug}"))
        return faults

    async def stop(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
