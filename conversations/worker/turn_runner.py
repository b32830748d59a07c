"""Turns: claim ready turns, run them (many at once on the event loop), write their
ends down with their replies, stop the ones cancelled from elsewhere."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from agentloop.core.backoff import DATABASE_FAULTS, Backoff, IdlePoll
from audit.failpoints import failpoint
from conversations import agent_sessions, console, engine, languages, limits, routing, spans, turns
from conversations.agents import AgentUnavailable, HandedOver, TurnCancelled, TurnContext, agent_for, answer_of
from conversations.media import for_agents, outbound
from conversations.models import ConversationState, Turn, TurnState
from conversations.worker import streams
from conversations.worker.dbthread import Batcher, until_answered
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState

if TYPE_CHECKING:  # for annotations only
    from django_stubs_ext import StrOrPromise

    from agentloop.core.tracing import NoSpan
    from agentloop.core.tracing_export import Span
    from conversations.agents import Answer
    from conversations.worker.supervisor import Worker
    from delivery.attachments import OutboundFile

    # A turn's end as the agent left it: (turn, its state, its reply — our own texts lazy,
    # in the user's language only when written down —, its outcome).
    Finished = tuple[Turn, TurnState, StrOrPromise, str]
    # The same, its reply in words (inside the completion).
    Written = tuple[Turn, TurnState, str, str]

log = logging.getLogger(__name__)

APOLOGY = _("Sorry — I couldn't finish that just now. Please try again in a moment.")
CANCEL_CHECK_EVERY = 0.2
# A RUNNING turn of ours that we do not run is given back only when older than this:
# one the flusher has just started is on its way to the event loop.
ORPHAN_AFTER = 10.0


def deadline_for(config: dict[str, Any] | None) -> float:
    """Seconds an agent may take for a whole turn (not only per HTTP request)."""
    return float((config or {}).get("deadline") or settings.AGENTLOOP_AGENT_DEADLINE)


class TurnRunner:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner
        self.running: dict[int, asyncio.Task[None]] = {}
        self.cancelled_by_user: set[int] = set()
        self.cancel_reasons: dict[int, str] = {}  # turn -> why it was cancelled (/stop, interrupt…)
        # Streamed turns (conversations.worker.streams), until their end is written down.
        self.streams: dict[int, streams.TurnStream] = {}
        # Turns whose answer is in hand and whose end is being written down (while the
        # database is away, for as long as it takes): this worker still holds them.
        self.finishing: set[int] = set()
        # The stamp the last completion batch put (or tried to put) on each finishing
        # turn's reply row: after a lost answer, the row is ours to send only if it bears it.
        self.claim_tokens: dict[int, str] = {}
        # The stored files of each finishing turn's answer (written onto its reply row).
        self.attached: dict[int, tuple[OutboundFile, ...]] = {}
        # Each running turn's span (agentloop.core.tracing), the parent of its reply's sends.
        self.traceparents: dict[int, str | None] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # every turn task, until it is over
        self.releases: set[asyncio.Task[None]] = set()  # turns started while stopping, handed back
        self.done = 0
        self.complete: Batcher[Finished, OutboundMessage | None] = Batcher(worker.db, self.complete_turns)

    def capacity(self) -> int:
        if not self.worker.liveness.holding():
            return 0  # the others may be taking this worker's work over: start nothing
        return self.worker.max_concurrent - len(self.running)

    async def loop(self) -> None:
        worker, backoff = self.worker, Backoff()
        pace = IdlePoll(worker.poll_interval, worker.idle_poll_interval)  # its flusher's turns wake it
        while True:
            try:
                if self.capacity() > 0:
                    for turn in await worker.claim(self.claim_turns, self.capacity()):
                        self.start(turn)
                backoff.reset()
            except DATABASE_FAULTS:
                await asyncio.sleep(backoff.next())  # reported once by the database thread
            except Exception:
                log.exception("claiming turns failed")
                await asyncio.sleep(max(backoff.next(), 0.5))
            await worker.sleep(pace.after(bool(self.running)))  # turns claimed or still running

    def start(self, turn: Turn) -> None:
        # Typing first, synchronously: a window's loop carries on into the turn, never unheld.
        self.worker.typing.turn_started(turn)
        task = asyncio.create_task(self.run_turn(turn))
        self.running[turn.pk] = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        # A task cancelled before its first step never reaches run_turn's `finally`.
        task.add_done_callback(lambda _: self.worker.typing.turn_ended(turn))

    def adopt(self, started: list[Turn]) -> None:
        """Run turns the flusher started for this worker (on the event loop)."""
        for turn in started:
            if self.worker.stopping():
                self.releases.add(asyncio.create_task(
                    self.worker.db.persist(self.release_turn, turn.pk, deadline=self.worker.stop_deadline)))
            elif turn.pk not in self.running:
                self.start(turn)

    def claim_turns(self, limit: int) -> list[Turn]:
        return turns.start_many(turns.ready_candidates(limit), self.owner)

    def context(self, turn: Turn) -> TurnContext:
        worker, conversation = self.worker, turn.conversation
        channel = conversation.channel
        return TurnContext(turn_id=turn.pk, conversation_id=conversation.pk, channel_slug=channel.slug,
                           text=turn.merged_input, config=channel.agent_config, channel_kind=channel.kind,
                           contact_name=conversation.sender_id, language=languages.of(conversation),
                           load_history=functools.partial(worker.read, engine.conversation_history,
                                                          conversation, turn),
                           mark_effect=functools.partial(worker.db, turns.mark_effect, turn.pk),
                           call_tool=functools.partial(worker.tools.call, turn, conversation),
                           load_tools=functools.partial(worker.tools.offered_for, conversation),
                           # Lambdas where the agent gives the rest (mypy's partial wants the call whole).
                           record_usage=lambda tokens: worker.db(limits.add_tokens, turn.pk, tokens),
                           load_session=lambda key: worker.read(agent_sessions.load, conversation.pk, key),
                           save_session=lambda key, state, *, new: worker.db(agent_sessions.save, conversation.pk,
                                                                             key, state, new=new))

    async def settled_media(self, turn: Turn) -> list[for_agents.Attachment]:
        """The turn's files once settled (fetched here if nobody has: conversations.worker.media)."""
        read = self.worker.read
        ids = await until_answered(functools.partial(read, for_agents.file_ids_of_turn, turn))
        await self.worker.media.settle(ids)
        return await until_answered(functools.partial(read, for_agents.attachments, ids))

    async def run_turn(self, turn: Turn) -> None:
        """Run a turn under its span (agentloop.core.tracing: the child of its flush's);
        its reply, written down, is sent after the span ends — each send its own span,
        the child of this one through the ledger row."""
        with spans.turn(turn, routing.agent_of(turn)[0]) as span:
            self.traceparents[turn.pk] = span.traceparent
            outbound = await self.ran(turn, span)
        if outbound is not None:
            await self.worker.replies.send(outbound)

    async def ran(self, turn: Turn, span: Span | NoSpan) -> OutboundMessage | None:
        """The turn run and its end written down: its reply row to send, or None."""
        channel = turn.conversation.channel
        # A routing rule's agent, or the channel's own (conversations.routing).
        agent_name, agent_config = routing.agent_of(turn)
        reply: StrOrPromise
        state, reply, outcome = TurnState.DONE, "", ""
        deadline = deadline_for(agent_config)
        stream: streams.TurnStream | None = None
        try:
            if limits.applies(channel) and await self.worker.db(limits.hold_if_over, turn):
                raise TurnCancelled("its contact is over a limit")  # stored, audited, noticed once
            context = self.context(turn)
            context.config = agent_config
            if turn.has_media:  # before the agent's deadline starts: the files are the platform's time
                context.media = await self.settled_media(turn)
            agent = agent_for(agent_name)
            stream = await streams.open_stream(self.worker, turn, agent, context)
            with spans.agent_call(agent_name, agent_config, stream is not None):
                if stream is None:
                    answer = await asyncio.wait_for(agent.respond(context), deadline)
                else:
                    self.streams[turn.pk] = stream
                    answer = await asyncio.wait_for(stream.consume(agent.stream(context)), deadline)
            reply = await self.stored_answer(turn, answer)
        except (asyncio.CancelledError, TurnCancelled) as exc:
            await self.stopped(turn, stream, span, by_agent=isinstance(exc, TurnCancelled))
            return None
        except HandedOver:
            await self.worker.db.persist(turns.hand_over, turn.pk, self.owner, turns.EXTERNAL_WEBHOOK)
            self.traceparents.pop(turn.pk, None)
            span.set({"agentloop.turn.state": "handed_over"})
            return None
        except TimeoutError:
            # Never re-run: it may have acted before it went quiet.
            log.warning("turn %s: agent %s gave no answer within %g s", turn.pk, agent_name, deadline)
            state, reply, outcome = TurnState.FAILED, APOLOGY, f"agent unavailable: no answer within {deadline:g} s"
        except AgentUnavailable as exc:
            log.warning("turn %s ended without an answer from agent %s: %s", turn.pk, agent_name, exc)
            state, reply, outcome = TurnState.FAILED, APOLOGY, f"agent unavailable: {exc}"
        except Exception as exc:
            log.exception("turn %s failed in agent %s", turn.pk, agent_name)
            state, reply, outcome = TurnState.FAILED, APOLOGY, f"{type(exc).__name__}: {exc}"
        finally:
            # Before the reply goes out: no indicator after it.
            self.worker.typing.turn_ended(turn, cancelled=turn.pk in self.cancelled_by_user)
            self.running.pop(turn.pk, None)
            self.cancelled_by_user.discard(turn.pk)
        return await self.ended(turn, span, stream, state, reply, outcome)

    async def stopped(self, turn: Turn, stream: streams.TurnStream | None, span: Span | NoSpan, *,
                      by_agent: bool) -> None:
        """The run stopped before an answer: cancelled by the user (or the agent found its turn
        cancelled — an effect refused — before the cancel loop did: not ours to hand back either
        way), or the worker shutting down (handed back unless it acted: then what it streamed is
        saved first, and the recovery sends it)."""
        if turn.pk in self.cancelled_by_user or by_agent:
            await asyncio.shield(self.stream_cancelled(turn, stream))
        else:
            await asyncio.shield(self.hand_back(turn, stream))
        self.streams.pop(turn.pk, None)
        self.traceparents.pop(turn.pk, None)
        span.set({"agentloop.turn.state": "cancelled" if turn.pk in self.cancelled_by_user else "handed_back"})

    async def ended(self, turn: Turn, span: Span | NoSpan, stream: streams.TurnStream | None, state: TurnState,
                    reply: StrOrPromise, outcome: str) -> OutboundMessage | None:
        """The run's end written down (its reply row to send, or None), the flusher woken."""
        if stream is not None:
            await stream.close()  # previews stop before the final goes: it is never delayed by them
        failpoint("turn.after_answer")
        outbound = await self.record_completion(turn, state, reply, outcome)
        span.set({"agentloop.turn.state": str(state), "agentloop.turn.replied": outbound is not None})
        if state == TurnState.FAILED:
            span.fail(outcome)
        self.done += 1
        flusher = self.worker.flusher
        assert flusher is not None  # made before any turn starts
        if flusher.saw_open_buffers:
            # A buffer may have been waiting for this turn. With none open at the last look there
            # is nothing to wake for: one opened since (by another process) is found at the next
            # look anyway, and 500 turns ending together woke the flusher hundreds of times.
            flusher.wakeup.set()
        return outbound

    async def hand_back(self, turn: Turn, stream: streams.TurnStream | None) -> None:
        if stream is not None:
            await stream.close()
            await stream.save_now()
        await self.worker.db.persist(self.release_turn, turn.pk, deadline=self.worker.stop_deadline)

    async def stream_cancelled(self, turn: Turn, stream: streams.TurnStream | None) -> None:
        """A streamed turn cancelled from elsewhere: /stop ends it with what was said so
        far, marked as stopped (a ledger row: the preview is replaced by it); a new
        message (interrupt, rollback) or /reset takes the preview away."""
        reason = self.cancel_reasons.pop(turn.pk, "")
        if stream is None:
            return
        if reason.startswith("/stop") and stream.text.strip():
            preview = await stream.close()
            await self.worker.db.persist(streams.write_stopped, turn, stream.text, preview)
        else:
            await stream.discard()

    async def stored_answer(self, turn: Turn, answer: str | Answer) -> str:
        """The answer's text; its files stored first (off the event loop), kept for the
        reply row. A storage that fails is a failed turn: the agent is not run again."""
        answer = answer_of(answer)
        if not answer.files:
            return answer.text
        text, files = await asyncio.to_thread(outbound.stored_answer, turn.conversation.channel_id, answer,
                                              languages.of(turn.conversation))
        self.attached[turn.pk] = files
        return text

    async def record_completion(self, turn: Turn, state: TurnState, reply: StrOrPromise, outcome: str,
                                attempts: int = 3) -> OutboundMessage | None:
        """Write the turn's end down with its reply. While the database is away the
        reply waits here, in memory, and the write is tried again (backing off) until
        the database answers: the turn is neither lost nor run again. Only a write that
        fails for another reason, `attempts` times, hands the turn back."""
        self.finishing.add(turn.pk)
        try:
            backoff, failures = Backoff(), 0
            while True:
                try:
                    return await self.complete((turn, state, reply, outcome))
                except DATABASE_FAULTS:
                    await asyncio.sleep(backoff.next())
                    # The write may have gone through before the connection died.
                    done, row = await until_answered(functools.partial(self.worker.db, self.written_before, turn.pk))
                    if done:
                        return row
                except Exception:
                    failures += 1
                    log.exception("recording the end of turn %s failed (attempt %d)", turn.pk, failures)
                    if failures >= attempts:
                        await self.worker.db.persist(self.release_turn, turn.pk)  # run again elsewhere, if no effect
                        return None
                    await asyncio.sleep(0.5 * failures)
        finally:
            self.finishing.discard(turn.pk)
            self.claim_tokens.pop(turn.pk, None)
            self.attached.pop(turn.pk, None)
            self.streams.pop(turn.pk, None)
            self.traceparents.pop(turn.pk, None)

    def written_before(self, turn_id: int) -> tuple[bool, OutboundMessage | None]:
        """After a failed completion: (True, its reply row to send, or None) if this
        worker's write went through all the same — the reply row is still ours to send
        if pending, or claimed with the completion's own stamp (we never got it back, so
        it was not sent) — or (False, None) if the turn is still running, to be written
        again. A row this worker's sweep claimed meanwhile (pending once the completion
        committed, before its claim) bears the sweep's stamp: the sweep sends it, and
        sending it here as well was a second, unlabelled copy."""
        if Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=self.owner).exists():
            return False, None
        token = self.claim_tokens.setdefault(turn_id, ledger.new_token())
        rows = OutboundMessage.objects.filter(turn_id=turn_id, kind__in=(OutboundKind.REPLY, OutboundKind.NOTICE))
        pending = list(rows.filter(state=OutboundState.PENDING).values_list("pk", flat=True))
        if pending:  # its answer may be lost too: then the row is found below, by its stamp
            claimed = ledger.claim_many(pending, self.owner, token=token)
            if claimed:
                return True, claimed[0]  # with its send slot, if paced
        mine = rows.filter(state=OutboundState.ATTEMPTING, owner=self.owner, claim_token=token)
        return True, mine.select_related("channel").first()

    def complete_turns(self, finished: list[Finished]) -> list[OutboundMessage | None]:
        """Finish turns and write their replies into the ledger, in one transaction. A
        turn that was cancelled meanwhile gets None: its reply must not go out. The
        replies are written pending — a crash now leaves them unsent, and they will go
        out plain — then claimed by this worker, which sends them right away."""
        # Our own texts (the apology) in each user's language, as the turn keeps them too.
        worded: list[Written] = [
            (turn, state, languages.text_for(turn.conversation, reply) if isinstance(reply, Promise) else reply,
             outcome) for turn, state, reply, outcome in finished]
        replies = self.replies_of(worded)
        if not ledger.enabled():
            with transaction.atomic():
                ours = self.finish(worded)
            by_turn = dict(zip(replies, ledger.unrecorded(replies.values()), strict=True))
            return [by_turn.get(turn.pk) if turn.pk in ours else None for turn, *_ in worded]
        # The rows and their INSERT made before the transaction, which on SQLite holds the
        # database's one write lock: they hang on no row it reads, only on which turns
        # were still this worker's to finish (all of them, but for a cancel meanwhile).
        prepared = ledger.prepare_many(replies.values())
        with transaction.atomic():
            ours = self.finish(worded)
            if ours.issuperset(replies):
                written = dict(zip(replies, ledger.enqueue_many(replies.values(), prepared), strict=True))
            else:
                mine = {turn_id: reply for turn_id, reply in replies.items() if turn_id in ours}
                written = dict(zip(mine, ledger.enqueue_many(mine.values()), strict=True))
        # A row another worker's sweep claimed first is that worker's to send. Without
        # its liveness lock this worker leaves them pending for a sweep (a claim of a
        # worker the others think dead would be taken over, and the reply labelled).
        rows = list(written.values()) if self.worker.liveness.holding() else []
        token = ledger.new_token()
        for turn_id in written:  # before the claim: its answer may never come back
            self.claim_tokens[turn_id] = token
        claimed = {row.pk for row in ledger.claim_written(rows, self.owner, token=token)}
        return [written[turn.pk] if turn.pk in written and written[turn.pk].pk in claimed else None
                for turn, *_ in worded]

    def finish(self, finished: list[Written]) -> set[int]:
        """The turns' ends written (inside the completion's transaction): the ids of
        those that were still this worker's to finish."""
        ours = turns.finish_many([(turn.pk, state, reply, outcome[:300])
                                  for turn, state, reply, outcome in finished], self.owner)
        console.turns_finished([item for item in finished if item[0].pk in ours])
        streams.record_streams([(turn.pk, self.streams[turn.pk]) for turn, *_ in finished
                                if turn.pk in ours and turn.pk in self.streams])
        return set(ours)

    def replies_of(self, finished: list[Written]) -> dict[int, ledger.Reply]:
        """{turn id: its ledger.Reply} of the finished turns that have something to say
        (made before their transaction: those whose turn was cancelled meanwhile are
        left out there)."""
        replies: dict[int, ledger.Reply] = {}
        for turn, state, reply, _outcome in finished:
            if reply or self.attached.get(turn.pk):
                kind = OutboundKind.REPLY if state == TurnState.DONE else OutboundKind.NOTICE
                stream = self.streams.get(turn.pk)
                replies[turn.pk] = ledger.Reply(turn.conversation, reply, kind=kind, turn=turn,
                                                reply_target=turn.reply_target, thread_id=turn.thread_id,
                                                files=self.attached.get(turn.pk, ()) if kind == OutboundKind.REPLY else (),
                                                preview_message_id=stream.preview_message_id if stream
                                                else turn.preview_message_id,
                                                traceparent=self.traceparents.get(turn.pk))
        return replies

    def held(self) -> set[int]:
        """Turns this worker holds on the event loop: running, or being written down."""
        return set(self.running) | self.finishing

    def give_back_orphans(self, held: set[int]) -> list[int]:
        """RUNNING turns stamped with this worker that it does not hold (a start whose
        answer was lost with its connection): given back (engine.give_up_turn)."""
        orphans: list[int] = engine.give_back_orphans(self.owner, held, older_than=ORPHAN_AFTER)
        return orphans

    def release_turn(self, turn_id: int) -> None:
        turn = Turn.objects.select_related("conversation").filter(pk=turn_id, owner=self.owner).first()
        if turn is not None:
            engine.give_up_turn(turn)

    async def cancel_loop(self) -> None:
        """Turns cancelled by another process (/stop, interrupt, rollback) are stopped here."""
        while True:
            await asyncio.sleep(CANCEL_CHECK_EVERY)
            if not self.running:
                continue
            try:
                cancelled = await self.worker.db(self.cancelled_among, list(self.running))
            except DATABASE_FAULTS:
                continue  # reported once by the database thread
            except Exception:
                log.exception("cancel check failed")
                continue
            for turn_id, reason in cancelled:
                task = self.running.get(turn_id)
                if task is not None:
                    self.cancelled_by_user.add(turn_id)
                    self.cancel_reasons[turn_id] = reason
                    task.cancel()

    @staticmethod
    def cancelled_among(turn_ids: list[int]) -> list[tuple[int, str]]:
        """(turn id, why) of these turns that were cancelled. A turn that started as a
        person took its conversation over (the takeover did not see it yet) and has
        fired no effect is cancelled here first (conversations.handoff)."""
        for turn_id in Turn.objects.filter(pk__in=turn_ids, state=TurnState.RUNNING, fired_effect=False,
                                           conversation__state=ConversationState.PERSON).values_list("pk", flat=True):
            turns.cancel(turn_id, "a person took the conversation over")
        # By id only (see turns.finish_many): cancelled turns pile up with double texting,
        # and SQLite would walk them all through the state index.
        return [(pk, outcome) for pk, state, outcome in
                Turn.objects.filter(pk__in=turn_ids).values_list("pk", "state", "outcome")
                if state == TurnState.CANCELLED]

    async def release_adopted(self) -> None:
        """Once the flusher has stopped: wait for the turns it started meanwhile to be
        handed back."""
        await asyncio.sleep(0)  # let the flusher's last hand-offs reach the loop
        await asyncio.gather(*self.releases, return_exceptions=True)

    async def stop(self, grace: float) -> None:
        """Let turns finish (and be written down) within `grace`; the rest are
        cancelled (handed back)."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
