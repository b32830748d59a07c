"""Whether we may connect to an address someone else named (a media URL an agent key
gave, a server a channel's configuration points at): public addresses only.

An IPv6 address can carry an IPv4 one, and a packet sent to it may end at that IPv4
address: through a NAT64 translator, a 6to4 or Teredo relay, an ISATAP or automatic
tunnel, or the host's own dual stack (IPv4-mapped). Such an address is as public as
the IPv4 it carries, whatever its IPv6 range says (Python's `is_global` calls
64:ff9b::10.0.0.1 global). Not recognisable from the address alone: a NAT64 behind a
network-specific prefix of its own (any /32../96 of the operator's), which only its
network knows — there, name such hosts nowhere, or keep the worker off that network.

Standard library only, no Django: the bottom of the layers, importable from anywhere.
"""

import ipaddress

IPv6 = ipaddress.IPv6Address
IPv4 = ipaddress.IPv4Address

# Prefixes whose last 32 bits are an IPv4 address (RFC 6052's /96 layout), with the
# name a refusal gives them. The local-use prefix (RFC 8215) may be cut shorter by its
# operator, who then puts the IPv4 elsewhere; its /96 layout is the one DNS64 uses.
_LAST_32_BITS = (
    (ipaddress.IPv6Network("64:ff9b::/96"), "NAT64"),
    (ipaddress.IPv6Network("64:ff9b:1::/48"), "NAT64"),
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "IPv4-translated"),  # RFC 2765 (SIIT)
    (ipaddress.IPv6Network("::/96"), "IPv4-compatible"),  # RFC 4291, deprecated; a sit tunnel still routes it
)
_NAT64 = tuple(net for net, name in _LAST_32_BITS if name == "NAT64")
_ISATAP_ID = 0x0000_5EFE  # RFC 5214: the interface identifier 0000:5efe:a.b.c.d (the u/g bits may be set)


def address_problem(address: str) -> str:
    """Why we will not connect to this address ("" for a public one)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, IPv6):
        if ip.ipv4_mapped:  # the IPv4 address itself, written as IPv6 (dual-stack sockets)
            return _problem(ip.ipv4_mapped)
        for form, carried in carried_ipv4(ip):
            if why := _problem(carried):
                return f"{why}: {form}, carrying {carried}"
        if any(ip in net for net in _NAT64):
            return ""  # the translator's address is the IPv4 one, judged above
    return _problem(ip)


def carried_ipv4(ip: IPv6) -> list[tuple[str, IPv4]]:
    """[(the form, the IPv4 address)] that a packet to `ip` may be delivered to."""
    found = []
    for net, form in _LAST_32_BITS:
        if ip in net and int(ip) >> 1 != 0:  # not :: nor ::1 (judged as themselves)
            found.append((form, IPv4(int(ip) & 0xFFFF_FFFF)))
    if ip.sixtofour:
        found.append(("6to4", ip.sixtofour))
    if ip.teredo:  # (server, client): the client's address un-XORed by ipaddress
        found += [("Teredo", ip.teredo[1]), ("Teredo", ip.teredo[0])]
    if (int(ip) >> 32) & 0xFCFF_FFFF == _ISATAP_ID:
        found.append(("ISATAP", IPv4(int(ip) & 0xFFFF_FFFF)))
    return found


def _problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    for kind, test in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                       ("multicast", ip.is_multicast), ("unspecified", ip.is_unspecified),
                       ("private", ip.is_private)):
        if test:
            return f"the address is {kind}"
    return "" if ip.is_global else "the address is not public"
