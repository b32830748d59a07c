"""The worker loop: fires flushes on time, runs turns concurrently, sends replies,
polls Telegram, and recovers what dead workers left behind.

Several of these can run side by side (any number of processes): every piece of work
is claimed by compare-and-swap with this worker's owner stamp.

Threads: the flusher is a plain thread sleeping until the earliest deadline (timing
matters there and must not queue behind turn work); turns, replies and pollers are
asyncio tasks on one event loop (agent calls are I/O-bound: hundreds run at once);
their database steps run on one executor thread with its own connection.
"""

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import telegram
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone
from telegram.error import Conflict, InvalidToken, NetworkError, TelegramError

from conversations import console, engine, turns
from conversations import telegram as telegram_inbound
from conversations.agents import AgentUnavailable, HandedOver, TurnCancelled, TurnContext, agent_for
from conversations.models import Turn, TurnState
from delivery import ledger
from delivery.models import OutboundKind, Outcome
from delivery.transports import SendResult, Target, close_bots, transport_for
from tools import guard, registry
from tools.registry import Scope

log = logging.getLogger(__name__)

APOLOGY = "Sorry — I couldn't finish that just now. Please try again in a moment."
HOUSEKEEPING_EVERY = 5.0
CANCEL_CHECK_EVERY = 0.2
SHUTDOWN_GRACE = 10.0




