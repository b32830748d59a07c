"""Who talks to us (contacts, conversations) and what they said (inbound messages)."""

from datetime import datetime

from django.db import models
from django.utils import timezone
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from agentloop.core.admin_texts import NAME_CHARS
from agentloop.core.states import StateMachine
from conversations.models.channels import Channel


class Contact(models.Model):
    # No index of its own: the unique (channel, platform id) starts with it (see Conversation.channel).
    channel = models.ForeignKey(Channel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="contacts", db_index=False)
    platform_id = models.CharField(_("platform ID"), max_length=100)
    display_name = models.CharField(_("display name"), max_length=200, blank=True)
    username = models.CharField(_("username"), max_length=100, blank=True)
    # The platform's language for this person (Telegram's from.language_code), as given:
    # agentloop.core.languages narrows it to a catalog's when it writes to them.
    language = models.CharField(_("language"), max_length=16, blank=True, default="")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    # Limits per person (conversations.limits): while `limited_until` is ahead, this
    # person's turns are not run (their messages are stored and audited); the notice
    # went out once per episode. Usage counts only after `limits_counted_from` (an
    # operator lifting a limit moves it to now).
    limited_until = models.DateTimeField(_("limited until"), null=True, blank=True)
    limit_reason = models.CharField(_("limit reason"), max_length=120, blank=True)
    limits_counted_from = models.DateTimeField(_("limits counted from"), null=True, blank=True)

    class Meta:
        verbose_name = _("contact")
        verbose_name_plural = _("contacts")
        constraints = [
            models.UniqueConstraint(fields=["channel", "platform_id"], name="contact_unique_per_channel")
        ]

    def __str__(self) -> str:
        # A name, not a paragraph: a platform lets a person call themselves anything (200
        # characters with no space), and this names them in every list, link and title.
        return Truncator(self.display_name or self.username or self.platform_id).chars(NAME_CHARS)


class ConversationState(models.TextChoices):
    """Who answers: the agent, or a person who took the conversation over
    (conversations.handoff)."""

    AGENT = "agent", _("The agent answers")
    PERSON = "person", _("A person holds it")


class Conversation(StateMachine, models.Model):
    """One (channel, contact) pair; in a group, one (chat, sender) pair."""

    TRANSITIONS = {
        ConversationState.AGENT: {ConversationState.PERSON},
        ConversationState.PERSON: {ConversationState.AGENT},
    }

    # No index of its own: the unique (channel, chat, sender) starts with it. With one, a
    # planner without statistics yet (a new database, its first minute) tied the two for
    # admission's lookup by key and took the narrower: every new chat's probe read all the
    # channel's conversations (3.7 ms and 378 buffers per batch at 8,000 rows, issue 30).
    channel = models.ForeignKey(Channel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="conversations", db_index=False)
    contact = models.ForeignKey(Contact, verbose_name=_("contact"), on_delete=models.CASCADE, related_name="conversations")
    chat_id = models.CharField(_("chat ID"), max_length=100)
    # Denormalised from contact so ingest finds the conversation in one indexed lookup.
    sender_id = models.CharField(_("sender ID"), max_length=100)
    is_group = models.BooleanField(_("is group"), default=False)
    # Denormalised from contact too: every text written to the conversation reads it
    # (conversations.languages) with no query for the contact.
    language = models.CharField(_("language"), max_length=16, blank=True, default="")
    # History before this instant is not given to the agent (/reset).
    context_reset_at = models.DateTimeField(_("context reset at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    last_message_at = models.DateTimeField(_("last message at"), null=True, blank=True)
    state = models.CharField(_("state"), max_length=16, choices=ConversationState.choices, default=ConversationState.AGENT)
    held_by = models.CharField(_("held by"), max_length=150, blank=True, help_text=_("The person holding it (or who last did)."))
    held_at = models.DateTimeField(_("held at"), null=True, blank=True)
    # The person's last sign of life (the takeover, a reply): the channel's idle time
    # counts from here before the agent takes the conversation back by itself.
    person_active_at = models.DateTimeField(_("person active at"), null=True, blank=True)
    # The agent an agent handed this conversation to (the handoff_to_agent tool,
    # conversations.routing): its turns go to this rule's agent until /reset.
    pinned_rule = models.ForeignKey("RoutingRule", verbose_name=_("pinned rule"), null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+", db_index=False)

    # Not columns: the state an admission reads with the row (conversations.ingest, one
    # statement: conversations.sql.conversation_with_state) and sets on it — its open
    # buffer's id, first message time, count and latest album, and its running turn's id.
    open_buffer_id: int | None
    open_buffer_first_at: datetime | None
    open_buffer_count: int | None
    open_buffer_album: str | None
    running_turn_id: int | None

    class Meta:
        verbose_name = _("conversation")
        verbose_name_plural = _("conversations")
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "chat_id", "sender_id"], name="conversation_unique_chat_sender"
            )
        ]
        indexes = [
            # The worker's housekeeping looks for held conversations every few seconds
            # (handoff.give_back_idle). Without it that look read every conversation: 24 ms
            # on a SQLite file of 290,000, in the worker's one database thread. Partial: a
            # conversation the agent answers, nearly all of them, is never written to it.
            models.Index(fields=["state"], name="conversation_held_idx", condition=models.Q(state="person")),
            # A rule's pins, found when it is deleted; a conversation never pinned is not in it.
            models.Index(fields=["pinned_rule"], name="conversation_pinned_idx",
                         condition=models.Q(pinned_rule__isnull=False)),
        ]

    def __str__(self) -> str:
        where = f" in {self.chat_id}" if self.is_group else ""
        return f"{self.contact}{where} @ {self.channel.slug}"


