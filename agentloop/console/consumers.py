"""The console's websockets: the dashboard and the playground. Staff only; live updates
arrive through `agentloop.core.live` (Redis, or agentloop.console.relay over the
database). A socket stays open for hours while roles change: every action looks the user
up again and checks the permission it needs, not only the handshake."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from agentloop.console import dashboard as console
from agentloop.console import relay
from agentloop.console.language import language_of, speaking
from agentloop.console.naming import holder_of, person_behind
from agentloop.core import live
from agentloop.core.redaction import redact_payload
from conversations import console as conversations_console
from conversations import deletions, edits, handoff
from conversations.ingest import Inbound, Unstorable, admit, open_conversation
from conversations.media import links
from conversations.models import Channel
from conversations.platforms.webchat import KIND
from delivery import console as delivery_console
from tools import approvals
from tools.confirmations import handle_webchat_tap
from tools.models import Proposal

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from conversations.ingest import MediaRef
    from conversations.models import Conversation

# Close codes (4000–4999 are the application's).
NOT_STAFF = 4403  # not active staff, or lacking the page's permission
NO_CHANNEL = 4404
MAX_TEXT = 4000
DASHBOARD_PERMISSION = "audit.view_auditevent"
PLAYGROUND_PERMISSION = "conversations.change_channel"
DECIDE_PERMISSION = "tools.change_proposal"


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels has no types
    """Accepts active staff holding `permission` only, joins its groups and keeps the
    process's relay running."""

    live_groups: tuple[str, ...] = ()
    permission = ""
    subscribed = False
    withdrawn = False  # the page's permission was found gone: the socket is closing

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not await database_sync_to_async(allowed)(user, self.permission):
            await self.close(code=NOT_STAFF)  # before accept: the handshake is refused (403)
            return
        if not await self.prepare(user):
            await self.close(code=NO_CHANNEL)
            return
        for group in self.live_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await relay.relay().subscribe()
        self.subscribed = True
        await self.accept()
        await self.welcome()

    async def disconnect(self, code: int) -> None:
        for group in self.live_groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.subscribed:
            self.subscribed = False
            await relay.relay().unsubscribe()

    async def prepare(self, user: User) -> bool:
        return True

    async def welcome(self) -> None:
        pass

    async def live_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "event", "event": message["event"]})

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        # A model's choice labels are lazy texts (translated): written as strings, in the
        # language active where the payload was built.
        return json.dumps(content, cls=DjangoJSONEncoder)

    async def still_allowed(self, *permissions: str) -> bool:
        """The user as the database has them now holds the page's permission and these;
        one who lost the page's is told and the socket closed."""
        user = self.scope.get("user")
        rights: tuple[bool, bool] = await database_sync_to_async(_current_rights)(user, self.permission, permissions)
        page, extra = rights
        if not page:
            self.withdrawn = True
            await self.send_json({"type": "error", "code": "withdrawn", "error": "your access to this page was withdrawn"})
            await self.close(code=NOT_STAFF)
            return False
        return extra

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """A frame that is not a JSON object gets an error, not a dropped socket."""
        try:
            content = json.loads(text_data) if text_data else None
        except ValueError:
            content = None
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "error": "send a JSON object"})
            return
        await self.receive_json(content)


def allowed(user: User | AnonymousUser | None, permission: str | None) -> TypeGuard[User]:
    """The console's rule, for its pages and its websockets alike."""
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff
                and (not permission or user.has_perm(permission)))


def _current_rights(user: User | AnonymousUser | None, page_permission: str,
                    permissions: Iterable[str]) -> tuple[bool, bool]:
    """(may still use the page, also holds `permissions`), read afresh: the user object
    of the handshake caches its permissions for the socket's whole life."""
    if user is None or not user.is_authenticated:
        return False, False
    fresh = get_user_model()._default_manager.filter(pk=user.pk).first()
    page = allowed(fresh, page_permission)
    return page, page and fresh is not None and all(fresh.has_perm(p) for p in permissions)


