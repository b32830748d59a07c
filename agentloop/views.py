"""The console's pages: thin; the data arrives over the websockets."""

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse

from agentloop.consumers import DASHBOARD_PERMISSION, PLAYGROUND_PERMISSION, allowed
from conversations.models import Channel, ChannelKind


def _admin_links():
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
    }


def _require(request, permission):
    if not allowed(request.user, permission):
        raise PermissionDenied(f"the console needs the permission {permission}")


@staff_member_required
def dashboard(request):
    _require(request, DASHBOARD_PERMISSION)
    return render(request, "console/dashboard.html", {
        **admin.site.each_context(request), "title": "Live dashboard", "links": _admin_links(), "socket": "/ws/console/dashboard/",
        "playgrounds": _playgrounds() if allowed(request.user, PLAYGROUND_PERMISSION) else []})


@staff_member_required
def playground(request, slug=None):
    _require(request, PLAYGROUND_PERMISSION)
    channels = _playgrounds()
    if not channels:
        return render(request, "console/no_playground.html", {**admin.site.each_context(request),
                                                              "title": "Playground"}, status=404)
    channel = next((c for c in channels if c.slug == slug), None) if slug else channels[0]
    if channel is None:
        raise Http404(f"no active web chat channel '{slug}'")
    return render(request, "console/playground.html", {
        **admin.site.each_context(request), "title": f"Playground — {channel.name or channel.slug}", "channel": channel, "playgrounds": channels,
        "links": _admin_links(), "socket": f"/ws/console/playground/{channel.slug}/"})


def _playgrounds():
    return list(Channel.objects.filter(kind=ChannelKind.WEBCHAT, is_active=True).order_by("slug"))
