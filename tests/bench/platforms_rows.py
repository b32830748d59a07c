"""Rows of tests/bench/platforms.py in a module of their own (that one is at its size
limit): Teams (the Bot Connector's fake), Messenger and Instagram (Meta's Send API fake,
tests/fakes/graph_messenger.py, at a Page's and an account's rate) and SMS (Twilio's
fake, tests/fakes/twilio_api.py, at a long code's 1 message a second)."""

from tests.bench.platforms import Row


class Teams(Row):
    name, kind, slug, loadgen_kind = "Teams", "teams", "b-ms", "teams"
    ceiling, ceiling_says = 0.5, "1800 an hour into a thread, kept as 1 every 2 s"
    drain_chat = "29:bench-drain-user-0001"  # a personal chat: its conversation asked of the Connector once

    def start(self, stack):
        from tests.fakes.teams_api import FakeTeams

        self.fake = stack.enter_context(FakeTeams())

    def settings(self):
        from tests.support.teams import teams_settings

        return teams_settings(self.fake)

    def headers(self):
        return [f"Authorization: Bearer {self.fake.connector_token()}"]  # the Connector's token lives an hour

    def floods(self):
        return len(self.fake.refused())

    def send_times(self):
        refused = {id(c) for c in self.fake.refused()}
        return [(c.at, id(c) in refused) for c in self.fake.calls("create")]


class Messenger(Row):
    name, kind, slug, loadgen_kind = "Messenger", "messenger", "b-fb", "messenger"
    ceiling, ceiling_says = 300.0, "300 messages/s per Page (no chat paced)"
    drain_chat = "6645000000099999"
    PER_SECOND = 300

    def start(self, stack):
        from tests.fakes.graph_messenger import FakeMetaGraph
        from tests.support.messenger import ACCOUNTS

        self.fake = stack.enter_context(FakeMetaGraph(per_second=self.PER_SECOND,
                                                      accounts={ACCOUNTS[self.kind]: self.kind}))

    def settings(self):
        from tests.support.messenger import meta_settings

        return meta_settings(self.fake, self.kind)

    def secret(self):
        from tests.support.messenger import APP_SECRET

        return APP_SECRET

    def floods(self):
        return self.fake.messenger_floods

    def send_times(self):
        return [(c.at, not c.body.get("ok")) for c in self.fake.calls("send")]


class Instagram(Messenger):
    name, kind, slug, loadgen_kind = "Instagram", "instagram", "b-ig", "instagram"
    ceiling, ceiling_says = 100.0, "100 messages/s per account (no chat paced)"
    drain_chat = "17850000000099999"
    PER_SECOND = 100


class Sms(Row):
    name, kind, slug, loadgen_kind = "SMS", "sms", "b-sm", "sms"
    ceiling, ceiling_says = 1.0, "1 message/s per long code (Twilio queues the rest)"
    drain_chat = "+56900000001"

    def start(self, stack):
        from tests.fakes.twilio_api import FakeTwilio

        self.fake = stack.enter_context(FakeTwilio(per_second=1.0, report_status=False))

    def settings(self):
        from tests.support.sms import BENCH_PUBLIC, sms_settings

        return sms_settings(self.fake, BENCH_PUBLIC)

    def floods(self):
        return self.fake.over_rate + len([c for c in self.fake.calls("create") if c.status == 429])

    def send_times(self):
        return [(c.at, c.status == 429) for c in self.fake.calls("create")]
