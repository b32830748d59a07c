"""The mailbox, held open per channel by the worker (conversations.platforms.connection:
one holder per mailbox across workers and hosts, under the channel's lease).

A session, as IMAP has it (RFC 3501, IDLE: RFC 2177): connect (TLS, or STARTTLS), LOGIN,
EXAMINE the mailbox (read-only: nothing in it is changed, no mail marked seen) → its
UIDVALIDITY; the mail after the stored cursor's UID fetched (BODY.PEEK[]) in batches,
each batch admitted and the cursor stored before the next is read; then IDLE until the
server reports mail (EXISTS), renewed every few minutes (servers drop an IDLE after 30
and some NATs sooner), and round again — reading until a search finds nothing new first,
since mail announced while a batch was read is never announced again. A BYE or a closed
socket ends the session: it is opened again from the stored cursor.

imapclient is blocking: every call of a session runs on the session's one thread, each
under a deadline (the socket's timeout and an overall one around the call), and IDLE is
waited in slices, so a session the worker ends (its lease lost, the worker stopping) is
closed within a slice.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from imapclient import IMAPClient
from imapclient.exceptions import IMAPClientError, LoginError

from agentloop.core.tls import shared_tls_context
from conversations.models import Channel
from conversations.platforms.email import parsing
from conversations.platforms.inbound import Connection, Parsed, Receive
from delivery.receipts import Failure, failed_after_send

log = logging.getLogger(__name__)

DEADLINE = 30.0  # seconds: any one IMAP command, the connection and login included
IDLE_SLICE = 2.0  # seconds of IDLE waited per call (how soon an ended session lets go)
IDLE_RENEW = 8 * 60.0  # seconds: IDLE ended and begun again (RFC 2177: before 29 minutes)
# For a while after mail came, IDLE is ended this often for a search: a mail that arrives
# as IDLE begins can go unannounced until the server's own check (Dovecot: 30 s), and
# mail comes in bursts.
RECHECK_EVERY, RECHECK_FOR = 2.0, 30.0
BATCH = 20  # mails fetched and admitted at a time
MAX_MAIL_BYTES = 25 * 1024 * 1024  # a mail read whole up to this; larger: its headers only
UID_BITS = 32
Answer = TypeVar("Answer")


def cursor_of(validity: int, uid: int) -> int:
    """The stored cursor: UIDVALIDITY (31 bits, to fit a signed 64-bit column) and UID."""
    return (validity & 0x7FFFFFFF) << UID_BITS | uid


def resume_after(cursor: int | None, validity: int) -> int:
    """The last UID admitted, if the cursor was stored under this UIDVALIDITY; else 0."""
    if cursor is None or cursor >> UID_BITS != validity & 0x7FFFFFFF:
        return 0
    last: int = cursor & (2**UID_BITS - 1)
    return last


class Ended(Exception):
    """The server ended the session (BYE, the socket closed) or left it in a state only a
    new one mends (mail announced before IDLE's continuation): the session returns, and
    the runner opens the next one at once (a failure would grow its backoff)."""


class MailboxRefused(Exception):
    """The server refused the channel's login: an operator's to fix (logged by the worker,
    tried again after its longest backoff)."""


class EmailConnection(Connection):
    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        await MailboxSession(channel, cursor, receive).run()

    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        if not isinstance(payload, parsing.Mail):
            return None
        try:
            items = parsing.parse(str(channel.setting("address") or ""), payload)
        except Exception as exc:  # a mail no parser can read: logged, left in the mailbox, skipped
            log.warning("channel %s: mail UID %s could not be read (%r); skipped", channel.slug, payload.uid, exc)
            return None
        return Parsed(items) if items else None

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, parsing.Bounce):
            # The reply it returns, in the ledger: delivered → unreachable (or resent, for a 4.x.x).
            return failed_after_send(channel, Failure(item.platform_message_id, item.error, item.permanent))
        return super().apply(channel, item)


def connect(channel: Channel) -> IMAPClient:
    """Connected and logged in (blocking, under DEADLINE)."""
    security = str(channel.setting("imap_security") or "ssl")
    client = IMAPClient(str(channel.setting("imap_host")), port=int(channel.setting("imap_port") or 993),
                        ssl=security == "ssl", ssl_context=shared_tls_context() if security == "ssl" else None,
                        timeout=DEADLINE)
    try:
        if security == "starttls":
            client.starttls(ssl.create_default_context())
        client.login(str(channel.setting("username") or channel.setting("address")),
                     str(channel.setting("password") or ""))
    except LoginError as exc:
        client.shutdown()
        raise MailboxRefused(f"the IMAP server refused the login: {exc}") from None
    except BaseException:
        client.shutdown()
        raise
    return client


def closed(client: IMAPClient) -> bool:
    """Whether the server closed the connection (an IDLE check that came back early and
    empty: the socket was readable with no whole line in it — its end, or a line's start)."""
    sock = client.socket()
    try:
        sock.setblocking(False)
        peeked: bytes = sock.recv(1, socket.MSG_PEEK)
        return peeked == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        if sock.fileno() != -1:
            sock.settimeout(DEADLINE)


def buffered(client: IMAPClient) -> bool:
    """Whether a response already waits past IDLE's continuation — Dovecot sends "+ idling"
    and the new mail's EXISTS in one write, both read into the connection's buffer, where
    no poll of the socket (idle_check's) can see it."""
    sock = client.socket()
    sock.setblocking(False)
    try:
        return bool(client._imap.file.peek(1))  # noqa: SLF001 -- imaplib's buffered reader
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    finally:
        if sock.fileno() != -1:
            sock.settimeout(DEADLINE)


class MailboxSession:
    """One connection, from the login to the drop."""

    def __init__(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        self.channel, self.cursor, self.receive = channel, cursor, receive
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"imap-{channel.slug}")
        self.client: IMAPClient | None = None
        self.busy_until = 0.0  # time.monotonic() until which IDLE is ended every RECHECK_EVERY

    async def call(self, work: Callable[..., Answer], *args: Any, deadline: float = DEADLINE) -> Answer:
        """One blocking step on the session's thread, under an overall deadline. (Not
        asyncio.wait_for: on 3.11 it drops a cancellation that comes as the step ends, and
        this session is cancelled while it idles in steps of IDLE_SLICE — it would go on.)"""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(deadline):
            return await loop.run_in_executor(self.thread, work, *args)

    async def run(self) -> None:
        try:
            self.client = client = await self.call(connect, self.channel, deadline=DEADLINE * 2)
            selected = await self.call(client.select_folder, str(self.channel.setting("mailbox") or "INBOX"), True)
            validity = int(selected[b"UIDVALIDITY"])
            last = resume_after(self.cursor, validity)
            self.busy_until = time.monotonic() + RECHECK_FOR  # a new session: mail may be arriving
            if self.cursor is not None and last == 0:
                log.info("channel %s: the mailbox's UIDVALIDITY changed; reading it again (what was admitted "
                         "is dropped by the dedup)", self.channel.slug)
            while True:
                # Until a search finds nothing new: mail that arrived while the last batch was
                # read was announced (EXISTS) in that command's answer, never again in IDLE.
                while (caught := await self.catch_up(client, validity, last)) != last:
                    last = caught
                await self.idle(client)
        except Ended as ended:  # the session is over as IMAP has it: the next one at once, no backoff
            log.info("channel %s: %s; connecting again", self.channel.slug, ended)
        finally:
            await self.close()

    async def catch_up(self, client: IMAPClient, validity: int, last: int) -> int:
        """Every mail after UID `last`, admitted in batches; the last UID admitted."""
        found = await self.call(client.search, ["UID", f"{last + 1}:*"])
        uids = sorted(uid for uid in found if uid > last)  # "n:*" names the highest UID even below n
        for start in range(0, len(uids), BATCH):
            batch = uids[start:start + BATCH]
            sizes = await self.call(client.fetch, batch, ["RFC822.SIZE"])
            whole = [uid for uid in batch if int(sizes.get(uid, {}).get(b"RFC822.SIZE", 0)) <= MAX_MAIL_BYTES]
            large = [uid for uid in batch if uid not in whole]
            fetched = dict(await self.call(client.fetch, whole, ["BODY.PEEK[]"])) if whole else {}
            if large:
                log.warning("channel %s: mail UID %s over %d MiB: its headers read only", self.channel.slug,
                            large, MAX_MAIL_BYTES >> 20)
                fetched.update(await self.call(client.fetch, large, ["BODY.PEEK[HEADER]"]))
            mails = [parsing.Mail(validity, uid, bytes(fetched[uid].get(b"BODY[]") or fetched[uid].get(b"BODY[HEADER]")
                                                       or b""), truncated=uid in large)
                     for uid in batch if uid in fetched]
            # Admitted and the cursor stored before the next batch is read: only then is it ours.
            await self.receive(mails, cursor_of(validity, batch[-1]))
            last = batch[-1]
            self.busy_until = time.monotonic() + RECHECK_FOR
        return last

    async def idle(self, client: IMAPClient) -> None:
        """IDLE until the server reports new mail, or it is time to renew it (soon, for a
        while after mail came: RECHECK_EVERY)."""
        try:
            await self.call(client.idle)
        except IMAPClientError as exc:
            if "Unexpected IDLE response" in str(exc):  # mail announced as IDLE began: read on a new session
                raise Ended("mail arrived as IDLE began") from None
            raise
        if await self.call(buffered, client):  # announced with the continuation: read already, not yet seen
            await self.call(client.idle_done)
            return
        began = time.monotonic()
        renew = RECHECK_EVERY if began < self.busy_until else IDLE_RENEW
        while time.monotonic() - began < renew:
            asked = time.monotonic()
            responses = await self.call(client.idle_check, IDLE_SLICE, deadline=IDLE_SLICE + DEADLINE)
            if any(response[0] == b"BYE" for response in responses):
                raise Ended("the IMAP server said BYE")
            if any(len(response) > 1 and response[1] in (b"EXISTS", b"RECENT") for response in responses):
                break
            if not responses and time.monotonic() - asked < IDLE_SLICE / 2 and await self.call(closed, client):
                raise Ended("the IMAP server closed the connection")
        await self.call(client.idle_done)  # (a failed session is dropped as it is: no DONE)

    async def close(self) -> None:
        """Logged out (best effort, briefly, unless mid-IDLE: a LOGOUT there is never
        answered); the socket shut whatever happens, which wakes a call still blocked on it."""
        client, self.client = self.client, None
        if client is not None:
            if client._idle_tag is None:  # noqa: SLF001 -- imapclient keeps no public flag
                try:
                    await self.call(client.logout, deadline=2.0)
                except Exception:  # noqa: BLE001 -- a connection that is going anyway
                    pass
            try:
                client.shutdown()
            except OSError:
                pass
        self.thread.shutdown(wait=False, cancel_futures=True)
