"""Several Slack apps in one Slack channel, for the tests of bots talking to bots
(tests/end_to_end/test_slack_bot_loops.py): the fake Web API (FakeSlackAPI), each token
an app of its own (`name_bot`: its bot user, bot id, name and app id), and what one app
posts in a relayed channel delivered to every app there — the others and itself, as
Slack does — as the Events API's `message` event from a bot (`bot_id`, `bot_profile`,
`app_id`), signed with each app's signing secret and POSTed to its request URL.

Delivered from a thread of its own, after the answer to chat.postMessage, as Slack's
events come apart from the Web API's answers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tests.fakes.slack_api import FakeSlackAPI
from tests.fakes.slack_events import TEAM, envelope, message_event, post


@dataclass(frozen=True)
class App:
    token: str
    user_id: str  # its bot user (U…): `user` on its messages, `authorizations` of its events
    bot_id: str  # B…
    name: str  # bot_profile.name
    app_id: str  # A…: the envelope's api_app_id, the messages' app_id
    events_url: str = ""  # its request URL
    signing_secret: str = ""


class SlackWithBots(FakeSlackAPI):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.apps: dict[str, App] = {}  # token -> App
        self.relayed: set[str] = set()  # Slack channel ids whose apps hear each other
        self.deliveries: list[tuple[str, int]] = []  # (receiving app's name, HTTP status)
        self._caller = threading.local()  # the token of the request this handler thread serves

    def name_bot(self, app: App) -> None:
        with self._cond:
            self.apps[app.token] = app

    def relay(self, channel: str) -> None:
        with self._cond:
            self.relayed.add(channel)

    def _answer(self, method: str, body: dict) -> dict:
        answer = super()._answer(method, body)
        app = self.apps.get(getattr(self._caller, "token", ""))
        if app is not None and method == "auth.test" and answer.get("ok"):
            answer = {**answer, "user": app.name, "user_id": app.user_id, "bot_id": app.bot_id}
        if app is not None and method == "chat.postMessage" and answer.get("ok"):
            answer = {**answer, "message": {**answer["message"], "user": app.user_id, "bot_id": app.bot_id}}
            if answer["channel"] in self.relayed:
                threading.Thread(target=self._deliver, args=(app, answer["channel"], answer["message"]),
                                 daemon=True).start()
        return answer

    def _serve(self, method: str, token: str, body: dict):
        self._caller.token = token  # _answer is called on this thread, without the token
        return super()._serve(method, token, body)

    def _deliver(self, sender: App, channel: str, message: dict) -> None:
        event = message_event(sender.user_id, message["text"], channel=channel, channel_type="channel",
                              ts=message["ts"], thread_ts=message.get("thread_ts", ""), bot_id=sender.bot_id,
                              app_id=sender.app_id, bot_profile={"id": sender.bot_id, "app_id": sender.app_id,
                                                                 "name": sender.name, "team_id": TEAM})
        event.pop("client_msg_id")  # a person's client sets it; an app's message has none
        for app in list(self.apps.values()):
            if app.events_url:
                status, _ = post(app.events_url, for_app(app, event), app.signing_secret)
                with self._cond:
                    self.deliveries.append((app.name, status))
                    self._cond.notify_all()


def for_app(app: App, event: dict) -> dict:
    """The envelope of `event` as Slack sends it to `app`."""
    return {**envelope(event), "api_app_id": app.app_id,
            "authorizations": [{"enterprise_id": None, "team_id": TEAM, "user_id": app.user_id, "is_bot": True,
                                "is_enterprise_install": False}]}
