"""The Matrix row of tests/bench/platforms.py (a Row by its attributes: see Row there)."""

import time

WARMUP, BURST = 200, 600


class Matrix:
    """Through a real Synapse (tests/support/synapse.py): a person's messages sent into
    ROOMS rooms by PUSHERS clients at once, each an HTTP send to Synapse. Synapse's own
    intake of those sends (one process, SQLite, the same two cores) is far below what the
    worker admits, so a live burst would measure Synapse: the burst is sent while no
    worker runs, and what is measured is the worker admitting that backlog from its
    `/sync` (resumed from the stored position), from the messages' `received_at`; Synapse's
    intake is reported beside it. No paced drain: the default pacing is Synapse's
    rc_message, 0.2 a second (a drain of 10 replies would outlast DRAIN_WAIT)."""

    name, kind, slug, loadgen_kind, drain_chat = "Matrix", "matrix", "b-mx", "", ""
    ceiling, ceiling_says = 0.2, "Synapse's default rc_message, 0.2/s a user"
    drains = False
    push_says = ("a backlog of m.room.message sent through Synapse while no worker ran, admitted from the "
                 "worker's /sync")
    ROOMS, PUSHERS = 20, 8

    def start(self, stack):
        import shutil
        import tempfile
        from pathlib import Path

        from tests.support.synapse import Synapse, User

        directory = tempfile.mkdtemp(prefix="bench-synapse-")
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        self.server = stack.enter_context(Synapse(Path(directory)))
        self.bot = User(self.server, *self.server.register("benchbot"))
        self.person = User(self.server, *self.server.register("benchana", admin=True))
        self.rooms = [self.person.create_room(self.bot.user_id) for _ in range(self.ROOMS)]

    def settings(self):
        return {"homeserver": self.server.url, "access_token": self.bot.token, "messages_per_second": 0}

    def ready(self, channel):
        channel.refresh_from_db(fields=["poll_session"])
        return bool(channel.poll_session.get("next_batch")) and self.bot.user_id in self.person.members(self.rooms[-1])

    def push(self, first, count):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.PUSHERS) as pool:
            list(pool.map(lambda i: self.person.say(self.rooms[i % self.ROOMS], f"mensaje {i} y"),
                          range(first, first + count)))

    def floods(self):
        return 0

    def headers(self):
        return []

    def secret(self):
        return ""

    def send_times(self):
        return []

    def intake(self, kit, make_channel, quiet):
        """(backlog admitted/s, [its figures]): see the class's docstring."""
        from conversations.models import InboundMessage

        found = make_channel(self, **quiet)
        admitted = InboundMessage.objects.filter(channel=found)
        proc = kit.worker()
        try:
            kit.wait_until(lambda: self.ready(found), 60, "Matrix's sync and its rooms joined")
            self.push(0, WARMUP)
            kit.wait_until(lambda: admitted.count() >= WARMUP, 120, "Matrix's warm-up admitted")
        finally:
            kit.stop(proc)
        began = time.monotonic()
        self.push(WARMUP, BURST)
        synapse = BURST / (time.monotonic() - began)
        began = time.monotonic()
        proc = kit.worker()
        try:
            kit.wait_until(lambda: admitted.count() >= WARMUP + BURST, 180, "Matrix's backlog admitted")
            wall = time.monotonic() - began
            stamps = sorted(admitted.order_by("pk").values_list("received_at", flat=True)[WARMUP:])
        finally:
            kit.stop(proc)
        from tests.bench.platforms import admitted_rate  # here: platforms.py imports this module

        rate = admitted_rate(stamps)
        print(f"  Matrix: Synapse took the {BURST} sends at {synapse:.0f}/s ({self.PUSHERS} clients); the worker, "
              f"started after, admitted them in {wall:.1f} s from its start")
        return rate, [{"rate": rate, "n": BURST, "wall": wall, "errors": WARMUP + BURST - admitted.count()}]
