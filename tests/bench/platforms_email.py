"""The email row of tests/bench/platforms.py (a module of its own: that one is at its
size limit). Inbound: a worker holding the mailbox's IMAP session (the real connection
runner, IDLE), a real Dovecot (tests/fakes/dovecot.py) receiving the mails by IMAP
APPEND over one connection as fast as it takes them; the rate the worker admitted them
at, from their `received_at`. The drain: replies into one thread over SMTP to aiosmtpd
(tests/fakes/smtp_server.py), at the channel's default pace (one mail every 2 s into a
thread: the default `chat_interval`)."""

from tests.bench.platforms import Row


class Email(Row):
    name, kind, slug = "Email", "email", "b-em"
    ceiling, ceiling_says = 0.5, "the default pace: one mail every 2 s into a thread"
    drain_chat = "drain@client.test"  # a thread's chat; its conversation's sender is the recipient
    push_says = "mails APPENDed to Dovecot, read by the worker's IMAP session (IDLE)"

    def start(self, stack):
        from tests.fakes import dovecot
        from tests.fakes.smtp_server import FakeSMTP

        self.imap = dovecot.shared()
        self.imap.empty()
        self.smtp = stack.enter_context(FakeSMTP())
        stack.callback(self.imap.empty)

    def settings(self):
        from tests.fakes import dovecot

        return {"address": dovecot.USER, "username": dovecot.USER, "password": dovecot.PASSWORD,
                "imap_host": "127.0.0.1", "imap_port": self.imap.port, "imap_security": "none",
                "smtp_host": "127.0.0.1", "smtp_port": self.smtp.port, "smtp_security": "none"}

    def floods(self):
        return self.smtp.busy_answered

    def ready(self, channel):
        channel.refresh_from_db(fields=["poll_owner"])
        return bool(channel.poll_owner)

    def push(self, first, count):
        from tests.fakes.dovecot import mail

        with self.imap.client() as client:
            for i in range(first, first + count):
                client.append("INBOX", bytes(mail(f"person{i % 200}@client.test", f"mensaje {i} y",
                                                  message_id=f"<bench{i}@client.test>")))
