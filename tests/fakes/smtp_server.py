"""A real SMTP server on loopback (aiosmtpd) for the email tool's and the email platform's
tests: it records what it receives, can refuse a recipient (550), answer MAIL FROM 421
(busy) a number of times, and hold the reply to DATA until released (the moment a sender
that dies cannot know whether its message was accepted)."""

import threading
from dataclasses import dataclass
from email import message_from_bytes, policy

from aiosmtpd.controller import Controller

from tests.conftest import free_port


@dataclass
class Received:
    sender: str
    recipients: list
    message: object  # email.message.EmailMessage

    @property
    def subject(self):
        return self.message["Subject"]

    @property
    def body(self):
        return self.message.get_content().strip()


class FakeSMTP:
    def __init__(self):
        self.received: list[Received] = []
        self.data_started = threading.Event()  # a DATA command reached the server
        self.hold = False
        self.release = threading.Event()
        self.refuse = set()
        self.busy_next = 0  # MAIL FROMs answered 421 (busy, rate-limited), then accepted
        self.busy_answered = 0
        self.refused = []  # the recipients answered 550
        self.answers = {}  # a command ("MAIL", "RCPT", "DATA") answered with this reply, once
        self.drop_in_data = False  # the connection closed after the data came, never answered
        self.connections = 0
        self.port = free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)

    @property
    def url(self):
        return f"smtp://127.0.0.1:{self.port}"

    async def handle_EHLO(self, server, session, envelope, hostname, responses):
        self.connections += 1
        session.host_name = hostname
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        if "MAIL" in self.answers:
            return self.answers.pop("MAIL")
        if self.busy_next > 0:
            self.busy_next -= 1
            self.busy_answered += 1
            return "421 4.7.0 Try again later, closing connection"
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if "RCPT" in self.answers:
            return self.answers.pop("RCPT")
        if address.lower() in self.refuse:
            self.refused.append(address)
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.data_started.set()
        if self.drop_in_data:
            server.transport.close()
            return "250 never heard"
        if "DATA" in self.answers:
            return self.answers.pop("DATA")
        if self.hold:
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
        message = message_from_bytes(envelope.content, policy=policy.default)
        self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"

    def __enter__(self):
        self.controller.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.controller.stop()
