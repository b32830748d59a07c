"""Email (IMAP in, SMTP out): a mailbox per channel, everything email means to agentloop.

- mailbox.py: the IMAP session the worker holds per channel (a Connection, under the
  channel's lease): EXAMINE the mailbox, fetch what came after the stored cursor, then
  IDLE until the server reports new mail; imapclient, blocking, driven from one thread
  per session with a deadline on every call
- parsing.py: a mail into an Inbound (one conversation per thread, the sender the
  contact, quoted history and signature stripped, the reply headers kept as the chat's
  address) or a Bounce (a DSN)
- transport.py: replies over SMTP (smtplib), threaded (`In-Reply-To`, `References`,
  "Re: subject"), files as attachments, each SMTP answer mapped to the ledger's outcomes
- media.py: an attachment fetched again from the mailbox by UIDVALIDITY, UID and part

The cursor (Channel.poll_offset) is the mailbox's UIDVALIDITY and the last UID admitted
(`(validity & 0x7fffffff) << 32 | uid`): a restart resumes after the last mail admitted;
a new UIDVALIDITY (the server rebuilt its index) reads the mailbox again from the start,
and what was admitted before stops at the dedup (the Message-ID).

Several people in one thread: each sender has their own conversation in the thread's
chat, and each reply goes to the sender it answers, never to everyone in the thread
(no reply-all: nobody gets mail from the bot who did not write to it). Email has no
groups in the chat sense; every mail is addressed to the mailbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_rate, pace_settings

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from conversations.platforms.email.mailbox import EmailConnection
    from conversations.platforms.email.transport import EmailTransport


def check_port(value: Any) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise ValidationError(gettext("a TCP port, 1 to 65535"))
    return port


def check_address(value: str) -> str:
    validate_email(value)
    return value.strip()


SECURITY = ("ssl", "starttls", "none")


class EmailPlatform(Platform):
    kind = "email"
    label = "Email"
    settings = {
        "address": Setting(label=_("Address"), required_to_send=True, check=check_address,
                           help=_("The mailbox's address: the From of every reply; mail from it is never answered.")),
        "username": Setting(label=_("Username"), required_to_receive=True,
                            help=_("The login for IMAP and SMTP (usually the address).")),
        "password": Setting(label=_("Password"), secret=True, required_to_send=True, required_to_receive=True,
                            help=_("The mailbox's password; for Gmail and Outlook an app password (docs/email.md).")),
        "imap_host": Setting(label=_("IMAP host"), required_to_receive=True, help=_("e.g. imap.gmail.com")),
        "imap_port": Setting(label=_("IMAP port"), default=993, check=check_port),
        "imap_security": Setting(label=_("IMAP security"), default="ssl", choices=SECURITY,
                                 help=_("ssl (port 993), starttls (port 143) or none (a local test server only).")),
        "mailbox": Setting(label=_("Mailbox"), default="INBOX", help=_("The folder read for new mail.")),
        "smtp_host": Setting(label=_("SMTP host"), required_to_send=True, help=_("e.g. smtp.gmail.com")),
        "smtp_port": Setting(label=_("SMTP port"), default=587, check=check_port),
        "smtp_security": Setting(label=_("SMTP security"), default="starttls", choices=SECURITY,
                                 help=_("starttls (port 587), ssl (port 465) or none (a local test server only).")),
        "busy_wait": Setting(label=_("Wait when busy"), default=60.0, check=check_rate,
                             help=_("Seconds every reply of the mailbox waits after the SMTP server says it is "
                                    "busy (421, 451: a rate limit, greylisting) before it is sent again.")),
        # Gmail: about 2,000 mails a day per account, bursts throttled (421 4.7.0); Outlook:
        # 30 a minute. One mail a second across workers, two seconds apart into one thread.
        **pace_settings(per_second=1.0, chat_interval=2.0),
    }

    # The package's modules are imported where they are used (they import models and
    # ingest, which the registry that loads this class must not pull in).
    def transport(self, channel: Channel) -> EmailTransport:
        from conversations.platforms.email.transport import EmailTransport

        return EmailTransport(channel)

    def connection(self) -> EmailConnection:
        from conversations.platforms.email.mailbox import EmailConnection

        return EmailConnection(self)

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        from conversations.platforms.email.media import fetch_media

        return await fetch_media(channel, ref, limit)
