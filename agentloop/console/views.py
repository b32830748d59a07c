"""The console's pages: thin; the data arrives over the websockets."""

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.urls import reverse

from agentloop.console import story as conversation_story
from agentloop.console.consumers import DASHBOARD_PERMISSION, PLAYGROUND_PERMISSION, allowed
from conversations.models import Channel, Conversation
from conversations.platforms import webchat


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
        "story": reverse("console-story", args=[0]),  # the scripts put the conversation's id for the 0
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


@staff_member_required
def story(request, conversation_id):
    """A conversation's whole story, one page of entries at a time (?before=<cursor> for
    earlier ones); ?format=json downloads the same page for a support ticket."""
    _require(request, DASHBOARD_PERMISSION)
    try:
        page = conversation_story.page(conversation_id, before=request.GET.get("before"))
    except Conversation.DoesNotExist:
        raise Http404(f"no conversation {conversation_id}") from None
    data = conversation_story.as_json(page, can_view=lambda label: request.user.has_perm(_view_permission(label)))
    if request.GET.get("format") == "json":
        response = JsonResponse(data, json_dumps_params={"ensure_ascii": False, "indent": 1})
        suffix = "" if page.newest or not page.entries else f"-from-{page.entries[0].at:%Y%m%dT%H%M%S}"
        response["Content-Disposition"] = f'attachment; filename="conversation-{conversation_id}-story{suffix}.json"'
        return response
    return render(request, "console/story.html", {
        **admin.site.each_context(request), "title": f"Story of {data['conversation']['contact']} @ "
        f"{page.conversation.channel.slug}", "story": data, "page": page, "links": _admin_links(),
        "conversation_url": reverse("admin:conversations_conversation_change", args=[conversation_id])
        if request.user.has_perm("conversations.view_conversation") else None})


def _view_permission(model_label):
    app, model = model_label.split(".")
    return f"{app}.view_{model}"


def _playgrounds():
    return list(Channel.objects.filter(kind=webchat.KIND, is_active=True).order_by("slug"))
