"""Hostile input in files and URLs that reach the workers (docs/security.md): images a
chat user sends, URLs an agent key names, and what a backup of all of it holds.

- IPv6 forms that carry an IPv4 address (issue 51, finding 9): NAT64, 6to4, IPv4-mapped,
  -compatible and -translated, Teredo (its client address XORed), ISATAP. A media URL
  whose host is one of them is judged by the IPv4 inside, and refused before any
  connection when that one is not public: through the real check
  (agentloop.core.addresses) and the real download path a worker takes
  (the API platform's fetch_media: resolve, check, pin, connect)."""

import ipaddress

import pytest

from agentloop.core import addresses
from conversations.media.download import FileUnavailable
from tests.unit.test_media import media_root  # noqa: F401 (an autouse fixture: files under tmp_path)
from tests.unit.test_media_urls import channel_allowing, fetch


def teredo(server: str, client: str) -> str:
    """A Teredo address (RFC 4380): 2001::/32, the server's IPv4, flags, the client's
    port and IPv4, both XORed with ones (obfuscated)."""
    value = (0x2001_0000 << 96) | (int(ipaddress.IPv4Address(server)) << 64) | (0x8000 << 48) | (0xFFFF << 32)
    return str(ipaddress.IPv6Address(value | (~int(ipaddress.IPv4Address(client)) & 0xFFFF_FFFF)))


# (the address, the IPv4 it carries, how that one is judged)
CARRYING_A_PRIVATE_ONE = [
    ("64:ff9b::a00:1", "10.0.0.1", "private"),  # NAT64, well-known prefix (RFC 6052)
    ("64:ff9b::a9fe:a9fe", "169.254.169.254", "link-local"),
    ("64:ff9b:1::7f00:1", "127.0.0.1", "loopback"),  # NAT64, local-use prefix (RFC 8215)
    ("2002:a00:1::1", "10.0.0.1", "private"),  # 6to4 (RFC 3056)
    ("2002:7f00:1::", "127.0.0.1", "loopback"),
    ("::a00:1", "10.0.0.1", "private"),  # IPv4-compatible (RFC 4291, deprecated)
    ("::7f00:1", "127.0.0.1", "loopback"),
    ("::ffff:0:a9fe:a9fe", "169.254.169.254", "link-local"),  # IPv4-translated (RFC 2765)
    ("::ffff:c0a8:101", "192.168.1.1", "private"),  # IPv4-mapped
    (teredo("65.54.227.120", "10.0.0.1"), "10.0.0.1", "private"),  # Teredo (RFC 4380)
    (teredo("65.54.227.120", "127.0.0.1"), "127.0.0.1", "loopback"),
    ("2a00:1450:4001::5efe:a00:1", "10.0.0.1", "private"),  # ISATAP (RFC 5214)
    ("2a00:1450:4001::200:5efe:a9fe:a9fe", "169.254.169.254", "link-local"),
]


@pytest.mark.parametrize(("address", "carried", "kind"), CARRYING_A_PRIVATE_ONE)
def test_an_ipv6_address_is_judged_by_the_ipv4_it_carries(address, carried, kind):
    why = addresses.address_problem(address)
    assert why.startswith(f"the address is {kind}"), why
    assert carried in why or address.startswith("::ffff:c0a8"), why  # mapped: the IPv4 written another way


@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "64:ff9b:1::5db8:d822", "2a00:1450:4001::5efe:5db8:d822"])
def test_one_carrying_a_public_ipv4_is_as_public_as_that_one(address):
    """Judged, not refused wholesale: a NAT64 network's hosts (DNS64) are fetched."""
    assert addresses.address_problem(address) == ""


@pytest.mark.parametrize(("address", "carried", "kind"), CARRYING_A_PRIVATE_ONE)
def test_a_media_url_at_such_an_address_is_refused_before_any_connection(make_channel, address, carried, kind):
    channel = channel_allowing(make_channel)
    with pytest.raises(FileUnavailable) as refused:
        fetch(channel, f"https://[{address}]/boleta.jpg")
    assert refused.value.permanent  # refused by the policy: not a failed connection tried again
    assert str(refused.value).startswith(f"refused: the address is {kind}"), str(refused.value)
