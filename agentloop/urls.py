from django.contrib import admin
from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from conversations import api, views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/telegram/<slug:slug>/", views.telegram_webhook, name="telegram-webhook"),
    path("api/v1/channels/<slug:slug>/messages", api.ChannelMessagesView.as_view(), name="api-channel-messages"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("healthz", views.healthz, name="healthz"),
]
