"""The API docs read in the order a client works (issue 53): the schema's tags are what a
client does, in that order, every operation under exactly one of them; its component
names read well (no `ClaimRequestRequest`); and `/mcp`, which is not a REST path, is
described in the schema's own text."""

import pytest

pytestmark = pytest.mark.django_db

TAGS = ["inbound", "reading", "replies", "tools and the guard", "turns", "schedules", "takeover", "operators"]
METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def operations(schema):
    return {(method.upper(), path): operation for path, item in schema["paths"].items()
            for method, operation in item.items() if method in METHODS}


def test_the_tags_are_what_a_client_does_in_that_order_each_described(schema):
    assert [tag["name"] for tag in schema["tags"]] == TAGS
    assert all(tag.get("description") for tag in schema["tags"])


def test_every_operation_has_exactly_one_of_the_tags_and_every_tag_has_operations(schema):
    tags = {operation: spec.get("tags") for operation, spec in operations(schema).items()}
    assert len(tags) >= 20
    assert {operation: tag for operation, tag in tags.items() if tag is None or len(tag) != 1
            or tag[0] not in TAGS} == {}
    assert {tag[0] for tag in tags.values()} == set(TAGS)
    assert tags[("POST", "/api/v1/channels/{slug}/messages")] == ["inbound"]
    assert tags[("POST", "/api/v1/actions/{claim}/fail")] == ["tools and the guard"]
    assert tags[("POST", "/api/v1/conversations/{conversation}/reply")] == ["takeover"]
    assert tags[("POST", "/api/v1/turns/{turn}/reply")] == ["turns"]


def test_the_paths_come_in_the_order_of_their_tags(schema):
    """The raw schema reads as the docs page does: the inbound POST first, not
    `actions/{claim}/fail`."""
    order = [TAGS.index(spec["tags"][0]) for spec in operations(schema).values()]
    assert order == sorted(order)
    assert next(iter(operations(schema))) == ("POST", "/api/v1/channels/{slug}/messages")


def test_component_names_read_well(schema):
    names = set(schema["components"]["schemas"])
    assert sorted(name for name in names if name.endswith("RequestRequest")) == []
    assert {"ActionClaimRequest", "NewScheduleRequest"} <= names


def test_the_description_says_what_mcp_is_and_how_to_reach_it(schema):
    text = schema["info"]["description"]
    for words in ("/mcp", "JSON-RPC", "Streamable HTTP", "Authorization: Bearer", "guard_claim", "/mcp/<channel>"):
        assert words in text, words
