"""No dead ends (issue 53), through the real web server: `/` leads to the console (or the
login, which comes back to it), the admin's "View site" goes to the console too, and every
page names the product's icon, so that a browser's request for one is answered instead of
logging a WARNING on every page."""

import re
from contextlib import closing

import pytest
from django.contrib.auth.models import User

from tests.support import local_http
from tests.support.e2e import operator_session

pytestmark = pytest.mark.e2e
PASSWORD = "pw-olga-dead-ends-1"


@pytest.fixture
def operator(transactional_db):
    User.objects.create_superuser("olga", "olga@example.com", PASSWORD)
    return "olga", PASSWORD


def icon_href(html):
    found = re.search(r'<link rel="icon"[^>]* href="([^"]+)"', html)
    assert found, "no <link rel=\"icon\"> on the page"
    return found.group(1)


def test_root_sends_a_visitor_to_the_login_which_comes_back_to_the_console(processes):
    web = processes.web()
    response = local_http.get(f"{web.url}/")
    assert response.status_code == 302
    assert response.headers["location"] == "/admin/login/?next=/console/"


def test_root_and_view_site_lead_an_operator_to_the_console(processes, operator):
    web = processes.web()
    with closing(operator_session(web, *operator)) as browser:
        response = browser.get("/")
        assert response.status_code == 302 and response.headers["location"] == "/console/"
        assert browser.get("/", follow_redirects=True).status_code == 200
        view_site = re.search(r'<a href="([^"]+)"[^>]*>\s*View site\s*</a>', browser.get("/admin/").text)
        assert view_site and view_site.group(1) == "/console/"


def test_every_page_names_the_icon_and_no_icon_request_is_a_warning(processes, operator):
    web = processes.web()
    with closing(operator_session(web, *operator)) as browser:
        pages = {path: browser.get(path) for path in ("/admin/", "/admin/conversations/channel/", "/console/")}
        pages["/admin/login/"] = local_http.get(f"{web.url}/admin/login/")  # as a visitor sees it
        for path, page in pages.items():
            assert page.status_code == 200, path
            icon = browser.get(icon_href(page.text))
            assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml"), path
        # What a browser asks for on a page that names no icon (the API's JSON, a file).
        fallback = browser.get("/favicon.ico", follow_redirects=True)
        assert fallback.status_code == 200 and fallback.headers["content-type"].startswith("image/svg+xml")
    warnings = [line for line in web.output().splitlines() if " WARNING " in line]
    assert warnings == []
