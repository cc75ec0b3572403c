"""IP addresses: IPv6 found in a pass of its own, IPv4 checked here and found by the number scan.

A candidate is an address when `ipaddress` parses it; it is redacted unless it falls in one of
`keep_ip_ranges` (private, loopback, link-local, unspecified, documentation, multicast, other
reserved ranges, public DNS resolvers), or, for IPv4, the text marks it as a version or a section
number (kiln.curate.steps.pii.context: a version word, version name or product name before it, a
changelog heading, a section word, a Debian package header, a revision after it).
Not handled here: dotted quads of more than four parts (never an address), addresses written
without dots (`3232235777`) or with octal or hex parts, CIDR suffixes (`/24` stays in the text),
MAC addresses (never redacted).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Literal

from kiln.curate.steps.pii.context import ipv4_is_version
from kiln.curate.steps.pii.placeholders import PLACEHOLDERS

IPRange = Literal[
    "private", "loopback", "link_local", "unspecified", "documentation", "multicast", "reserved", "resolvers"
]
# An alternative of the one digit scan (kiln.curate.steps.pii.numbers), led by its first digit.
IPV4_SHAPE = r"(?<![\w.]\d)(?P<ip_address>\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3})(?!\w|\.\d)"

# A candidate has two colons among its first groups; `ipaddress` decides. Bounded to the 45
# characters of the longest textual IPv6 address (with an embedded IPv4 tail).
_IPV6 = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4})?:(?:[0-9A-Fa-f]{1,4})?:[0-9A-Fa-f:]{0,36}(?:\.\d{1,3}){0,3}(?![\w:]|\.\d)"
)
_IPV6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6_RUN = re.compile(r"[0-9A-Fa-f:.]*")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
# Public resolvers: printed in every networking tutorial, they identify no person.
_WELL_KNOWN_IPS = frozenset(
    {
        "8.8.8.8",
        "8.8.4.4",
        "1.1.1.1",
        "1.0.0.1",
        "9.9.9.9",
        "149.112.112.112",
        "208.67.222.222",
        "208.67.220.220",
        "2001:4860:4860::8888",
        "2001:4860:4860::8844",
        "2606:4700:4700::1111",
        "2606:4700:4700::1001",
        "2620:fe::fe",
        "2620:fe::9",
    }
)
_IP_RANGES: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {
    kind: [ipaddress.ip_network(n) for n in nets]
    for kind, nets in {
        # RFC 1918, 6598, 4193
        "private": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"],
        "loopback": ["127.0.0.0/8", "::1/128"],
        "link_local": ["169.254.0.0/16", "fe80::/10"],
        "unspecified": ["0.0.0.0/8", "::/128"],
        "documentation": ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"],  # RFC 5737, 3849
        "multicast": ["224.0.0.0/4", "ff00::/8"],
    }.items()
}
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")  # the only IPv6 block assigned to internet hosts (RFC 4291)


def ip_range(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The keep_ip_ranges name an address falls in, or None for a public host address."""
    for kind, nets in _IP_RANGES.items():
        if any(addr.version == net.version and addr in net for net in nets):
            return kind
    if str(addr) in _WELL_KNOWN_IPS:
        return "resolvers"
    if not addr.is_global or (addr.version == 6 and addr not in _GLOBAL_UNICAST):
        return "reserved"
    return None


class IPAddresses:
    """The IP address detector: every address but those in `keep_ranges` (names of IPRange)."""

    def __init__(self, keep_ranges: Iterable[str]):
        self._keep_ranges = frozenset(keep_ranges)

    def redact_ipv6(self, text: str, hits: dict[str, int]) -> str:
        """The text with each redactable IPv6 address replaced by <IP_ADDRESS> (an IPv4-mapped one judged as
        its IPv4)."""
        # Candidates are tried only where the literal-led hint finds `:h:` or `::` (prose without
        # colon pairs costs one fast scan; 2x faster than running _IPV6 over every document).
        out: list[str] = []
        pos = search_from = 0
        while (hint := _IPV6_HINT.search(text, search_from)) is not None:
            start = hint.start()
            while start > max(pos, hint.start() - 4) and text[start - 1] in _HEX_DIGITS:
                start -= 1
            m = _IPV6.match(text, start)
            if m is None or not self._ipv6_redactable(m.group(0)):
                # subtle: no address can start inside this run of hex digits, colons and dots
                # (_IPV6 must not be preceded by one), so the whole run is skipped: linear time.
                search_from = _IPV6_RUN.match(text, hint.start()).end()
                continue
            out += (text[pos:start], PLACEHOLDERS["ip_address"])
            pos = search_from = m.end()
            hits["ip_address"] += 1
        out.append(text[pos:])
        return "".join(out)

    def _ipv6_redactable(self, candidate: str) -> bool:
        try:
            addr = ipaddress.IPv6Address(candidate)
        except ValueError:
            return False  # times (12:30:45), MAC addresses, C++ scopes
        mapped = addr.ipv4_mapped
        return self._redactable(mapped if mapped is not None else addr)

    def _redactable(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        kind = ip_range(addr)
        return kind is None or kind not in self._keep_ranges

    def ipv4_redactable(self, m: re.Match[str]) -> bool:
        """Whether a match of IPV4_SHAPE (kiln.curate.steps.pii.numbers) is a public address the text does not mark
        as a version or a section number."""
        try:
            addr = ipaddress.IPv4Address(m.group(0))  # rejects octets over 255 and leading zeros
        except ValueError:
            return False
        if not self._redactable(addr):
            return False
        return not ipv4_is_version(m.string, m.start(), m.end())