class DashboardConsumer(LiveConsumer):
    """Sends the whole picture on connect, every event as it happens, and a fresh
    picture shortly after (several events in a burst cost one). Auditors may watch;
    deciding proposals takes the permission to change them."""

    live_groups = (live.DASHBOARD,)
    permission = DASHBOARD_PERMISSION
    REFRESH_AFTER = 0.3
    refresh_task: asyncio.Task[None] | None

    async def prepare(self, user: User) -> bool:
        self.user = user
        self.language = language_of(self.scope)  # the snapshot's labels are written in it
        self.can_decide = await database_sync_to_async(user.has_perm)(DECIDE_PERMISSION)
        self.refresh_task = None
        return True

    async def welcome(self) -> None:
        await self.send_snapshot()

    async def send_snapshot(self) -> None:
        picture = await database_sync_to_async(speaking(self.language, console.snapshot))()
        await self.send_json({"type": "snapshot", "can_decide": self.can_decide, **picture})

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event.get("kind") == "message" and event.get("disposition") == "held":
            # Who holds it, named as a person (olga, not console:olga): the event carries its id only.
            event = {**event, "held_by": await database_sync_to_async(holder_of)(event.get("conversation"))}
        await self.send_json({"type": "event", "event": event})
        if self.refresh_task is None or self.refresh_task.done():
            self.refresh_task = asyncio.create_task(self._refresh_soon())

    async def _refresh_soon(self) -> None:
        await asyncio.sleep(self.REFRESH_AFTER)
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        refresh_task = getattr(self, "refresh_task", None)  # none before prepare()
        if refresh_task is not None:
            refresh_task.cancel()
        await super().disconnect(code)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        action, proposal = content.get("action"), content.get("proposal")
        if action in ("take_over", "give_back"):
            await self.hold(action, content.get("conversation"))
            return
        if action not in ("apply", "reject") or not isinstance(proposal, int):
            await self.send_json({"type": "error", "error": "expected {action: apply|reject, proposal: <id>}"})
            return
        self.can_decide = await self.still_allowed(DECIDE_PERMISSION)
        if not self.can_decide:
            if not self.withdrawn:  # still on the page, only without the right to decide
                await self.send_json({"type": "error", "code": "cannot_decide", "error": "your role cannot decide proposals"})
            return
        state = await database_sync_to_async(_decide)(action, proposal, self.user.get_username())
        await self.send_json({"type": "decided", "proposal": proposal, "state": state})
        await self.send_snapshot()


    async def hold(self, action: str, conversation_id: object) -> None:
        """Take a conversation over, or give it back (conversations.handoff): operators
        (change_conversation), checked at each action as the role may have changed."""
        if not isinstance(conversation_id, int):
            await self.send_json({"type": "error", "error": "expected {action: take_over|give_back, conversation: <id>}"})
            return
        if not await self.still_allowed("conversations.change_conversation"):
            await self.send_json({"type": "error", "code": "cannot_hold", "error": "your role cannot take conversations over"})
            return
        move = handoff.take_over if action == "take_over" else handoff.give_back
        changed = await database_sync_to_async(move)(conversation_id, f"console:{self.user.get_username()}")
        await self.send_json({"type": "held", "conversation": conversation_id, "action": action, "changed": changed})


def _decide(action: str, proposal_id: int, username: str) -> str:
    if not Proposal.objects.filter(pk=proposal_id).exists():
        return "unknown"
    decide = approvals.apply if action == "apply" else approvals.reject
    return decide(proposal_id, by=f"operator:{username}").state


class PlaygroundConsumer(LiveConsumer):
    """A web chat with one `webchat` channel, as the logged-in person: what they type is
    admitted like any platform's message; the page sees the countdown, the merged turn,
    typing, the reply and any duplicate caught, live. It sends messages that make agents
    act, so it is for operators (who may change channels), not auditors."""

    permission = PLAYGROUND_PERMISSION
    channel: Channel
    conversation: Conversation

    async def prepare(self, user: User) -> bool:
        slug = self.scope["url_route"]["kwargs"]["slug"]
        channel, conversation = await database_sync_to_async(_open_playground)(slug, user)
        self.channel, self.conversation = channel, conversation
        if channel is None:
            return False
        self.live_groups = (live.conversation_group(self.conversation.pk),)
        return True

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event.get("kind") == "reply" and "by" not in event:
            # A person's reply is named at once, as the transcript names it after a reload.
            by = await database_sync_to_async(person_behind)(self.conversation.pk, event.get("text") or "")
            event = {**event, "by": by} if by else event
        await self.send_json({"type": "event", "event": event})

    async def welcome(self) -> None:
        transcript = await database_sync_to_async(_transcript)(self.conversation.pk)
        await self.send_json({"type": "hello", "conversation": self.conversation.pk, "channel": self.channel.slug,
                              "agent": self.channel.agent, "transcript": transcript})

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        if "confirm" in content:  # a tap on a question's button (tools.confirmations)
            if await self.still_allowed():
                await self.send_json(await database_sync_to_async(_confirm)(self.channel, self.scope["user"],
                                                                            str(content["confirm"])[:100]))
            return
        if "delete" in content:  # the person deletes a message they sent (conversations.deletions)
            if await self.still_allowed():
                message_id = str(content["delete"])[:64]
                deleted = await database_sync_to_async(_delete)(self.channel, self.scope["user"], message_id)
                await self.send_json({"type": "deleted", "id": message_id, **deleted})
            return
        text = content.get("text")
        if not isinstance(text, str) or not text.strip():
            await self.send_json({"type": "error", "code": "empty", "error": "a message needs some text"})
            return
        if len(text) > MAX_TEXT:
            await self.send_json({"type": "error", "code": "too_long", "limit": MAX_TEXT,
                                  "error": f"messages are limited to {MAX_TEXT} characters"})
            return
        if not await self.still_allowed():
            return
        if "edit" in content:  # the person corrects a message they sent (conversations.edits)
            message_id = str(content["edit"])[:64]
            try:
                edited = await database_sync_to_async(_edit)(self.channel, self.scope["user"], text, message_id)
            except Unstorable as exc:
                await self.send_json({"type": "error", "code": "edit_refused", "detail": str(exc),
                                      "error": f"edit refused: {exc}"})
                return
            await self.send_json({"type": "edited", "id": message_id, "text": text, **edited})
            return
        message_id = str(content.get("id") or uuid.uuid4())[:64]
        try:
            admission = await database_sync_to_async(admit_sent)(self.channel, self.scope["user"], text, message_id)
        except Unstorable as exc:  # e.g. a NUL character: refused alone, the socket stays open
            await self.send_json({"type": "error", "code": "refused", "detail": str(exc),
                                  "error": f"message refused: {exc}"})
            return
        await self.send_json({"type": "admitted", "id": message_id, **admission})


