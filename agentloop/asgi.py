import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

if settings.AGENTLOOP_SERVE_STATIC:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_app = ASGIStaticFilesHandler(django_app)

application = ProtocolTypeRouter({"http": django_app})
