"""The Matrix row of tests/bench/platforms.py (a Row by its attributes: see Row there)."""


class Matrix:
    """Through a real Synapse (tests/support/synapse.py): a person's messages sent into
    ROOMS rooms by PUSHERS clients at once, each an HTTP send to Synapse; the worker's
    `/sync` admits them. What is measured is bounded by Synapse's own intake of the sends
    on the same two cores. No paced drain: the default pacing is Synapse's rc_message,
    0.2 a second (a drain of 10 replies would outlast DRAIN_WAIT)."""

    name, kind, slug, loadgen_kind, drain_chat = "Matrix", "matrix", "b-mx", "", ""
    ceiling, ceiling_says = 0.2, "Synapse's default rc_message, 0.2/s a user"
    drains = False
    push_says = "m.room.message sent through Synapse, admitted from the worker's /sync"
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