class _Sender(Protocol):
    def __call__(self, text: str = "", message_id: str = "") -> Inbound: ...


def _sender(user: User) -> _Sender:
    return lambda text="", message_id="": Inbound(
        platform_message_id=message_id, chat_id=f"console-{user.pk}", sender_id=f"console-{user.pk}",
        sender_name=user.get_full_name() or user.get_username(), username=user.get_username(), text=text)


def _confirm(channel: Channel, user: User, data: str) -> dict[str, Any]:
    me = _sender(user)()
    return handle_webchat_tap(channel, me.sender_id, me.sender_name, data)


def _open_playground(slug: str, user: User) -> tuple[Channel, Conversation] | tuple[None, None]:
    channel = Channel.objects.active(slug, KIND)
    if channel is None:
        return None, None
    return channel, open_conversation(channel, _sender(user)())


def admit_sent(channel: Channel, user: User, text: str, message_id: str,
               media: MediaRef | None = None) -> dict[str, Any]:
    """Admit what the person sent (a MediaRef: the file they attached, uploaded over HTTP:
    agentloop.console.uploads); what the page needs to show it."""
    inbound = _sender(user)(text=text, message_id=f"console:{message_id}")
    if media is not None:
        inbound = dataclasses.replace(inbound, media=media, media_type=media.kind)
    admission = admit(channel, inbound)
    return {"duplicate": admission.duplicate, "disposition": admission.disposition,
            "flush_at": admission.flush_at.isoformat() if admission.flush_at else None,
            "window_seconds": admission.window_seconds, "window_kind": admission.window_kind,
            "now": timezone.now().isoformat()}


def _edit(channel: Channel, user: User, text: str, message_id: str) -> dict[str, Any]:
    me = _sender(user)()
    now = timezone.now()
    result = edits.apply(channel, edits.Edit(platform_message_id=f"console:{message_id}", text=text, edited_at=now,
                                             source="webchat", chat_id=me.chat_id, sender_id=me.sender_id), now)
    return {"outcome": result.outcome, "duplicate": result.duplicate, "detail": result.detail,
            "flush_at": result.flush_at.isoformat() if result.flush_at else None,
            "window_seconds": result.window_seconds, "window_kind": result.window_kind, "now": now.isoformat()}


def _delete(channel: Channel, user: User, message_id: str) -> dict[str, Any]:
    """Only the person's own message: another's id is an unknown message to them."""
    me = _sender(user)()
    now = timezone.now()
    result = deletions.apply(channel, deletions.Deletion(platform_message_id=f"console:{message_id}", deleted_at=now,
                                                         source="webchat", chat_id=me.chat_id,
                                                         sender_id=me.sender_id), now)
    return {"outcome": result.outcome, "duplicate": result.duplicate, "detail": result.detail,
            "flush_at": result.flush_at.isoformat() if result.flush_at else None, "now": now.isoformat()}


def _transcript(conversation_id: int) -> list[dict[str, Any]]:
    """The conversation so far, redacted like the live events that follow it."""
    items = conversations_console.messages_of(conversation_id) + delivery_console.replies_of(conversation_id)
    for item in items:  # a reply's files, as the links its live event carried
        if "files" in item:
            item["files"] = [{"name": f.name, "type": f.type, "size": f.size,
                              "url": links.path_for_outbound(f.file, f.type, f.name)} for f in item["files"]]
    transcript: list[dict[str, Any]] = redact_payload(sorted(items, key=lambda item: item["at"] or "")[-40:])
    return transcript
