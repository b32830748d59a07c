"""Files users send (a photo, a voice note, a document): one row per platform file,
fetched from the platform once, outside the admission that stored its message."""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from agentloop.core.states import StateMachine
from conversations.models.channels import Channel


class MediaState(models.TextChoices):
    PENDING = "pending", _("Waiting to be fetched")
    FETCHING = "fetching", _("Being fetched (leased by a worker)")
    STORED = "stored", _("Fetched and stored")
    SKIPPED = "skipped", _("Not fetched (over a size cap, or nothing to fetch)")
    FAILED = "failed", _("Could not be fetched (gave up)")


SETTLED = (MediaState.STORED, MediaState.SKIPPED, MediaState.FAILED)


class MediaFile(StateMachine, models.Model):
    """One platform file. Unique per channel by the platform's own stable id (Telegram's
    `file_unique_id`): a re-delivered update, or the same photo sent twice, is fetched
    once. `ref` is what fetching it takes (Telegram's `file_id`; a URL with no token of
    ours in it — a platform's own short-lived signature aside: Discord's CDN URL, a Teams
    file's pre-authorised downloadUrl — masked in every error text)."""

    TRANSITIONS = {
        MediaState.PENDING: {MediaState.FETCHING, MediaState.SKIPPED, MediaState.FAILED},
        # Back to PENDING: a failed try that will be retried, or a lease that expired.
        MediaState.FETCHING: {MediaState.STORED, MediaState.SKIPPED, MediaState.FAILED, MediaState.PENDING},
        MediaState.STORED: set(),
        MediaState.SKIPPED: set(),
        MediaState.FAILED: set(),
    }

    # No index of its own: the unique (channel, file key) starts with it.
    channel = models.ForeignKey(Channel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="media_files", db_index=False)
    file_key = models.CharField(_("file key"), max_length=200, help_text=_("The platform's stable id of the file."))
    # 2,000: a Teams file's downloadUrl carries its pre-authorised token (tempauth), past 500.
    ref = models.CharField(_("ref"), max_length=2000, help_text=_("What fetching it takes (Telegram's file_id)."))
    kind = models.CharField(_("kind"), max_length=30, help_text=_("photo, voice, document, …"))
    declared_type = models.CharField(_("declared type"), max_length=100, blank=True, help_text=_("The MIME type the platform gave."))
    file_name = models.CharField(_("file name"), max_length=255, blank=True)
    declared_size = models.BigIntegerField(_("declared size"), null=True, blank=True, help_text=_("Bytes, as the platform said."))
    duration = models.FloatField(_("duration"), null=True, blank=True, help_text=_("Seconds (voice notes, audio, video)."))
    state = models.CharField(_("state"), max_length=16, choices=MediaState.choices, default=MediaState.PENDING)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"), default=timezone.now)
    owner = models.CharField(_("owner"), max_length=200, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    storage_name = models.CharField(_("storage name"), max_length=300, blank=True, help_text=_("Its name in Django's default storage."))
    content_type = models.CharField(_("content type"), max_length=100, blank=True, help_text=_("Sniffed from the bytes."))
    size = models.BigIntegerField(_("size"), null=True, blank=True)
    sha256 = models.CharField(_("SHA-256"), max_length=64, blank=True)
    problem = models.CharField(_("problem"), max_length=300, blank=True,
                               help_text=_("Why it was skipped or failed, or not transcribed (redacted)."))
    transcript = models.TextField(_("transcript"), blank=True, help_text=_("A voice note's or audio file's text, when transcribed."))
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    settled_at = models.DateTimeField(_("settled at"), null=True, blank=True)

    class Meta:
        verbose_name = _("media file")
        verbose_name_plural = _("media files")
        constraints = [models.UniqueConstraint(fields=["channel", "file_key"], name="media_file_once_per_channel")]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="media_file_due_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.file_key} ({self.get_state_display()})"

    @property
    def settled(self) -> bool:
        return self.state in SETTLED
