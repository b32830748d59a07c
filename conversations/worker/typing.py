"""Typing indicators: one loop per conversation, owned by the worker.

A conversation shows "typing…" while something holds it:

- a window (channels whose typing mode is `instant`): its buffer is open, waiting for
  the burst to end. The worker learns these by a look at the database every
  LOOK_EVERY seconds (one indexed query, on a thread of its own; none at all while the
  flusher sees no open buffer or no channel types instantly);
- a turn (`instant` and `turn`): this worker runs it; known in memory, at once (a turn
  whose window showed no indicator starts its own after TURN_GRACE: a quick answer
  shows none).

The turn of a burst continues the loop its window started (no second loop, no gap), and
the loop ends the moment nothing holds it: when the agent has answered (before the reply
is sent, so no indicator follows the reply) or when a look finds the buffer gone
(flushed elsewhere, dropped by /stop or /reset, a rollback). A window's indicator is
refreshed only on the word of a look that began after the refresh fell due: a buffer
dropped since the last refresh is never shown typing again.

The web request that admits a message never calls the platform: every typing call is
made here, best effort — with a deadline, logged once per fault, never in a turn's way.
At most AGENTLOOP_MAX_TYPING loops run per worker; beyond that a conversation simply
shows no indicator.

Several workers: a window is typed by one of them, chosen by the conversation's id
modulo the live workers (their heartbeats, less the ones housekeeping found dead); a
turn by the worker that runs it. A window typed by one worker and flushed into a turn by
another sends one indicator twice at the hand-over; a worker joining or leaving moves
windows between workers within PARTITION_EVERY seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from django.conf import settings

from agentloop.core.backoff import DATABASE_FAULTS, Backoff, FaultLog
from agentloop.core.caches import BoundedCache
from conversations.models import Channel, TypingMode
from conversations.platforms import typing_kinds
from conversations.worker.dbthread import DatabaseThread
from conversations.worker.reactions import StatusReactions
from conversations.worker.typing_look import live_owners, open_windows, typing_channels
from delivery.retry_after import clamp_retry_after
from delivery.transports import Target, transport_for

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Turn
    from conversations.worker.supervisor import Worker
    from conversations.worker.typing_look import Window
    from delivery.transports import Transport

log = logging.getLogger(__name__)

# How often open buffers are looked for: a window's indicator starts within about this
# of its first message. A window's refresh asks the looks for their word this much
# before it falls due, so it goes out on time, not a look's interval late.
LOOK_EVERY = 0.25
# A look that took t seconds waits at least LOOK_SHARE * t before the next (10k open
# buffers on SQLite: ~16 ms a look, still every 0.25 s).
LOOK_SHARE = 10
# How often the live workers (the partition) and the channels that type are read again.
PARTITION_EVERY = 5.0
# A window hold that only the next look can confirm or end (see Typing.turn_ended).
UNKNOWN_WINDOW = -1
# A window's refresh that falls due just before the window flushes waits for the flush
# (its turn, or the window re-armed, then decides) by at most this share of the refresh
# interval: each platform's typing_refresh leaves more than that before its indicator
# lapses (Telegram: 4 s of ~5 s). Measured in the peer benchmark (4 s windows, an echo
# agent): 1.2-1.5 typing calls per conversation before, 1.0 after — the refresh went out
# a moment before the flush, and the reply a moment after it.
LATE_REFRESH_SHARE = 1 / 8
# How long after its deadline a window's flush is waited for (the flusher's lateness).
FLUSH_GRACE = 0.1
# A turn that starts an indicator of its own (none was showing for its window) waits this
# long, at most a quarter of the refresh interval, before its first typing call: an agent
# that answers sooner shows none, its reply being there at once. Called at the turn's
# start, the call was abandoned mid-way by the answer a moment later, its half-opened
# connection closed: in the peer benchmark's load on PostgreSQL (echo agent, typing
# mode `turn`) 221-886 connections opened and dropped per run and the replies delivered
# within the window fell from 122-129/s (typing `never`) to 13-57/s; with this wait,
# 110-161/s and none opened.
TURN_GRACE = 0.3


@dataclass(eq=False)
class Indicator:
    """One conversation's typing loop and what holds it."""

    conversation_id: int
    channel: Channel
    transport: Transport
    target: Target
    refresh: float
    buffer_id: int | None = None  # the open buffer a look saw (a window's hold)
    flush_at: float | None = None  # that buffer's deadline (epoch seconds), as the look saw it
    shown_at: float | None = None  # monotonic time of the last indicator sent
    turn_id: int | None = None  # the turn this worker runs (a turn's hold)
    # Set when a refresh may go out: by a turn, or by a look begun after `wanted_since`.
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    wanted_since: float = 0.0
    failing: bool = False
    task: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self.buffer_id is not None or self.turn_id is not None


