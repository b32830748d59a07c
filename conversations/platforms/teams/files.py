"""A reply's files in a personal chat: Teams' file consent flow ("Send and receive files
using bot"). A bot cannot put a file into a chat itself; it asks the person, and the file
goes into their OneDrive:

1. the reply's file chunk is a message holding a FileConsentCard (consent.py)
   (`application/vnd.microsoft.teams.card.file.consent`: the file's name, size and a
   description), its acceptContext and declineContext one signed token naming the stored
   bytes (delivery.attachments: its storage name, name, type, size) and the channel and
   person it was offered to. That message is the chunk's delivery in the ledger: sent once,
   like any other;
2. the person's tap comes back as an invoke, `fileConsent/invoke` (verified like every
   activity), its value {action: accept | decline, context: the token, uploadInfo:
   {name, uploadUrl, contentUrl, uniqueId, fileType}};
3. accepted: the bytes are read from storage (they stay as long as the ledger row that
   named them: AGENTLOOP_RETAIN_LEDGER_DAYS; an older card's file is gone and the person is
   told so), PUT to the uploadUrl (OneDrive's upload session: pre-authorised, no token;
   `Content-Range: bytes 0-<n-1>/<n>`, answered 201 or 200 with the item), and then a
   message holding a file info card (`application/vnd.microsoft.teams.card.file.info`: the
   contentUrl, name, uniqueId and fileType Teams gave) shows the file in the chat.
   Declined: nothing is sent (Teams shows the card declined).

Once per accept: an accept's uniqueId (the OneDrive item Teams made for it) and its card
are taken before the upload, so a double tap or a redelivered invoke reaching this
process uploads once; across processes, the upload session itself takes the bytes once
(a session that completed is gone: a second PUT fails and sends no second card). The whole of it — the
token, the PUT, the card — within INVOKE_BUDGET seconds, under Teams' 15 s for an invoke's
answer; a failure is told to the person and frees the uniqueId (their next tap tries again).

Group chats and channels: a bot uploads there only through SharePoint and Microsoft
Graph (permissions this bot does not ask for), so the transport names the files in the
text there (delivery.transports.Transport.send_files)."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from django.utils import translation
from django.utils.translation import gettext as _
from microsoft_agents.activity import Activity, Attachment

from agentloop.core import languages
from agentloop.core.caches import BoundedCache
from agentloop.core.redaction import channel_secrets, redact
from conversations.platforms.teams.activities import as_dict, chat_of
from conversations.platforms.teams.consent import offered
from conversations.platforms.teams.transport import TokenRefused, TokenUnavailable, access_token, bounded
from conversations.platforms.teams.wire import activities_url, wire
from delivery import attachments

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

log = logging.getLogger(__name__)

FILE_INFO = "application/vnd.microsoft.teams.card.file.info"
CONSENT_INVOKE = "fileConsent/invoke"
INVOKE_BUDGET = 12.0  # seconds for an accept's token, upload and card (Teams waits 15 s)
# The accepts this process has taken (their uniqueId, their card): bounded, an hour each.
_taken: BoundedCache[str, bool] = BoundedCache(maxsize=4096, max_age=3600.0)
_taking = threading.Lock()


@dataclass(frozen=True)
class UploadInfo:
    """An accept's `uploadInfo`: the upload session Teams made in the person's OneDrive.
    Read and written as plain JSON in Teams' wire shape, as the consent card is
    (consent.py): the SDK's FileUploadInfo and FileInfoCard models would be a hundred
    more modules for every web server and worker to import."""

    name: str
    upload_url: str
    content_url: str
    unique_id: str
    file_type: str

    @classmethod
    def read(cls, value: object) -> UploadInfo | None:
        """The session, if `value` names all five fields as strings (an upload URL not
        empty); else None."""
        fields = as_dict(value)
        found = [fields.get(name) for name in ("name", "uploadUrl", "contentUrl", "uniqueId", "fileType")]
        if not all(isinstance(field, str) for field in found) or not found[1]:
            return None
        return cls(*(str(field) for field in found))


def consented(channel: Channel, activity: Activity) -> dict[str, Any]:
    """A `fileConsent/invoke` handled (the invokeResponse's body: always empty)."""
    # Read as a plain object: the SDK's FileConsentCardResponse wants an uploadInfo, which a
    # decline has not.
    value = as_dict(activity.value)
    chat = chat_of(activity)
    held = offered(channel, value.get("context"), chat)
    if held is None:
        log.warning("channel %s: a file consent for no file of ours (a stale, foreign or altered card)", channel.slug)
        return {}
    if value.get("action") != "accept":
        log.info("channel %s: a file was declined", channel.slug)
        return {}
    upload = UploadInfo.read(value.get("uploadInfo"))
    if upload is None:
        log.warning("channel %s: a file accepted without its uploadInfo", channel.slug)
        return {}
    # Taken by the accept's OneDrive item and by the card: a redelivered invoke, and a
    # second accept of the same card, upload nothing more.
    card = hashlib.sha256(str(as_dict(value.get("context")).get("file")).encode()).hexdigest()
    keys = (f"{channel.pk}:item:{upload.unique_id or activity.id}", f"{channel.pk}:card:{card}")
    with _taking:
        if any(_taken.get(key) for key in keys):
            log.info("channel %s: a file's accept again (a double tap or a redelivery): uploaded once", channel.slug)
            return {}
        for key in keys:
            _taken.set(key, True)
    conversation = str(activity.conversation.id if activity.conversation else "")
    problem = send(channel, conversation, held, upload, time.monotonic() + INVOKE_BUDGET)
    if problem:
        for key in keys:
            _taken.pop(key)
        log.warning("channel %s: a file could not be sent: %s", channel.slug,
                    redact(problem, [*channel_secrets(channel), upload.upload_url])[:200])
        notice(channel, conversation, held, problem)
    return {}


def forget() -> None:
    """Drop the accepts this process took (tests)."""
    _taken.clear()


def send(channel: Channel, conversation: str, held: dict[str, Any], upload: UploadInfo, ends: float) -> str:
    """The stored bytes PUT to the upload session, then the file info card: "" once both
    went, else what failed."""
    try:
        data = attachments.read(str(held["f"]))
    except OSError:
        return "gone"
    if not data:  # an upload session takes no empty range
        return "the file is empty"
    try:
        status, _headers, _answer = bounded(
            "PUT", upload.upload_url, _left(ends), content=data,
            headers={"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}", "Content-Length": str(len(data))})
        if status not in (200, 201):
            return f"the upload answered HTTP {status}"
        shown = Activity(type="message", attachments=[Attachment(
            content_type=FILE_INFO, content_url=upload.content_url, name=upload.name,
            content={"uniqueId": upload.unique_id, "fileType": upload.file_type})])
        status, _headers, _answer = bounded("POST", activities_url(channel, conversation), _left(ends),
                                            json=wire(shown), headers=_authorization(channel, ends))
    except (TokenRefused, TokenUnavailable, httpx.HTTPError, TimeoutError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "" if status < 300 else f"the file's card answered HTTP {status}"


def notice(channel: Channel, conversation: str, held: dict[str, Any], problem: str) -> None:
    """Tells the person their file did not come (best effort, a few seconds)."""
    ends = time.monotonic() + 3.0
    with translation.override(languages.choose(channel.language)):
        text = _("The file %(name)s is no longer available.") if problem == "gone" else \
            _("The file %(name)s could not be sent. Please try again.")
        text = text % {"name": str(held.get("n") or "")}
    try:
        bounded("POST", activities_url(channel, conversation), _left(ends), json=wire(Activity(type="message", text=text)),
                headers=_authorization(channel, ends))
    except (TokenRefused, TokenUnavailable, httpx.HTTPError, TimeoutError, OSError) as exc:
        log.warning("channel %s: telling a person their file did not come failed: %s", channel.slug,
                    type(exc).__name__)


def _authorization(channel: Channel, ends: float) -> dict[str, str]:
    return {"Authorization": f"Bearer {access_token(channel, _left(ends))}"}


def _left(ends: float) -> float:
    left = ends - time.monotonic()
    if left <= 0.05:
        raise TimeoutError(f"past the invoke's {INVOKE_BUDGET:g} s")
    return left
