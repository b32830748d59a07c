"""The console's pages: thin; the data arrives over the websockets."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from django.views.i18n import JavaScriptCatalog

from agentloop.console import story as conversation_story
from agentloop.console import story_page
from agentloop.console.consumers import DASHBOARD_PERMISSION, PLAYGROUND_PERMISSION, allowed
from conversations import handoff
from conversations.models import Channel, Conversation
from conversations.platforms import webchat

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

# The console's scripts' texts (locale/*/LC_MESSAGES/djangojs.po) in the reader's language
# (LocaleMiddleware's choice): gettext, ngettext and interpolate for static/console/*.js. For
# the console's readers only, like its pages; not cached, so a switch of language is read at
# the next page.
javascript_catalog = staff_member_required(JavaScriptCatalog.as_view(domain="djangojs"))


def _admin_links() -> dict[str, str]:
    """Where the pages link into the admin (the scripts append an id)."""
    return {
        "conversation": reverse("admin:conversations_conversation_changelist"),
        "turn": reverse("admin:conversations_turn_changelist"),
        "buffer": reverse("admin:conversations_messagebuffer_changelist"),
        "proposal": reverse("admin:tools_proposal_changelist"),
        "claim": reverse("admin:tools_actionclaim_changelist"),
        "event": reverse("admin:audit_auditevent_changelist"),
        "duplicate": reverse("admin:audit_caughtduplicate_changelist"),
        "ledger": reverse("admin:delivery_outboundmessage_changelist"),
        "story": reverse("console-story", args=[0]),  # the scripts put the conversation's id for the 0
    }


def _require(request: HttpRequest, permission: str) -> None:
    if not allowed(request.user, permission):
        raise PermissionDenied(f"the console needs the permission {permission}")


def home(request: HttpRequest) -> HttpResponse:
    """`/`: the live dashboard for an operator who may see it, the admin for other staff,
    and the admin's login for anyone else, which comes back to the dashboard."""
    if allowed(request.user, DASHBOARD_PERMISSION):
        return redirect("console-dashboard")
    if allowed(request.user, None):
        return redirect("admin:index")
    return redirect_to_login(reverse("console-dashboard"), reverse("admin:login"))


@staff_member_required
def dashboard(request: HttpRequest) -> HttpResponse:
    _require(request, DASHBOARD_PERMISSION)
    return render(request, "console/dashboard.html", {
        **admin.site.each_context(request), "title": _("Live dashboard"), "links": _admin_links(), "socket": "/ws/console/dashboard/",
        "playgrounds": _playgrounds() if allowed(request.user, PLAYGROUND_PERMISSION) else []})


@staff_member_required
def playground(request: HttpRequest, slug: str | None = None) -> HttpResponse:
    _require(request, PLAYGROUND_PERMISSION)
    channels = _playgrounds()
    if not channels:
        return render(request, "console/no_playground.html", {**admin.site.each_context(request),
                                                              "title": _("Playground")}, status=404)
    channel = next((c for c in channels if c.slug == slug), None) if slug else channels[0]
    if channel is None:
        raise Http404(f"no active web chat channel '{slug}'")
    return render(request, "console/playground.html", {
        **admin.site.each_context(request), "title": f"{_('Playground')} — {channel.name or channel.slug}", "channel": channel, "playgrounds": channels,
        "links": _admin_links(), "socket": f"/ws/console/playground/{channel.slug}/"})


@staff_member_required
def story(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """A conversation's whole story, one page of entries at a time (?before=<cursor> for
    earlier ones); ?format=json downloads the same page for a support ticket."""
    _require(request, DASHBOARD_PERMISSION)
    try:
        page = conversation_story.page(conversation_id, before=request.GET.get("before"))
    except Conversation.DoesNotExist:
        raise Http404(f"no conversation {conversation_id}") from None
    data = story_page.as_json(page, can_view=lambda label: request.user.has_perm(_view_permission(label)))
    if request.GET.get("format") == "json":
        response = JsonResponse(data, json_dumps_params={"ensure_ascii": False, "indent": 1})
        suffix = "" if page.newest or not page.entries else f"-from-{page.entries[0].at:%Y%m%dT%H%M%S}"
        response["Content-Disposition"] = f'attachment; filename="conversation-{conversation_id}-story{suffix}.json"'
        return response
    story_page.timeline(page, data["entries"])
    return render(request, "console/story.html", {
        **admin.site.each_context(request), "title": _("Story of %(contact)s @ %(channel)s") % {
            "contact": data["conversation"]["contact"], "channel": page.conversation.channel.slug}, "story": data, "page": page, "links": _admin_links(),
        "state": story_page.header(page.conversation), "time_zone": timezone.get_current_timezone_name(),
        "conversation_url": reverse("admin:conversations_conversation_change", args=[conversation_id])
        if request.user.has_perm("conversations.view_conversation") else None,
        "can_hold": request.user.has_perm("conversations.change_conversation"), "reply_key": uuid.uuid4().hex,
        "can_replay": allowed(request.user, PLAYGROUND_PERMISSION)})  # a replay runs the channel's agent


@require_POST
@staff_member_required
def hold(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The story page's controls (conversations.handoff): take over, reply as the
    person, give back. Operators only (change_conversation); each is idempotent."""
    if not request.user.has_perm("conversations.change_conversation"):
        raise PermissionDenied("taking a conversation over needs conversations.change_conversation")
    if not Conversation.objects.filter(pk=conversation_id).exists():
        raise Http404(f"no conversation {conversation_id}")
    who, action = f"console:{request.user.get_username()}", request.POST.get("action")
    if action == "take_over":
        handoff.take_over(conversation_id, who)
    elif action == "give_back":
        handoff.give_back(conversation_id, who)
    elif action == "reply" and request.POST.get("text", "").strip():
        try:  # the form's one-time key: a double submit sends the reply once
            handoff.reply(conversation_id, request.POST["text"].strip()[:4000], who,
                          key=request.POST.get("key", "")[:100])
        except handoff.NotHeld:
            pass  # given back meanwhile: the page shows it
    return redirect(reverse("console-story", args=[conversation_id]) + "#hold")


def _view_permission(model_label: str) -> str:
    app, model = model_label.split(".")
    return f"{app}.view_{model}"


def _playgrounds() -> list[Channel]:
    return list(Channel.objects.filter(kind=webchat.KIND, is_active=True).order_by("slug"))
