"""The story page's recording and replay (agentloop.console.replay): the recording as a
download, and "Replay…" — a small form choosing the configuration, then the recorded and
the replayed runs side by side (or the same report as JSON)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from agentloop.console.consumers import DASHBOARD_PERMISSION, PLAYGROUND_PERMISSION, allowed
from agentloop.console.replay import comparison, document, playback, recording
from agentloop.console.replay.recorded_agent import NAME as RECORDED
from conversations.models import DoubleTexting

if TYPE_CHECKING:
    from django.http import HttpRequest

# Who may run a replay: whoever may change channels (a replay runs the channel's agent, a
# model maybe, at the deployment's cost) — the playground's permission.
REPLAY_PERMISSION = PLAYGROUND_PERMISSION


def _recording_of(conversation_id: int, mask: bool) -> document.Document:
    try:
        return recording.export(conversation_id, mask=mask)
    except document.RecordingError as exc:
        raise Http404(str(exc)) from None


@staff_member_required
def download(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The conversation's recording as a file (?mask=1: personal data masked)."""
    if not allowed(request.user, DASHBOARD_PERMISSION):
        raise PermissionDenied(f"the console needs the permission {DASHBOARD_PERMISSION}")
    mask = request.GET.get("mask") == "1"
    response = HttpResponse(document.dumps(_recording_of(conversation_id, mask)), content_type="application/json")
    suffix = "-masked" if mask else ""
    response["Content-Disposition"] = f'attachment; filename="conversation-{conversation_id}-recording{suffix}.json"'
    return response


class ReplayForm(forms.Form):
    agent = forms.ChoiceField(label=gettext_lazy("Agent"), required=False)
    model = forms.CharField(label=gettext_lazy("Model"), required=False, max_length=200)
    system_prompt = forms.CharField(label=gettext_lazy("System prompt"), required=False,
                                    widget=forms.Textarea(attrs={"rows": 3}))
    tools = forms.CharField(label=gettext_lazy("Tools (names, separated by commas; empty: all)"), required=False)
    window_ms = forms.IntegerField(label=gettext_lazy("One window for every text (ms)"), required=False, min_value=0)
    double_texting = forms.ChoiceField(label=gettext_lazy("Double texting"), required=False)
    agent_config = forms.CharField(label=gettext_lazy("Agent configuration (JSON, merged over the channel's)"),
                                   required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agents = [(RECORDED, _("recorded answers (deterministic)")), *((n, n) for n in sorted(settings.AGENTLOOP_AGENTS))]
        self.fields["agent"].choices = [("", _("the channel's")), *agents]  # type: ignore[attr-defined]
        self.fields["double_texting"].choices = [("", _("the channel's")), *DoubleTexting.choices]  # type: ignore[attr-defined]

    def clean_agent_config(self) -> dict[str, Any]:
        text = self.cleaned_data["agent_config"].strip()
        try:
            value = json.loads(text) if text else {}
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(_("not JSON: %(why)s") % {"why": exc.msg}) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(_("must be a JSON object"))
        return value

    def configuration(self) -> dict[str, Any]:
        data = {key: value for key, value in self.cleaned_data.items() if value not in ("", None, {})}
        if "tools" in data:
            data["tools"] = [name.strip() for name in data["tools"].split(",") if name.strip()]
        return data


def _shown(report: dict[str, Any]) -> dict[str, Any]:
    """The report as the page lays it out: each turn's two sides, and the totals, labelled."""
    compared = report["comparison"]
    recorded, replayed = _("Recorded"), _("Replayed")
    turns = [{**turn, "sides": [(recorded, turn["recorded"]), (replayed, turn["replayed"])]}
             for turn in compared["turns"]]
    return {**report, "comparison": {**compared, "turns": turns},
            "totals": [(recorded, compared["totals"]["recorded"]), (replayed, compared["totals"]["replayed"])]}


@staff_member_required
def replay(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """GET: the form; POST: the replay, its report below the form (format=json: as a file)."""
    if not allowed(request.user, REPLAY_PERMISSION):
        raise PermissionDenied(f"a replay needs the permission {REPLAY_PERMISSION}")
    recorded = _recording_of(conversation_id, mask=False)
    form = ReplayForm(request.POST or None)
    report, problem = None, ""
    if request.method == "POST" and form.is_valid():
        try:
            configuration = playback.configuration_of(form.configuration())
            if playback.holds_writers(configuration, recorded):
                raise playback.ReplayError(_(
                    "On SQLite a replay holds the database's write lock while it runs, and a model may take "
                    "minutes: replay here with recorded answers, demo or echo, or run manage.py replay on a copy."))
            report = comparison.report(recorded, playback.replay(recorded, configuration))
        except (playback.ReplayError, document.RecordingError) as exc:
            problem = str(exc)
        if report is not None and request.POST.get("format") == "json":
            response = JsonResponse(report, json_dumps_params={"ensure_ascii": False, "indent": 1})
            response["Content-Disposition"] = f'attachment; filename="conversation-{conversation_id}-replay.json"'
            return response
    return render(request, "console/replay.html", {
        **admin.site.each_context(request), "title": _("Replay of conversation %(id)s") % {"id": conversation_id},
        "conversation_id": conversation_id, "recorded": recorded, "form": form, "problem": problem,
        "report": _shown(report) if report else None, "links": {}})
