"""Replies over SMTP (the standard library's smtplib, on a thread, under deadlines).

A reply is one mail to the sender of the conversation it answers (never reply-all),
from the channel's address, threaded as mail clients thread: `Subject: Re: <the
thread's subject>`, `In-Reply-To` the mail it answers, `References` the thread's chain
(the chat's address, kept by intake: conversations.addresses), a Message-ID of our own —
the ledger's platform message id, which a bounce names later — and `Auto-Submitted:
auto-replied` (RFC 3834: autoresponders do not answer it). The ledger's recovery label,
when a reply is resent, is the body's first line: the body is the text the ledger gives,
nothing before it.

The SMTP conversation is driven step by step (EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA), so
each answer says what became of the mail:

| what happened | outcome |
|---|---|
| no connection, refused, TLS failed, dropped before DATA | not_sent |
| 421, 451 (busy, rate-limited, greylisted) | flood: the mailbox's replies wait `busy_wait` |
| any other 4xx | temporary |
| 530, 534, 535 (authentication), a 5xx to MAIL FROM | channel_blocked |
| a 5xx to RCPT (no such mailbox, refused) | permanent, the chat unreachable |
| a 5xx to DATA (the content refused: size, policy) | permanent, the chat not marked |
| the connection lost, or no answer, after DATA began | ambiguous (it may have been accepted) |
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async

from agentloop.core.tls import shared_tls_context
from conversations import addresses
from conversations.models import Conversation
from conversations.platforms.email.parsing import key
from delivery import attachments
from delivery.models import Outcome
from delivery.transports import SendResult, Target, Transport

if TYPE_CHECKING:  # for annotations only
    from delivery.attachments import OutboundFile
    from delivery.pacing import Pace

DEADLINE = 30.0  # seconds: each SMTP command's socket timeout
OVERALL = 90.0  # seconds: a whole send, connection to QUIT
MAX_ATTACHMENT_BYTES = 20 * 1024 * 1024  # what most providers take in one mail (Gmail 25 MB, encoded)
BUSY = (421, 451)
AUTHENTICATION = (530, 534, 535)


@dataclass
class Exchange:
    """How far one SMTP conversation got: whether DATA began (after it, a lost
    connection may have left the mail accepted)."""

    data_began: bool = False


class EmailTransport(Transport):
    max_album = 10  # files attached to one mail
    caption_units = 100_000

    def pace(self, chat_id: str) -> Pace | None:
        return self.paced(str(self.channel.setting("address") or self.channel.slug), chat_id,
                          float(self.channel.setting("chat_interval") or 0))

    async def send_text(self, target: Target, text: str) -> SendResult:
        message = await self.message(target, text)
        if isinstance(message, SendResult):
            return message
        return await self.send(message)

    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """One mail, the caption its body (the recovery label first, when there is one),
        the files attached."""
        total = sum(item.size for item in files)
        if total > MAX_ATTACHMENT_BYTES:
            return self.failed(Outcome.PERMANENT, f"the files are {total / 1048576:.1f} MiB, over the "
                                                  f"{MAX_ATTACHMENT_BYTES >> 20} MiB one mail carries (not sent)",
                               chat_unreachable=False)
        message = await self.message(target, caption or "📎")
        if isinstance(message, SendResult):
            return message
        for item in files:
            try:
                data = await asyncio.to_thread(attachments.read, item.file)
            except OSError as exc:
                return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
            major, _, minor = (item.type or "application/octet-stream").partition("/")
            message.add_attachment(data, maintype=major, subtype=minor or "octet-stream", filename=item.name)
        return await self.send(message)

    async def message(self, target: Target, text: str) -> EmailMessage | SendResult:
        """The mail of a reply, addressed and threaded."""
        known = await addresses.address_of(self.channel, target) or {}
        recipient = await self.recipient(target) or known.get("from", "")
        if not recipient:
            return self.failed(Outcome.PERMANENT, f"no address to write to in chat {target.chat_id}")
        own = str(self.channel.setting("address"))
        message = EmailMessage()
        message["From"], message["To"] = formataddr((self.channel.name or "", own)), recipient
        message["Subject"] = known.get("subject") or "Re: (no subject)"
        message["Date"] = formatdate(localtime=False)
        message["Message-ID"] = make_msgid(domain=own.rpartition("@")[2] or None)
        replied = target.reply_target or known.get("message_id", "")
        if replied:
            message["In-Reply-To"] = f"<{replied}>"
            chain = known.get("references", "")
            message["References"] = chain if f"<{replied}>" in chain else f"{chain} <{replied}>".strip()
        message["Auto-Submitted"] = "auto-replied"
        message.set_content(text)
        return message

    async def recipient(self, target: Target) -> str:
        """The sender of the conversation the reply answers (each participant of a thread
        has their own)."""
        if target.conversation_id is None:
            return ""
        found = await sync_to_async(
            lambda: Conversation.objects.filter(pk=target.conversation_id).values_list("sender_id", flat=True).first())()
        return str(found or "")

    async def send(self, message: EmailMessage) -> SendResult:
        exchange = Exchange()
        try:
            async with asyncio.timeout(OVERALL):  # (not wait_for: it can drop a cancellation on 3.11)
                await asyncio.to_thread(self.deliver, message, exchange)
        except smtplib.SMTPResponseException as exc:
            return self.refused(exc.smtp_code, exc.smtp_error, exchange, stage=type(exc).__name__)
        except smtplib.SMTPRecipientsRefused as exc:
            code, said = next(iter(exc.recipients.values()), (550, b""))
            return self.refused(code, said, exchange, stage="SMTPRecipientsRefused")
        except (TimeoutError, OSError, smtplib.SMTPException) as exc:
            if exchange.data_began:
                return self.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__} after DATA began: the mail may have "
                                                      "been accepted")
            return self.failed(Outcome.NOT_SENT, f"{type(exc).__name__} before the mail was sent: {exc}")
        return SendResult.delivered(key(str(message["Message-ID"]).strip().strip("<>")))

    def refused(self, code: int, said: bytes | str, exchange: Exchange, stage: str) -> SendResult:
        text = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
        error = f"SMTP {code} {' '.join(text.split())}"[:250]
        if code in BUSY:
            return self.failed(Outcome.FLOOD, error, retry_after=float(self.channel.setting("busy_wait") or 60))
        if 400 <= code < 500:
            return self.failed(Outcome.TEMPORARY, error)
        if code in AUTHENTICATION or stage in ("SMTPAuthenticationError", "SMTPSenderRefused"):
            return self.failed(Outcome.CHANNEL_BLOCKED, error)
        if stage == "SMTPRecipientsRefused":
            return self.failed(Outcome.PERMANENT, error)
        return self.failed(Outcome.PERMANENT, error, chat_unreachable=not exchange.data_began)

    def deliver(self, message: EmailMessage, exchange: Exchange) -> None:
        """The SMTP conversation (blocking, on a thread): raises what the server said."""
        host, port = str(self.channel.setting("smtp_host")), int(self.channel.setting("smtp_port") or 587)
        security = str(self.channel.setting("smtp_security") or "starttls")
        server = smtplib.SMTP_SSL(host, port, timeout=DEADLINE, context=shared_tls_context()) \
            if security == "ssl" else smtplib.SMTP(host, port, timeout=DEADLINE)
        try:
            server.ehlo()
            if security == "starttls":
                server.starttls(context=ssl.create_default_context())
                server.ehlo()
            username = str(self.channel.setting("username") or "")
            if username and server.has_extn("auth"):
                server.login(username, str(self.channel.setting("password") or ""))
            sender, recipient = str(self.channel.setting("address")), str(message["To"])
            code, said = server.mail(sender)
            if code != 250:
                raise smtplib.SMTPSenderRefused(code, said, sender)
            code, said = server.rcpt(recipient)
            if code not in (250, 251):
                raise smtplib.SMTPRecipientsRefused({recipient: (code, said)})
            exchange.data_began = True
            code, said = server.data(message.as_bytes())
            if code != 250:
                raise smtplib.SMTPDataError(code, said)
        finally:
            try:
                server.quit()
            except (OSError, smtplib.SMTPException):
                server.close()