# One fault log per channel (a bot that is down is one fault, however many chats wait):
# a line when its typing starts failing, one now and then while it does, one when back.
_faults: BoundedCache[int, FaultLog] = BoundedCache(maxsize=256)


def faults_for(channel: Channel) -> FaultLog:
    faults = _faults.get(channel.pk)
    if faults is None:
        faults = _faults.set(channel.pk, FaultLog(log, subject=f"typing indicators of channel {channel.slug}"))
    return faults


# --- the worker side (on its event loop) ----------------------------------------------


class Typing:
    def __init__(self, worker: Worker, cap: int | None = None, interval: float | None = None) -> None:
        self.worker = worker
        self.cap: int = cap if cap is not None else settings.AGENTLOOP_MAX_TYPING
        # 0: each platform's own interval (Transport.typing_refresh).
        self.interval: float = interval if interval is not None else settings.AGENTLOOP_TYPING_INTERVAL
        self.db = DatabaseThread("typing")
        # The status reactions follow the same windows and turns, on the same thread.
        self.reactions = StatusReactions(self.db)
        self.reacting: dict[int, int] = {}  # conversation -> its turn this worker runs (a reaction's answer)
        self.instant: set[int] = set()  # the channels that type from the first message
        self.indicators: dict[int, Indicator] = {}
        # conversation -> buffer id: buffers turns took since the current look began. Its
        # answer may still report them open; it is not believed.
        self.spent: dict[int, int] = {}
        self.channels: dict[int, Channel] = {}
        self.part, self.parts = 0, 1
        self.partition_at: float | None = None  # monotonic time of the last partition read
        self.looks = 0  # looks that asked the database (for tests and operators)
        self.skipped = 0  # indicators not started: the cap was reached

    # --- holds --------------------------------------------------------------------

    def turn_started(self, turn: Turn) -> None:
        """A turn this worker runs (synchronously, before its task starts): its
        conversation shows typing until `turn_ended`, continuing its window's loop."""
        conversation = turn.conversation
        channel = conversation.channel
        self.reacting[conversation.pk] = turn.pk
        self.reactions.seen(channel, conversation.pk, Target(conversation.chat_id, turn.reply_target, turn.thread_id,
                                                             conversation_id=conversation.pk), turn.reply_target)
        if channel.typing_mode == TypingMode.NEVER:
            return
        transport = transport_for(channel)
        if not transport.supports_typing:
            return
        buffer_id = turn.buffer_id or 0
        self.spent[conversation.pk] = buffer_id
        indicator = self.indicators.get(conversation.pk)
        if indicator is not None and indicator.buffer_id is not None and indicator.buffer_id <= buffer_id:
            indicator.buffer_id = None  # that window is this turn now
        if indicator is None:
            target = Target(conversation.chat_id, turn.reply_target, turn.thread_id, conversation_id=conversation.pk)
            indicator = self._start(conversation.pk, channel, transport, target)
            if indicator is None:
                return
        indicator.turn_id = turn.pk
        indicator.confirmed.set()

    def turn_ended(self, turn: Turn, cancelled: bool = False) -> None:
        """The agent answered (or the turn stopped): typing stops now, before the reply
        goes out, unless a newer window of the conversation is open. A turn cancelled by
        a new message (interrupt, rollback) has no reply to race: its loop waits for the
        next look, which finds that message's window (the same loop carries on) or not
        (/stop: it ends, silent). Idempotent."""
        # Called again once the turn's task is done: the first call (the answer, or a
        # cancel) decides the status reaction.
        if self.reacting.get(turn.conversation_id) == turn.pk:
            del self.reacting[turn.conversation_id]
            if not cancelled:
                self.reactions.answered(turn.conversation_id)
        indicator = self.indicators.get(turn.conversation_id)
        if indicator is not None and indicator.turn_id == turn.pk:
            indicator.turn_id = None
            if cancelled and indicator.buffer_id is None:
                indicator.buffer_id = UNKNOWN_WINDOW
            self._release(indicator)

    def windows_held(self) -> bool:
        return any(indicator.buffer_id is not None for indicator in self.indicators.values())

    # --- the look -------------------------------------------------------------------

    async def watch(self) -> None:
        """Every LOOK_EVERY seconds, learn which windows are open (see `look`)."""
        backoff, faults = Backoff(first=LOOK_EVERY, cap=30.0), FaultLog(log, subject="typing look")
        took = 0.0
        while True:
            # A slow look (thousands of open buffers) is made less often: at most about
            # 1/LOOK_SHARE of the typing thread's time goes to looking.
            await asyncio.sleep(backoff.delay or max(LOOK_EVERY, LOOK_SHARE * took))
            began = time.monotonic()
            try:
                await self.look()
                took = time.monotonic() - began
                backoff.reset()
                faults.recovered()
            except DATABASE_FAULTS:
                backoff.next()  # reported once by the database thread
            except Exception as exc:
                backoff.next()
                faults.failed(exc)

    async def look(self) -> None:
        # Buffers turns took before this look began are in its answer (and any later
        # one's) as flushed: only those taken while it runs need remembering.
        self.spent.clear()
        flusher = self.worker.flusher
        quiet = flusher is not None and not flusher.saw_open_buffers
        if quiet and not self.windows_held():
            return  # no buffer is open anywhere: nothing to ask (an idle worker asks nothing)
        now = time.monotonic()
        if self.partition_at is None or now - self.partition_at >= PARTITION_EVERY:
            self.channels, owners = await self.db(self._read_partition, list(self.worker.dead_owners))
            kinds = typing_kinds()
            self.instant = {pk for pk, channel in self.channels.items()
                            if channel.typing_mode == TypingMode.INSTANT and channel.kind in kinds}
            if self.worker.owner not in owners:
                owners = sorted([*owners, self.worker.owner])
            self.part, self.parts = owners.index(self.worker.owner), len(owners)
            self.partition_at = now
        if not self.channels and not self.windows_held():
            return  # no channel types from the first message
        started = time.monotonic()
        if quiet:
            found = []  # the flusher saw no open buffer since: every window closed
        else:
            found = await self.db(open_windows, list(self.channels), self.part, self.parts, self.cap)
            self.looks += 1
        self.apply(found, started)

    @staticmethod
    def _read_partition(dead: list[str]) -> tuple[dict[int, Channel], list[str]]:
        return typing_channels(), live_owners(dead)

    def apply(self, found: list[Window], started: float) -> None:
        """Windows a look begun at `started` found open: start or confirm their loops;
        loops whose window it did not find lose that hold."""
        windows: dict[int, Window] = {}
        indicator: Indicator | None  # below: the second loop's may have none yet
        for window in found:
            spent = self.spent.get(window.conversation_id)
            if spent is None or window.buffer_id > spent:
                self._show_seen(window)
                if window.channel_id in self.instant:
                    windows[window.conversation_id] = window
        for indicator in list(self.indicators.values()):
            if indicator.buffer_id is not None and indicator.conversation_id not in windows:
                indicator.buffer_id = None
                self._release(indicator)
        for conversation_id, window in windows.items():
            indicator = self.indicators.get(conversation_id)
            if indicator is None:
                channel = self.channels.get(window.channel_id)
                if channel is None:
                    continue
                target = Target(window.chat_id, window.reply_target, window.thread_id, conversation_id=conversation_id)
                indicator = self._start(conversation_id, channel, transport_for(channel), target)
                if indicator is None:
                    continue
            elif indicator.turn_id is None and indicator.target.reply_target != window.reply_target:
                # A later message of the burst: the indicator shows against it (WhatsApp).
                indicator.target = replace(indicator.target, reply_target=window.reply_target)
            indicator.buffer_id, indicator.flush_at = window.buffer_id, window.flush_at
            if started >= indicator.wanted_since:
                indicator.confirmed.set()

    def _show_seen(self, window: Window) -> None:
        channel = self.channels.get(window.channel_id)
        if channel is not None:
            target = Target(window.chat_id, window.reply_target, window.thread_id, conversation_id=window.conversation_id)
            self.reactions.seen(channel, window.conversation_id, target, window.reply_target)

    # --- the loops ------------------------------------------------------------------

    def _start(self, conversation_id: int, channel: Channel, transport: Transport,
               target: Target) -> Indicator | None:
        if len(self.indicators) >= self.cap:
            self.skipped += 1  # better no indicator than a worker swamped by them
            return None
        refresh = self.interval or transport.typing_refresh
        indicator = Indicator(conversation_id, channel, transport, target, refresh)
        indicator.task = asyncio.create_task(self._run(indicator))
        self.indicators[conversation_id] = indicator
        return indicator

    def _release(self, indicator: Indicator) -> None:
        if not indicator.held:
            # The task lets go of it first: a cancelled task keeps its CancelledError, whose
            # traceback holds the loop's frame, which holds the indicator. Left pointing
            # back at the task, that cycle outlived the young collections and piled up
            # until a full one (a third of a million objects a few minutes into a steady
            # 150 messages/s: most of the worker's growth).
            task, indicator.task = indicator.task, None
            assert task is not None  # an indicator listed has its loop
            task.cancel()  # an indicator in flight is abandoned
            self.indicators.pop(indicator.conversation_id, None)

    async def _run(self, indicator: Indicator) -> None:
        """Show typing now, then every `refresh` seconds: at once while a turn holds it,
        and for a window only once a look begun since says its buffer is still open. A
        turn's own indicator begins after TURN_GRACE."""
        if indicator.buffer_id is None and indicator.turn_id is not None:
            await asyncio.sleep(min(TURN_GRACE, indicator.refresh / 4))
        while True:
            await indicator.confirmed.wait()
            if await self._flush_first(indicator):
                continue
            pause = await self._send(indicator)
            if indicator.task is None:
                # Released while the call was being answered: Python 3.11's wait_for
                # returns the answer and drops a cancel that lands in the same turn of
                # the event loop (gh-86296). Left running, the loop would wait for a
                # confirmation nothing gives any more: one task kept per such chat.
                raise asyncio.CancelledError
            indicator.shown_at = time.monotonic()
            # Ask a look for its word a little early: the next refresh goes out within
            # [pause - LOOK_EVERY, pause], not a look's interval late.
            early = min(LOOK_EVERY, pause / 4)
            await asyncio.sleep(pause - early)
            indicator.wanted_since = time.monotonic()
            indicator.confirmed.clear()
            if indicator.turn_id is not None:
                await asyncio.sleep(early)
                if indicator.turn_id is not None:  # the turn is known here: no look to wait for
                    indicator.confirmed.set()

    async def _flush_first(self, indicator: Indicator) -> bool:
        """A window's refresh confirmed moments before the window flushes: wait for the
        flush instead (at most LATE_REFRESH_SHARE of the interval late, so what is shown
        never lapses). Then a turn this worker runs refreshes at once, a window re-armed
        meanwhile waits for a look begun after the wait, and a turn already answered (or
        a buffer dropped) sends nothing: the indicator shown a moment ago covers the
        reply's way out, where the refresh used to be one call more per conversation."""
        if indicator.turn_id is not None or indicator.flush_at is None or indicator.shown_at is None:
            return False
        late_by = indicator.shown_at + indicator.refresh * (1 + LATE_REFRESH_SHARE) - time.monotonic()
        flushes_in = indicator.flush_at - time.time()
        if flushes_in + FLUSH_GRACE > late_by:
            return False  # the window outlives the indicator: refresh now
        wait = max(0.0, flushes_in + FLUSH_GRACE)
        indicator.confirmed.clear()
        # Only a look begun after the wait confirms the window (then re-armed: it is open).
        indicator.wanted_since = time.monotonic() + wait
        await asyncio.sleep(wait)
        if indicator.turn_id is not None:
            indicator.confirmed.set()  # type: ignore[unreachable]  # a turn started meanwhile (mypy: not across the await)
        return True

    async def _send(self, indicator: Indicator) -> float:
        """One typing call within its deadline; returns the pause before the next."""
        faults = faults_for(indicator.channel)
        try:
            await asyncio.wait_for(indicator.transport.send_typing(indicator.target),
                                   indicator.transport.typing_refresh)
        except Exception as exc:  # best effort: never in a turn's way
            indicator.failing = True
            faults.failed(exc)
            retry_after = getattr(exc, "retry_after", None)  # flood control: wait as asked
            return max(indicator.refresh, clamp_retry_after(retry_after)) if retry_after else indicator.refresh
        if indicator.failing:
            indicator.failing = False
            faults.recovered()
        return indicator.refresh

    async def stop(self) -> None:
        await self.reactions.stop()
        indicators = list(self.indicators.values())
        self.indicators.clear()
        tasks = [indicator.task for indicator in indicators if indicator.task is not None]  # (each listed has one)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        self.db.close()
