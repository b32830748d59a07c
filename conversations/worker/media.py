"""Files: fetched while their burst's window is still open (the loop below claims due
files every AGENTLOOP_MEDIA_POLL seconds), and settled before a turn that carries them
starts (`settle`: a file nobody has taken yet is fetched by the turn itself, one being
fetched elsewhere is waited for), within AGENTLOOP_MEDIA_WAIT."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.conf import settings

from agentloop.core.backoff import DATABASE_FAULTS, Backoff
from conversations.media import fetching, transcribe

if TYPE_CHECKING:  # for annotations only
    from conversations.models import MediaFile
    from conversations.worker.supervisor import Worker

log = logging.getLogger(__name__)

MAX_FETCHES = 8  # at once per worker
WAIT_STEP = 0.1


class MediaFetcher:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.owner = worker.owner
        self.fetching: dict[int, asyncio.Task[None]] = {}

    async def loop(self) -> None:
        backoff = Backoff()
        while True:
            try:
                room = MAX_FETCHES - len(self.fetching)
                if room > 0 and self.worker.liveness.holding():
                    await self.take(await self.worker.db(fetching.due_ids, room))
                backoff.reset()
            except DATABASE_FAULTS:
                await asyncio.sleep(backoff.next())  # reported once by the database thread
            except Exception:
                log.exception("claiming files to fetch failed")
                await asyncio.sleep(max(backoff.next(), 0.5))
            await asyncio.sleep(settings.AGENTLOOP_MEDIA_POLL)

    async def take(self, ids: Iterable[int]) -> None:
        """Claim these files and start fetching each (in the background)."""
        ids = [pk for pk in ids if pk not in self.fetching]
        for file in await self.worker.db(fetching.claim, ids, self.owner) if ids else []:
            task = asyncio.create_task(self.fetch_one(file))
            self.fetching[file.pk] = task
            task.add_done_callback(functools.partial(self._fetched, file.pk))

    def _fetched(self, pk: int, _task: asyncio.Task[None]) -> None:
        self.fetching.pop(pk, None)  # its fetch ended, however: settle() waits for it no more

    async def fetch_one(self, file: MediaFile) -> None:
        db = self.worker.db
        try:
            data = await fetching.fetch(file)
            stored = await asyncio.to_thread(fetching.save, file, data)
        except Exception as exc:  # the platform's, the storage's: this file's try failed
            await db.persist(fetching.mark_failed, file, self.owner, exc)
            return
        # Before the mark: a file is stored with its text, so it is transcribed once.
        stored.update(await transcribe.transcript_of(file, data))
        await db.persist(fetching.mark_stored, file, self.owner, stored)

    async def settle(self, ids: list[int], wait: float | None = None) -> None:
        """Return once every file of `ids` is settled (stored, skipped or failed), or
        `wait` seconds have passed: those still unsettled are told to the model as not
        read. A file pending and due is claimed and fetched here; one waiting out its
        backoff is fetched when it is due."""
        if not ids:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (settings.AGENTLOOP_MEDIA_WAIT if wait is None else wait)
        while loop.time() < deadline:
            try:
                states = await self.worker.db(fetching.states, ids)
            except DATABASE_FAULTS:
                await asyncio.sleep(WAIT_STEP)
                continue
            open_ = [pk for pk, (state, _) in states.items() if not fetching.is_settled(state)]
            if not open_:
                return
            due = [pk for pk in open_ if states[pk][0] == "pending" and pk not in self.fetching]
            if due:
                try:
                    await self.take(await self.worker.db(fetching.due_ids_among, due))
                except DATABASE_FAULTS:
                    pass
            mine = [self.fetching[pk] for pk in open_ if pk in self.fetching]
            if mine:  # ours: woken when they end; others': looked at again shortly
                await asyncio.wait(mine, timeout=max(0.0, min(1.0, deadline - loop.time())))
            else:
                await asyncio.sleep(WAIT_STEP)
