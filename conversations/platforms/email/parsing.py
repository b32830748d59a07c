"""A mail read from the mailbox into our own types: an Inbound per mail (and one per
further attachment), or a Bounce for a delivery status notification.

- Identities: the dedup key is the mail's `Message-ID` (so the same mail fetched again —
  after a reconnect, a restart of the server, a new UIDVALIDITY — stops at the
  admission's dedup); the chat is the thread: the first id of `References` (the root),
  else `In-Reply-To`, else the mail's own id; the sender is the From address, lower-cased.
  Ids longer than the columns take a digest in their place (`key`).
- What the agent reads: the text part (the HTML one turned to text when there is no
  plain part) without the quoted history ("On … wrote:" and what follows, lines starting
  with ">") and without the signature (below a "-- " line); a thread's first mail starts
  with its subject. The raw mail stays in the mailbox, untouched (read with BODY.PEEK).
- The reply headers a thread's replies need (the subject, the Message-ID replied to, the
  References chain) ride on the Inbound's `address`, kept per chat by intake
  (conversations.addresses).
- Bounces: `multipart/report; report-type=delivery-status` with a failed recipient →
  a Bounce naming the Message-ID of our reply it returns (delivery.receipts turns that
  ledger row unreachable); a delayed one is ignored (the server keeps trying).
- Mail an autoresponder sent (`Auto-Submitted`, `Precedence: bulk/junk/list`) is marked
  `is_bot`: stored, answered only where the channel allows bots (conversations.loops).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from email import message_from_bytes, policy
from email.message import EmailMessage, Message
from email.utils import getaddresses, parseaddr, parsedate_to_datetime
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from conversations.ingest import Inbound, MediaRef

if TYPE_CHECKING:  # for annotations only
    from datetime import datetime

MESSAGE_ID_LIMIT = 120  # InboundMessage.platform_message_id
CHAT_ID_LIMIT = 100  # Conversation.chat_id, Contact.platform_id
REFERENCES_KEPT = 5  # the root and the last ids of a thread's References (RFC 5322 §3.6.4 allows trimming)
MAX_ATTACHMENTS = 10
ID = re.compile(r"<([^<>\s]+)>")
QUOTE_HEADER = re.compile(
    r"^(On\b.*\bwrote:|El\b.*\bescribi[óo]:|Em\b.*\bescreveu:|Le\b.*\ba écrit\s?:|Am\b.*\bschrieb.*:"
    r"|-{2,}\s*Original Message\s*-{2,}|-{2,}\s*Mensaje original\s*-{2,}|_{10,})\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Mail:
    """One mail as the mailbox gave it: what the connection hands to `receive`."""

    validity: int  # the mailbox's UIDVALIDITY
    uid: int
    raw: bytes
    truncated: bool = False  # over the size read whole: its headers only


@dataclass(frozen=True)
class Bounce:
    """A delivery status notification: our mail `platform_message_id` did not arrive."""

    platform_message_id: str
    recipient: str
    error: str
    permanent: bool


def key(message_id: str, limit: int = MESSAGE_ID_LIMIT) -> str:
    """An id as stored: itself, or a digest when the column cannot hold it."""
    return message_id if len(message_id) <= limit else "sha256:" + hashlib.sha256(message_id.encode()).hexdigest()[:48]


def ids(value: object) -> list[str]:
    """The message ids a header names, in order, without their angle brackets."""
    return ID.findall(str(value or ""))


def read(raw: bytes) -> EmailMessage:
    message = message_from_bytes(raw, policy=policy.default)
    assert isinstance(message, EmailMessage)
    return message


def parse(own_address: str, mail: Mail) -> list[object]:
    """The items a mail gives: Inbounds, a Bounce, or nothing (our own mail, no sender)."""
    message = read(mail.raw)
    if message.get_content_type() == "multipart/report" and \
            str(message.get_param("report-type", "")).lower() == "delivery-status":
        return bounces(message)
    sender_name, sender = parseaddr(str(message.get("From") or ""))
    sender = sender.strip().lower()
    if not sender or "@" not in sender or sender == own_address.lower() or len(sender) > CHAT_ID_LIMIT:
        return []
    message_id = (ids(message.get("Message-ID")) or [""])[0]
    if not message_id:  # a mail without an id: its content is its identity
        message_id = "sha256:" + hashlib.sha256(mail.raw).hexdigest()[:48]
    references, replied = ids(message.get("References")), ids(message.get("In-Reply-To"))
    root = (references or replied or [message_id])[0]
    subject = " ".join(str(message.get("Subject") or "").split())
    text = readable(message, mail.truncated)
    if not references and not replied and subject:
        text = f"{subject}\n\n{text}".strip()
    files = attachments(message, mail)
    if not text and not files:
        return []
    chain = [*references, *[one for one in replied if one not in references]][-REFERENCES_KEPT:]
    if references and chain[0] != references[0]:
        chain = [references[0], *chain[1:]]
    address = {"from": sender, "subject": reply_subject(subject)[:900], "message_id": message_id[:900],
               "references": " ".join(f"<{one}>" for one in [*chain, message_id])[:1000]}
    first = Inbound(platform_message_id=key(message_id), chat_id=key(root, CHAT_ID_LIMIT), sender_id=sender,
                    text=text, sender_name=str(sender_name)[:200], username=sender,
                    reply_target=message_id if len(message_id) <= 200 else "", sent_at=sent_at(message),
                    is_bot=automatic(message), address=address,
                    media=files[0] if files else None, media_type=files[0].kind if files else "",
                    album_id=key(message_id, 64) if len(files) > 1 else "")
    return [first, *(replace(first, platform_message_id=key(f"{message_id}#{number}"), text="", media=ref,
                             media_type=ref.kind) for number, ref in enumerate(files[1:], start=1))]


def reply_subject(subject: str) -> str:
    subject = subject or "(no subject)"
    return subject if re.match(r"^(re|aw|sv|r)\s*:", subject, re.IGNORECASE) else f"Re: {subject}"


def sent_at(message: Message) -> datetime | None:
    try:
        return parsedate_to_datetime(str(message.get("Date") or "")) if message.get("Date") else None
    except (TypeError, ValueError):
        return None


def automatic(message: Message) -> bool:
    """Sent by an autoresponder or a list (RFC 3834): never answered in a loop."""
    submitted = str(message.get("Auto-Submitted") or "no").strip().lower()
    precedence = str(message.get("Precedence") or "").strip().lower()
    return submitted != "no" or precedence in ("bulk", "junk", "list", "auto_reply") or \
        bool(message.get("X-Autoreply") or message.get("X-Autorespond"))


# --- the text the agent reads -------------------------------------------------------------


def readable(message: EmailMessage, truncated: bool = False) -> str:
    if truncated:
        return "(a mail too large to read whole: only its headers were fetched)"
    body = message.get_body(preferencelist=("plain", "html"))
    if body is None or not isinstance(body, EmailMessage):
        return ""
    try:
        content = body.get_content()
    except (LookupError, ValueError):  # an unknown charset, a broken transfer encoding
        payload = body.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if not isinstance(content, str):
        return ""
    if body.get_content_type() == "text/html":
        content = html_text(content)
    return stripped(content)


def stripped(text: str) -> str:
    """The new part of a reply: without the quoted history and the signature."""
    kept: list[str] = []
    lines = text.replace("\r\n", "\n").split("\n")
    for index, line in enumerate(lines):
        if line.rstrip() in ("--", "-- "):
            break  # the signature delimiter (RFC 3676 §4.3)
        if QUOTE_HEADER.match(line.strip()):
            break
        # "On Mon, 1 Jan 2026 at 10:00, Ana <ana@\nclient.test> wrote:", wrapped by the client
        if line.strip().startswith(("On ", "El ", "Em ", "Le ")) and index + 1 < len(lines) and \
                QUOTE_HEADER.match(f"{line.strip()} {lines[index + 1].strip()}"):
            break
        if line.lstrip().startswith(">"):
            continue
        kept.append(line.rstrip())
    return "\n".join(kept).strip()


class _Text(HTMLParser):
    SKIP = ("script", "style", "head")
    BLOCK = ("p", "div", "br", "li", "tr", "h1", "h2", "h3", "blockquote")

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skipping = 0
        self.quoting = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        if tag == "blockquote":
            self.quoting += 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        if tag == "blockquote":
            self.quoting = max(0, self.quoting - 1)
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping and not self.quoting:  # a quoted reply's history is a blockquote
            self.parts.append(data)


def html_text(html: str) -> str:
    reader = _Text()
    reader.feed(html)
    reader.close()
    return re.sub(r"\n\s*\n+", "\n\n", "".join(reader.parts))


# --- attachments --------------------------------------------------------------------------


def attachments(message: EmailMessage, mail: Mail) -> list[MediaRef]:
    """The files a mail carries, each named by where it is: the mailbox's UIDVALIDITY,
    the mail's UID and the part's number (conversations.platforms.email.media fetches it)."""
    found = []
    for number, part in enumerate(parts(message)):
        declared = part.get_content_type()
        size = len(part.get_payload(decode=True) or b"") if not mail.truncated else None
        found.append(MediaRef(key=key(f"{mail.validity}:{mail.uid}:{number}:{part.get_filename() or ''}"),
                              ref=f"{mail.validity}:{mail.uid}:{number}", kind=kind_of(declared),
                              declared_type=declared, file_name=str(part.get_filename() or "")[:255],
                              declared_size=size))
    return found[:MAX_ATTACHMENTS]


def parts(message: EmailMessage) -> list[EmailMessage]:
    """The attachments and inline files (not the text read as the body), in order."""
    return [part for part in message.iter_attachments() if isinstance(part, EmailMessage)
            and not part.is_multipart() and part.get_content_type() not in ("message/rfc822",)]


def kind_of(content_type: str) -> str:
    major = content_type.split("/")[0]
    return {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")


# --- bounces ------------------------------------------------------------------------------


def bounces(report: EmailMessage) -> list[object]:
    """A DSN (RFC 3464): a Bounce per failed recipient of the mail it returns."""
    returned = ""
    status_fields: list[Message] = []
    for part in report.walk():
        kind = part.get_content_type()
        if kind == "message/delivery-status":
            payload = part.get_payload()
            status_fields = [one for one in payload if isinstance(one, Message)] if isinstance(payload, list) else []
        elif kind in ("message/rfc822", "text/rfc822-headers") and not returned:
            returned = original_id(part)
    if not returned:
        return []
    found: list[object] = []
    for fields in status_fields[1:]:  # the first block is per message, the rest per recipient
        if str(fields.get("Action") or "").strip().lower() != "failed":
            continue  # delayed, delivered, relayed: nothing to do
        recipient = ((getaddresses([str(fields.get("Final-Recipient") or "").split(";")[-1]]) or [("", "")])[0][1]
                     or str(fields.get("Final-Recipient") or "")).strip().lower()
        status = str(fields.get("Status") or "").strip()
        diagnostic = " ".join(str(fields.get("Diagnostic-Code") or "").split())
        found.append(Bounce(key(returned), recipient, f"bounced: {status} {diagnostic}".strip()[:250],
                            permanent=not status.startswith("4")))
    return found


def original_id(part: Message) -> str:
    if part.get_content_type() == "message/rfc822":
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else None
        return (ids(inner.get("Message-ID")) or [""])[0] if isinstance(inner, Message) else ""
    headers = part.get_payload(decode=True)
    if isinstance(headers, bytes):
        return (ids(message_from_bytes(headers).get("Message-ID")) or [""])[0]
    return ""