def _in_db_thread(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:
        # A broken connection must not poison every later step of this thread.
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        raise


def _invoke_for_conversation(name, arguments, conversation, actor):
    return guard.invoke(name, arguments, Scope.of_conversation(conversation), actor=actor)


def _close_connection():
    connection.close()  # the calling thread's own connection


class Batcher:
    """Collects calls made while the database thread is busy and runs them as one
    batch (one transaction, one commit) — hundreds of turns finishing together
    cost a handful of commits, not hundreds."""

    def __init__(self, worker, fn):
        self.worker, self.fn = worker, fn
        self.pending: list = []
        self.running = False

    async def __call__(self, item):
        future = asyncio.get_running_loop().create_future()
        self.pending.append((item, future))
        if not self.running:
            self.running = True
            asyncio.create_task(self._drain())
        return await future

    async def _drain(self):
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                try:
                    results = await self.worker.db(self.fn, [item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results):
                    future.set_result(result)
        finally:
            self.running = False


class Flusher(threading.Thread):
    """Sleeps until the earliest buffer deadline (at most `poll_interval`), then claims
    every due buffer by compare-and-swap and turns it into a ready turn — and starts the
    turns that are first in line for its own worker, while it has room."""

    def __init__(self, owner, on_flush, poll_interval, adopt=None, capacity=lambda: 0):
        super().__init__(name="flusher", daemon=True)
        self.owner = owner
        self.on_flush = on_flush
        self.poll_interval = poll_interval
        # Turns this flusher just created are started here and handed to the worker's
        # loop at once: no wake-up, no second claim query, one write fewer to wait for.
        self.adopt = adopt
        self.capacity = capacity
        self.wakeup = threading.Event()
        self.stopping = threading.Event()
        self.flushed = 0

    def run(self):
        try:
            while not self.stopping.is_set():
                self.wakeup.clear()
                try:
                    wait = self.step()
                except OperationalError as exc:
                    # e.g. chosen as a deadlock victim: the transaction rolled back whole.
                    log.warning("flusher step failed, retrying: %s", exc)
                    wait = 0.01
                except Exception:
                    log.exception("flusher step failed")
                    connection.close()
                    wait = 1.0
                if wait > 0:
                    self.wakeup.wait(wait)
        finally:
            connection.close()

    def step(self) -> float:
        """Flush what is due; return how long to sleep before the next look."""
        now = timezone.now()
        due = engine.due_buffer_ids(now)
        if due:
            room = self.capacity() if self.adopt is not None else 0
            try:
                flushed = engine.flush_many(due, now, owner=self.owner, start=room)
            except IntegrityError:
                # Another worker started a turn in one of these conversations meanwhile
                # (PostgreSQL): flush them as ready turns and let the queue decide.
                flushed = engine.flush_many(due, now, owner=self.owner)
            self.flushed += len(flushed)
            started = [turn for turn in flushed if turn.state == TurnState.RUNNING]
            if started:
                self.adopt(started)
            self.on_flush()
            return 0.0  # there may be more due right now
        deadline = engine.next_deadline(timezone.now())
        wait = self.poll_interval
        if deadline is not None:
            wait = min(wait, (deadline - timezone.now()).total_seconds())
        return max(0.0, wait)

    def stop(self):
        self.stopping.set()
        self.wakeup.set()


class Worker:
    def __init__(self, *, owner=None, poll_interval=None, max_concurrent=None, typing_interval=None,
                 poll_telegram=True):
        self.owner = owner or engine.new_owner()
        self.poll_interval = poll_interval or settings.AGENTLOOP_POLL_INTERVAL
        self.max_concurrent = max_concurrent or settings.AGENTLOOP_MAX_CONCURRENT_TURNS
        self.typing_interval = typing_interval or settings.AGENTLOOP_TYPING_INTERVAL
        self.poll_telegram = poll_telegram
        self.db_executor = ThreadPoolExecutor(1, thread_name_prefix="db")
        # Claiming ready turns has a thread of its own: a flushed turn starts without
        # queueing behind replies, history loads and sweeps on the main database thread.
        self.claim_executor = ThreadPoolExecutor(1, thread_name_prefix="claim")
        # A turn's history is read on a thread of its own too: behind the main database
        # thread's batches of replies it waited tens of ms before the model was asked.
        self.read_executor = ThreadPoolExecutor(1, thread_name_prefix="read")
        # Tools block (SMTP, CalDAV, waiting on an identical call in flight): their own
        # threads, each with its own connection, so they never hold up the turn plumbing.
        self.tool_executor = ThreadPoolExecutor(settings.AGENTLOOP_TOOL_THREADS, thread_name_prefix="tool")
        self.running: dict[int, asyncio.Task] = {}
        self.cancelled_by_user: set[int] = set()
        self.sends: set[asyncio.Task] = set()  # replies being sent by the ledger sweeps
        self._tools = (0.0, [])
        self.pollers: dict[int, asyncio.Task] = {}
        self.dead_owners: list[str] = []
        self.turns_done = 0
        self._stopping = None
        self._wakeup = None
        self.complete = Batcher(self, self.complete_turns)
        self.record_sends = Batcher(self, self.finish_sends)

    # --- plumbing ---------------------------------------------------------------

    async def db(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.db_executor, functools.partial(_in_db_thread, fn, *args, **kwargs))

    async def read(self, fn, *args, **kwargs):
        """A read on a turn's path, on the reader thread (never queued behind writes)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.read_executor, functools.partial(_in_db_thread, fn, *args, **kwargs))

    def wake(self):
        """Thread-safe: new turns may be ready, or a conversation's turn just ended."""
        self._loop.call_soon_threadsafe(self._wakeup.set)

    async def _sleep(self, seconds):
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        self._wakeup.clear()

    def request_stop(self):
        self._loop.call_soon_threadsafe(self._stopping.set)

    # --- main -------------------------------------------------------------------

    async def run(self, ready: threading.Event | None = None):
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()
        await self.housekeeping()  # recover dead workers' turns before anything else
        for name in settings.AGENTLOOP_AGENTS:  # import them now, not inside the first turn
            agent_for(name)
        await self.db(guard.ensure_policies)  # no policy row is written inside a turn
        await self.offered_tools()
        for agent, config in await self.db(engine.agents_in_use):
            try:
                await agent_for(agent).prepare(config)
            except Exception:
                log.exception("preparing agent %s failed", agent)
        self.flusher = Flusher(self.owner, self.wake, self.poll_interval,
                               adopt=lambda started: self._loop.call_soon_threadsafe(self._adopt, started),
                               capacity=lambda: self.max_concurrent - len(self.running))
        self.flusher.start()
        log.info("worker %s started", self.owner)
        if ready is not None:
            ready.set()
        loops = [self.turn_loop(), self.ledger_loop(), self.housekeeping_loop(), self.cancel_loop()]
        if self.poll_telegram:
            loops.append(self.poller_loop())
        tasks = [asyncio.create_task(c) for c in loops]
        await self._stopping.wait()
        await self.shutdown(tasks)

    async def shutdown(self, tasks):
        log.info("worker %s stopping", self.owner)
        self.flusher.stop()
        for task in tasks + list(self.pollers.values()):
            task.cancel()
        if self.running:
            done, pending = await asyncio.wait(list(self.running.values()), timeout=SHUTDOWN_GRACE)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*tasks, *self.pollers.values(), return_exceptions=True)
        if self.sends:  # let replies mid-send finish and be recorded (else: resent, labelled)
            await asyncio.wait(list(self.sends), timeout=SHUTDOWN_GRACE)
        await close_bots()
        await self.db(self._release_leases)
        await self.db(engine.retire, self.owner)
        await asyncio.get_running_loop().run_in_executor(None, self.flusher.join, 5)
        self.db_executor.submit(_close_connection).result()
        self.db_executor.shutdown(wait=True)
        for executor in (self.claim_executor, self.read_executor):
            executor.submit(_close_connection).result()
            executor.shutdown(wait=True)
        self.tool_executor.shutdown(wait=False, cancel_futures=True)

    def _release_leases(self):
        for channel_id in list(self.pollers):
            telegram_inbound.release_lease(channel_id, self.owner)

    async def housekeeping(self):
        await self.db(engine.beat, self.owner)
        await self.db(guard.sweep)
        self.dead_owners = await self.db(engine.dead_owners)
        await self.db(ledger.abandon_stale, None, self.dead_owners)
        if await self.db(turns.release_external):
            self._wakeup.set()
        if self.dead_owners:
            recovered = await self.db(engine.recover_turns, self.dead_owners)
            if recovered:
                log.info("recovered %d turns from dead workers", len(recovered))
                self._wakeup.set()

    async def housekeeping_loop(self):
        while True:
            await asyncio.sleep(HOUSEKEEPING_EVERY)
            try:
                await self.housekeeping()
                await self.db(engine.forget_workers, self.dead_owners)
            except Exception:
                log.exception("housekeeping failed")

    # --- turns --------------------------------------------------------------------

    async def turn_loop(self):
        while True:
            try:
                capacity = self.max_concurrent - len(self.running)
                if capacity > 0:
                    loop = asyncio.get_running_loop()
                    claimed = await loop.run_in_executor(
                        self.claim_executor, functools.partial(_in_db_thread, self.claim_turns, capacity))
                    for turn in claimed:
                        self.running[turn.pk] = asyncio.create_task(self.run_turn(turn))
            except Exception:
                log.exception("claiming turns failed")
                await asyncio.sleep(1.0)
            await self._sleep(self.poll_interval)

    def _adopt(self, started):
        """Run turns the flusher started for this worker (on the event loop)."""
        for turn in started:
            if self._stopping.is_set():
                asyncio.create_task(self.db(self._release_turn, turn.pk))
            elif turn.pk not in self.running:
                self.running[turn.pk] = asyncio.create_task(self.run_turn(turn))

    def claim_turns(self, limit):
        return turns.start_many(turns.ready_candidates(limit), self.owner)

    async def run_turn(self, turn):
        conversation, channel = turn.conversation, turn.conversation.channel
        transport = transport_for(channel)
        target = Target(conversation.chat_id, turn.reply_target, turn.thread_id, conversation_id=conversation.pk)
        typing = None
        if channel.typing_enabled and transport.supports_typing:
            typing = asyncio.create_task(self.keep_typing(transport, target))
        state, reply, outcome = TurnState.DONE, "", ""
        try:
            ctx = TurnContext(turn_id=turn.pk, conversation_id=conversation.pk, channel_slug=channel.slug,
                              text=turn.merged_input, config=channel.agent_config, channel_kind=channel.kind,
                              contact_name=turn.conversation.sender_id,
                              load_history=functools.partial(self.read, engine.conversation_history,
                                                             conversation, turn),
                              mark_effect=functools.partial(self.db, turns.mark_effect, turn.pk),
                              call_tool=functools.partial(self.call_tool, turn, conversation),
                              load_tools=self.offered_tools)
            reply = await agent_for(channel.agent).respond(ctx)
        except (asyncio.CancelledError, TurnCancelled):
            if turn.pk not in self.cancelled_by_user:
                # Shutdown: hand the turn back unless it already acted.
                await asyncio.shield(self.db(self._release_turn, turn.pk))
            return
        except HandedOver:
            await self.db(turns.hand_over, turn.pk, self.owner, turns.EXTERNAL_WEBHOOK)
            return
        except AgentUnavailable as exc:
            log.warning("turn %s ended without an answer from agent %s: %s", turn.pk, channel.agent, exc)
            state, reply, outcome = TurnState.FAILED, APOLOGY, f"agent unavailable: {exc}"
        except Exception as exc:
            log.exception("turn %s failed in agent %s", turn.pk, channel.agent)
            state, reply, outcome = TurnState.FAILED, APOLOGY, f"{type(exc).__name__}: {exc}"
        finally:
            if typing is not None:
                typing.cancel()
            self.running.pop(turn.pk, None)
            self.cancelled_by_user.discard(turn.pk)
        outbound = await self.record_completion(turn, state, reply, outcome)
        self.turns_done += 1
        self.flusher.wakeup.set()  # a buffer may have been waiting for this turn
        if outbound is not None:
            await self.send(outbound)

    async def offered_tools(self):
        """The tools offered to models, refreshed from the policies every few seconds
        (not a database round trip in every turn)."""
        expires, tools = self._tools
        if time.monotonic() >= expires:
            tools = await self.db(guard.offered_tools)
            self._tools = (time.monotonic() + guard.POLICY_CACHE_SECONDS, tools)
        return tools

    async def call_tool(self, turn, conversation, name, arguments):
        """A tool call from inside a turn, through the action guard; the result is what
        the model gets back (a refusal or failure is a result too, never an exception)."""
        try:
            tool = registry.get(name)
        except registry.UnknownTool as exc:
            return {"status": "failed", "duplicate": False, "error": str(exc)}
        if tool.guarded and not await self.db(turns.mark_effect, turn.pk):
            raise TurnCancelled()
        loop = asyncio.get_running_loop()
        invoke = functools.partial(_in_db_thread, _invoke_for_conversation, name, arguments, conversation,
                                   f"worker:{self.owner}")
        try:
            outcome = await loop.run_in_executor(self.tool_executor, invoke)
        except (registry.InvalidArguments, guard.ToolDisabled) as exc:
            return {"status": "failed", "duplicate": False, "error": str(exc)}
        return outcome.for_model()

    async def record_completion(self, turn, state, reply, outcome, attempts=3):
        """Write the turn's end down, retrying a failed batch; a turn must never stay
        RUNNING under a live worker that no longer runs it."""
        for attempt in range(1, attempts + 1):
            try:
                return await self.complete((turn, state, reply, outcome))
            except Exception:
                log.exception("recording the end of turn %s failed (attempt %d)", turn.pk, attempt)
                await asyncio.sleep(0.5 * attempt)
        await self.db(self._release_turn, turn.pk)  # run again elsewhere, if it fired no effect
        return None

    def complete_turns(self, finished):
        """Finish turns and write their replies into the ledger, in one transaction. A
        turn that was cancelled meanwhile gets None: its reply must not go out. The
        replies are written pending — a crash now leaves them unsent, and they will go
        out plain — then claimed by this worker, which sends them right away."""
        with transaction.atomic():
            ours = turns.finish_many([(turn.pk, state, reply, outcome[:300])
                                      for turn, state, reply, outcome in finished], self.owner)
            console.turns_finished([item for item in finished if item[0].pk in ours])
            replies = {}
            for turn, state, reply, _ in finished:
                if turn.pk in ours and reply:
                    kind = OutboundKind.REPLY if state == TurnState.DONE else OutboundKind.NOTICE
                    replies[turn.pk] = ledger.Reply(turn.conversation, reply, kind=kind, turn=turn,
                                                    reply_target=turn.reply_target, thread_id=turn.thread_id)
            if not ledger.enabled():
                by_turn = dict(zip(replies, ledger.unrecorded(replies.values()), strict=True))
                return [by_turn.get(turn.pk) for turn, *_ in finished]
            written = dict(zip(replies, ledger.enqueue_many(replies.values()), strict=True))
        # A row another worker's sweep claimed first is that worker's to send.
        claimed = {row.pk for row in ledger.claim_written(list(written.values()), self.owner)}
        return [written[turn.pk] if turn.pk in written and written[turn.pk].pk in claimed else None
                for turn, *_ in finished]

    def _release_turn(self, turn_id):
        turn = Turn.objects.select_related("conversation").filter(pk=turn_id, owner=self.owner).first()
        if turn is not None:
            engine.give_up_turn(turn)

    async def keep_typing(self, transport, target):
        """Telegram's indicator lasts ~5 s: refresh it until the turn ends."""
        while True:
            try:
                await transport.send_typing(target)
            except Exception as exc:
                log.debug("typing indicator failed: %s", exc)
            await asyncio.sleep(self.typing_interval)

    async def cancel_loop(self):
        """Turns cancelled by another process (/stop, interrupt, rollback) are stopped here."""
        while True:
            await asyncio.sleep(CANCEL_CHECK_EVERY)
            if not self.running:
                continue
            try:
                ids = await self.db(self._cancelled_among, list(self.running))
            except Exception:
                log.exception("cancel check failed")
                continue
            for turn_id in ids:
                task = self.running.get(turn_id)
                if task is not None:
                    self.cancelled_by_user.add(turn_id)
                    task.cancel()

    @staticmethod
    def _cancelled_among(turn_ids):
        return list(Turn.objects.filter(pk__in=turn_ids, state=TurnState.CANCELLED).values_list("pk", flat=True))

    # --- replies ------------------------------------------------------------------

    async def send(self, row):
        """Send a ledger row this worker has claimed and record the outcome. An error of
        our own counts as ambiguous (it may have gone out): resent later, labelled."""
        try:
            result = await ledger.send(row)
        except Exception as exc:
            log.exception("sending ledger row %s failed", row.pk)
            result = SendResult.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__}: {exc}")
        await self.record_sends((row, result))

    def finish_sends(self, outcomes):
        with transaction.atomic():
            ledger.finish_many(outcomes, self.owner)
        return [None] * len(outcomes)

    def _send_in_background(self, rows):
        for row in rows:
            task = asyncio.create_task(self.send(row))
            self.sends.add(task)
            task.add_done_callback(self.sends.discard)

    async def boot_sweep(self):
        """At start: claim what dead owners left mid-send, what waits for a start (the
        last budgeted resend) and anything due, and send it (labelled where it may have
        gone out already). The claimed rows stay `attempting` under this worker for the
        whole send, so no runtime sweep can take them too."""
        total = 0
        while True:
            rows = await self.db(ledger.claim_due, self.owner, self.dead_owners, 500, None, True)
            if not rows:
                break
            total += len(rows)
            self._send_in_background(rows)
        if total:
            log.info("boot sweep: %d ledger rows claimed for delivery", total)
        return total

    async def ledger_loop(self):
        """The runtime sweep: pending rows (written by other processes), failed rows whose
        timer is due (flood penalties, backoffs) and rows of owners that died meanwhile."""
        await self.boot_sweep()
        while True:
            try:
                rows = await self.db(ledger.claim_due, self.owner, self.dead_owners, 500)
                self._send_in_background(rows)
                if len(rows) == 500:
                    continue  # more due right now
            except Exception:
                log.exception("ledger sweep failed")
                await asyncio.sleep(1.0)
            await asyncio.sleep(self.poll_interval)

    # --- Telegram long polling -------------------------------------------------------

    async def poller_loop(self):
        while True:
            try:
                wanted = set(await self.db(telegram_inbound.polling_channels))
                for channel_id in wanted - set(self.pollers):
                    self.pollers[channel_id] = asyncio.create_task(self.poll_channel(channel_id))
                for channel_id in set(self.pollers) - wanted:
                    self.pollers.pop(channel_id).cancel()
            except Exception:
                log.exception("poller supervision failed")
            await asyncio.sleep(HOUSEKEEPING_EVERY)

    async def poll_channel(self, channel_id):
        """One poller per bot (a lease): getUpdates with the persisted offset. A network
        failure rebuilds the Bot; the durable dedup keeps a re-delivered batch out."""
        backoff = 1.0
        while True:
            channel = await self.db(telegram_inbound.take_lease, channel_id, self.owner)
            if channel is None:
                await asyncio.sleep(HOUSEKEEPING_EVERY)
                continue
            bot = telegram.Bot(channel.bot_token, base_url=f"{channel.api_base.rstrip('/')}/bot")
            try:
                async with bot:
                    await bot.delete_webhook()  # getUpdates is refused while a webhook is set
                    await self.poll_batches(bot, channel)
                backoff = 1.0
            except (NetworkError, Conflict) as exc:
                log.warning("channel %s: polling failed (%s); rebuilding in %.0fs", channel.slug, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
            except (InvalidToken, TelegramError) as exc:
                log.error("channel %s: polling stopped: %s", channel.slug, exc)
                await asyncio.sleep(60.0)
            except Exception:
                # e.g. the database while admitting: the batch was not confirmed and is
                # polled again (the dedup drops what got in); the poller must not die.
                log.exception("channel %s: polling failed; retrying in %.0fs", channel.slug, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)

    async def poll_batches(self, bot, channel):
        offset = channel.poll_offset
        while True:
            updates = await bot.get_updates(
                offset=offset, timeout=settings.AGENTLOOP_TELEGRAM_POLL_TIMEOUT, allowed_updates=["message"]
            )
            if updates:
                batch = [u.to_dict() for u in updates]
                admitted = await self.db(telegram_inbound.admit_polled, channel.pk, self.owner, batch)
                offset = max(u.update_id for u in updates) + 1
                if admitted:
                    self.flusher.wakeup.set()
            if await self.db(telegram_inbound.take_lease, channel.pk, self.owner) is None:
                return  # another worker took over
