"""Views every platform shares. A platform's webhooks live in its own package
(conversations/platforms/<kind>/), mounted under /webhooks/<kind>/."""

from django.http import JsonResponse

from conversations.models import Channel


def healthz(request):
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})
