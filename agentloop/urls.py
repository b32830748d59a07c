from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, reverse_lazy
from django.utils.translation import gettext_lazy as _
from django.views.generic.base import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from agentloop.console import metrics as console_metrics
from agentloop.console import replay_views
from agentloop.console import uploads as console_uploads
from agentloop.console import views as console_views
from agentloop.core.body_limit import accepts_upload
from audit import api as audit_api
from conversations import api, platforms, views
from conversations.api import handoff as handoff_api
from conversations.api.operators import ForgetContactView
from tools import api as tools_api
from tools import views as tools_views

# Every app's admin module, in INSTALLED_APPS order (the console's last: it dresses the
# others' in the theme). Already done at setup in a web process (AdminConfig); a worker's
# setup leaves it to here (SimpleAdminConfig, agentloop/core/process_apps.py), should it ever load the URLconf.
admin.autodiscover()

admin.site.site_header = "agentloop"
admin.site.site_title = "agentloop"
admin.site.index_title = _("Operations")
admin.site.site_url = reverse_lazy("console-dashboard")  # "View site": the console, not a 404


urlpatterns = [
    path("", console_views.home, name="home"),
    # Browsers ask for /favicon.ico where a page names no icon (the API's JSON, a file).
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    # The language switch in the admin's user menu posts here (Django's set_language).
    path("i18n/", include("django.conf.urls.i18n")),
    path("console/", console_views.dashboard, name="console-dashboard"),
    path("console/jsi18n/", console_views.javascript_catalog, name="console-jsi18n"),
    path("console/conversations/<int:conversation_id>/story/", console_views.story, name="console-story"),
    path("console/conversations/<int:conversation_id>/hold/", console_views.hold, name="console-hold"),
    path("console/conversations/<int:conversation_id>/recording.json", replay_views.download, name="console-recording"),
    path("console/conversations/<int:conversation_id>/replay/", replay_views.replay, name="console-replay"),
    path("console/playground/", console_views.playground, name="console-playground"),
    path("console/playground/<slug:slug>/", console_views.playground, name="console-playground-channel"),
    # The two routes that take a file: their bodies may reach AGENTLOOP_MAX_UPLOAD_BODY_BYTES.
    path("console/playground/<slug:slug>/files", accepts_upload(console_uploads.playground_upload),
         name="console-playground-upload"),
    *platforms.urlpatterns(),  # each platform's webhooks, under webhooks/<kind>/
    path("api/v1/channels/<slug:slug>/messages", accepts_upload(api.ChannelMessagesView.as_view()),
         name="api-channel-messages"),
    path("api/v1/channels/<slug:slug>/messages/<str:message_id>", api.MessageEditView.as_view(),
         name="api-channel-message-edit"),
    path("api/v1/conversations/<int:conversation>/messages", api.ConversationMessagesView.as_view(),
         name="api-conversation-messages"),
    path("api/v1/conversations/<int:conversation>/stream", api.ConversationStreamView.as_view(),
         name="api-conversation-stream"),
    path("api/v1/conversations/<int:conversation>/schedules", api.ConversationSchedulesView.as_view(),
         name="api-conversation-schedules"),
    path("api/v1/conversations/<int:conversation>/takeover", handoff_api.TakeoverView.as_view(),
         name="api-conversation-takeover"),
    path("api/v1/conversations/<int:conversation>/reply", handoff_api.PersonReplyView.as_view(),
         name="api-conversation-reply"),
    path("api/v1/conversations/<int:conversation>/release", handoff_api.ReleaseView.as_view(),
         name="api-conversation-release"),
    path("api/v1/turns", api.TurnListView.as_view(), name="api-turns"),
    path("api/v1/turns/<int:turn>/claim", api.TurnClaimView.as_view(), name="api-turn-claim"),
    path("api/v1/turns/<int:turn>/reply", api.TurnReplyView.as_view(), name="api-turn-reply"),
    path("api/v1/turns/<int:turn>/done", api.TurnDoneView.as_view(), name="api-turn-done"),
    path("api/v1/tools", tools_api.ToolListView.as_view(), name="api-tools"),
    path("api/v1/tools/<str:name>/invoke", tools_api.ToolInvokeView.as_view(), name="api-tool-invoke"),
    path("api/v1/actions/claim", tools_api.ActionClaimView.as_view(), name="api-action-claim"),
    path("api/v1/actions/<int:claim>/succeed", tools_api.ActionSucceedView.as_view(), name="api-action-succeed"),
    path("api/v1/actions/<int:claim>/fail", tools_api.ActionFailView.as_view(), name="api-action-fail"),
    path("api/v1/operator/contacts/forget", ForgetContactView.as_view(), name="api-operator-forget-contact"),
    path("api/v1/audit/events", audit_api.AuditEventsView.as_view(), name="api-audit-events"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("calendars/<str:token>.ics", tools_views.calendar_feed, name="calendar-feed"),
    path("files/<str:token>", views.media_file, name="media-file"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", console_metrics.metrics, name="metrics"),
]

# A path under /api/ that matches no route answers JSON in the API's error shape.
handler404 = "agentloop.core.api.api_not_found"