class MessageKind(models.TextChoices):
    TEXT = "text", _("Text")
    MEDIA = "media", _("Media")
    CONTROL = "control", _("Control command")


class Disposition(models.TextChoices):
    """What became of an admitted message."""

    BUFFERED = "buffered", _("Buffered")
    CONTROL = "control", _("Control command")
    REJECTED = "rejected", _("Rejected (a turn was running)")
    DROPPED = "dropped", _("Dropped (/stop or /reset)")
    OVERFLOW = "overflow", _("Not buffered (too many pending; the sender was told)")
    CONTEXT = "context", _("Group context (not addressed to the agent; not answered)")
    HELD = "held", _("Stored while a person held the conversation")
    LIMITED = "limited", _("Stored, not answered (the sender was over a limit)")
    BOT = "bot", _("From a bot the channel does not allow: kept as context, not answered")


class InboundMessage(models.Model):
    # Neither foreign key has an index of its own: the unique constraint below starts with
    # the channel, and the story index with the conversation (an index less to write per
    # message than one each, issue 30).
    channel = models.ForeignKey(Channel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="messages", db_index=False)
    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="messages",
                                     db_index=False)
    # Platform id, unique per channel (Telegram: "<chat id>:<message id>", as message
    # ids are only unique within a chat). The constraint *is* the durable dedup.
    platform_message_id = models.CharField(_("platform message ID"), max_length=120)
    buffer = models.ForeignKey(
        "MessageBuffer", verbose_name=_("buffer"), null=True, blank=True, on_delete=models.SET_NULL, related_name="messages"
    )
    kind = models.CharField(_("kind"), max_length=16, choices=MessageKind.choices, default=MessageKind.TEXT)
    disposition = models.CharField(_("disposition"), max_length=16, choices=Disposition.choices, default=Disposition.BUFFERED)
    text = models.TextField(_("text"), blank=True)
    media_type = models.CharField(_("media type"), max_length=30, blank=True)
    # Items sent as one album (Telegram's media_group_id) share it.
    album_id = models.CharField(_("album ID"), max_length=64, blank=True, default="")
    # The file it carries (conversations.media), fetched after the message is stored.
    media_file = models.ForeignKey("MediaFile", verbose_name=_("media file"), null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="messages")
    sender_name = models.CharField(_("sender name"), max_length=200, blank=True)
    # In a group: whether it was addressed to the agent (a mention of the bot, a reply to
    # it). None: the platform does not say (the message counts as addressed).
    mentioned = models.BooleanField(_("mentioned"), null=True, blank=True)
    reply_target = models.CharField(_("reply target"), max_length=200, blank=True, help_text=_("Platform id a reply threads to."))
    thread_id = models.CharField(_("thread ID"), max_length=50, blank=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    received_at = models.DateTimeField(_("received at"), default=timezone.now)
    # The user corrected this message (its text is the corrected one; each edit, with the
    # text before it, is a MessageEdit row).
    edited_at = models.DateTimeField(_("edited at"), null=True, blank=True)
    # The person deleted it on the platform (conversations/deletions.py): out of every
    # later prompt, shown as deleted on the story page; the text kept for the audit.
    deleted_at = models.DateTimeField(_("deleted at"), null=True, blank=True)
    # Sent by a bot (Telegram's from.is_bot, Slack's bot_id, the API's is_bot): True;
    # NULL for everyone else (nullable: the column is added without rewriting the table).
    # The loop breaker (conversations.loops) counts replies since the last message without it.
    from_bot = models.BooleanField(_("from bot"), null=True, blank=True)
    # Tracing (agentloop.core.tracing): its admission span's W3C traceparent, which the
    # flush of its buffer — in a worker, later — links to. NULL while tracing is off
    # (nullable: the column is added without rewriting the table).
    traceparent = models.CharField(_("traceparent"), max_length=55, null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("inbound message")
        verbose_name_plural = _("inbound messages")
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "platform_message_id"], name="inbound_message_admitted_once"
            )
        ]
        indexes = [
            # A conversation's messages in time order: the story page, the agent's history.
            models.Index(fields=["conversation", "received_at"], name="inbound_story_idx"),
            # The admin's date drill-down and its days (agentloop.core.big_tables).
            models.Index(fields=["received_at"], name="inbound_received_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.platform_message_id}: {self.text[:40]}"
