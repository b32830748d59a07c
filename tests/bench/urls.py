"""The product's URLs plus the benchmarks' reference: a bare view doing one INSERT."""

from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from agentloop.urls import urlpatterns as product_urls
from audit.models import AuditEvent


@csrf_exempt
def bare_insert(request):
    AuditEvent.objects.create(kind="bench", target=str(len(request.body)))
    return JsonResponse({"ok": True})


urlpatterns = [path("bench/insert", bare_insert), *product_urls]
