"""The console scripts' catalog (/console/jsi18n/, Django's JavaScriptCatalog over the
djangojs catalogs): in the reader's language, the language switch read at once, and for
the console's readers only."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.end_to_end.test_story import log_in

pytestmark = pytest.mark.django_db
URL = reverse("console-jsi18n")


@pytest.fixture
def operator_client(client):
    User.objects.create_user("op", password="pw-op-catalog-1", is_staff=True)
    log_in(client, "op", "pw-op-catalog-1")
    return client


def test_the_catalog_speaks_the_readers_language(operator_client):
    spanish = operator_client.get(URL, HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert '"Apply": "Aplicar"' in spanish and '"live": "en vivo"' in spanish
    assert "globals.ngettext" in spanish and "globals.interpolate" in spanish
    operator_client.cookies["django_language"] = "pt"  # what the language switch sets
    portuguese = operator_client.get(URL, HTTP_ACCEPT_LANGUAGE="es")
    assert '"live": "ao vivo"' in portuguese.content.decode()  # the switch's cookie before the browser's


def test_the_catalog_is_for_the_consoles_readers(client):
    response = client.get(URL, HTTP_ACCEPT_LANGUAGE="es")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
