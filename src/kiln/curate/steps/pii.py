"""Redact personal data and credentials: emails, phones, IP addresses, card numbers, US SSNs, secrets.

Each hit becomes a typed placeholder (`<EMAIL>`, `<PHONE>`, `<IP_ADDRESS>`, `<CREDIT_CARD>`,
`<SSN>`, `<SECRET>`) and is counted per source as `pii:<type>`. Regexes only propose candidates;
a candidate is redacted once Python confirms it (Luhn for cards, SSA allocation rules for SSNs,
`ipaddress` for IPs), so near-misses (a 16-digit number failing Luhn, `999.1.1.1`, `user@localhost`)
stay. Every pattern is written so that a match can start only at the beginning of a run of its
characters and every repeat is bounded or unambiguous: no input makes a pass superlinear (the
tests time 1 MB adversarial strings).
Not handled: names, postal addresses, passwords in prose, national ids other than US SSNs, phone
numbers written without a `+` country code outside the US formats, secrets without a known prefix
(no entropy-based guessing), and text split by markup (`john&#64;example.com`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator

from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger


class PIIConfig(Section):
    enabled: bool = Field(True, description="Run PII redaction.")
    emails: bool = Field(True, description="Replace email addresses with <EMAIL>.")
    phones: bool = Field(True, description="Replace phone numbers (+country code, or US (555) 123-4567, 555-123-4567, 555.123.4567) with <PHONE>.")
    ip_addresses: bool = Field(True, description="Replace IPv4 and IPv6 addresses with <IP_ADDRESS>.")
    public_ips_only: bool = Field(True, description="Redact only addresses of hosts on the public internet; private, loopback, link-local, documentation and multicast ranges and well-known public DNS resolvers stay.")
    credit_cards: bool = Field(True, description="Replace 13-19 digit card numbers that pass the Luhn check with <CREDIT_CARD>.")
    ssns: bool = Field(True, description="Replace US social security numbers written AAA-GG-SSSS with <SSN>.")
    secrets: bool = Field(True, description="Replace API keys and tokens of known formats and PEM private-key blocks with <SECRET>.")
    max_hits: int | None = Field(None, ge=0, description="Drop a document with more than this many redactions (all types together); None never drops.")


PLACEHOLDERS = {
    "email": "<EMAIL>",
    "phone": "<PHONE>",
    "ip_address": "<IP_ADDRESS>",
    "credit_card": "<CREDIT_CARD>",
    "ssn": "<SSN>",
    "secret": "<SECRET>",
}

# --- secrets --------------------------------------------------------------------------------------

# A private key may be truncated (no END line) and still leak; then the BEGIN line and the base64 and
# header lines right after it go. An END further than this from its BEGIN is not trusted to close it:
# an RSA-8192 private key is about 6.5 KB of base64.
MAX_PEM_BODY_CHARS = 16_384
_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_TRUNCATED_BODY = re.compile(r"(?:[ \t\r]*\n[ \t]*(?:[A-Za-z0-9+/]{16,}={0,2}|(?:Proc-Type|DEK-Info|Comment):[^\n]*))*")

# Token formats as their issuers document them, each with the literal markers that must occur for
# it to be worth a scan (`in` runs at memory speed; most documents have none of them). A token starts
# where a run of [A-Za-z0-9_-] starts, so a run is scanned from one place only; the guard is written
# after the first literal character (`A(?<![...]A)`) rather than before it, so that the engine can
# skip ahead to that character instead of testing a lookbehind at every position (3x faster,
# measured on /usr/share/doc text).
_TOKEN_END = r"(?![A-Za-z0-9_-])"
_TOKENS: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = (
    (("AKIA", "ASIA"), re.compile(r"A(?<![A-Za-z0-9_-]A)(?:KIA|SIA)[0-9A-Z]{16}" + _TOKEN_END)),  # AWS access key id (ASIA: temporary)
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"g(?<![A-Za-z0-9_-]g)h[pousr]_[A-Za-z0-9]{36}" + _TOKEN_END)),  # GitHub classic tokens
    (("github_pat_",), re.compile(r"g(?<![A-Za-z0-9_-]g)ithub_pat_[A-Za-z0-9_]{82}" + _TOKEN_END)),  # GitHub fine-grained token
    (("xox",), re.compile(r"x(?<![A-Za-z0-9_-]x)ox[abposr]-[A-Za-z0-9-]{10,250}" + _TOKEN_END)),  # Slack tokens
    (("AIza",), re.compile(r"A(?<![A-Za-z0-9_-]A)Iza[0-9A-Za-z_-]{35}" + _TOKEN_END)),  # Google API key
    (("k_live_", "k_test_"), re.compile(r"[sr](?<![A-Za-z0-9_-][sr])k_(?:live|test)_[0-9A-Za-z]{16,247}" + _TOKEN_END)),  # Stripe secret/restricted (pk_ is public)
    (("sk-",), re.compile(r"s(?<![A-Za-z0-9_-]s)k-(?P<sk>[A-Za-z0-9_-]{32,250})" + _TOKEN_END)),  # OpenAI / Anthropic style
    (("eyJ",), re.compile(r"e(?<![A-Za-z0-9_-]e)yJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _TOKEN_END)),  # JWT: base64url '{"' header and payload
    (("hooks.slack.com",), re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9]{6,20}/B[A-Za-z0-9]{6,20}/[A-Za-z0-9]{16,40}")),  # Slack webhook
    # An AWS secret access key is 40 base64 characters with no prefix; only its variable name gives it away.
    (("ecret", "ECRET"), re.compile(r"[aA](?<![A-Za-z0-9][aA])(?i:ws_?secret_?access_?key)[\"']?\s*[:=]\s*[\"']?(?P<value>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])")),
)

# --- emails ---------------------------------------------------------------------------------------

# Found from the `@` (a literal the engine finds at memory speed) outwards. Domain: dot-separated
# labels and a letter TLD of 2+ characters, so `user@localhost` and `a@b` stay. Local part, matched
# backwards on the 66 characters before the `@`: the practical set (letters, digits, . _ % + -),
# starting at the start of its run, at most 64 characters (RFC 5321).
_EMAIL_DOMAIN = re.compile(r"@(?P<domain>(?:[^\W_][\w-]{0,62}\.)+[^\W\d_]{2,63})(?![\w-])")
_EMAIL_LOCAL = re.compile(r"(?<![\w.%+-])[\w%+-][\w.%+-]{0,63}\Z")
_EMAIL_LOCAL_WINDOW = 66
# `icon@2x.png` is an image name, not an address.
_FILE_EXTENSION_TLDS = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "avif", "css", "js", "ts", "min"})
# RFC 2606 reserves these for documentation: addresses there belong to no one.
_RESERVED_DOMAINS = ("example.com", "example.org", "example.net")
_RESERVED_TLDS = frozenset({"example", "test", "invalid", "localhost"})
_RESERVED_SUFFIXES = tuple("." + d for d in _RESERVED_DOMAINS)

# --- IP addresses ---------------------------------------------------------------------------------

# A candidate has two colons among its first groups; `ipaddress` decides. Bounded to the 45
# characters of the longest textual IPv6 address (with an embedded IPv4 tail).
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4})?:(?:[0-9A-Fa-f]{1,4})?:[0-9A-Fa-f:]{0,36}(?:\.\d{1,3}){0,3}(?![\w:]|\.\d)")
_IPV6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6_RUN = re.compile(r"[0-9A-Fa-f:.]*")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
# 1.2.3.4 is a valid public address and a common version number: the word before it decides.
_VERSION_CONTEXT = re.compile(r"(?:version|release|build|firmware|ver\.?)\s*[:=#]?\s*$", re.IGNORECASE)
_VERSION_CONTEXT_CHARS = 16
# Public resolvers: printed in every networking tutorial, they identify no person.
_WELL_KNOWN_IPS = frozenset({
    "8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "9.9.9.9", "149.112.112.112", "208.67.222.222", "208.67.220.220",
    "2001:4860:4860::8888", "2001:4860:4860::8844", "2606:4700:4700::1111", "2606:4700:4700::1001", "2620:fe::fe", "2620:fe::9",
})
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")  # the only IPv6 block assigned to internet hosts (RFC 4291)

# --- numbers: IPv4, card numbers, SSNs, US phones -------------------------------------------------

# These four shapes never overlap, so one scan that stops only at digits serves them all (one pass
# instead of four: 4x faster on digit-heavy changelogs). Each alternative carries its own guard on
# the character before the first digit; the leading `\d` is shared so the engine can skip to digits.
_NUMBER_SHAPES = {
    "ip_address": r"(?<![\w.]\d)(?P<ip_address>\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3})(?!\w|\.\d)",
    # Unseparated 13-19 digits, or the printed groupings 4-4-4-4(-3) and 4-6-5 (Amex) / 4-6-4
    # (Diners), one separator throughout; digits glued to a path, decimal point or other digits are
    # something else.
    "credit_card": (
        r"(?<![\w.,/:#@+-]\d)(?P<credit_card>\d{12,18}"
        r"|\d{3}(?P<s1>[ -])\d{4}(?P=s1)\d{4}(?P=s1)\d{4}(?:(?P=s1)\d{3})?"
        r"|\d{3}(?P<s2>[ -])\d{6}(?P=s2)\d{4,5})(?!\w|[.,]\d)"
    ),
    "ssn": r"(?<![\w-]\d)(?P<ssn>\d{2}-\d{2}-\d{4})(?!\w|-\d)",
    # 555-123-4567, 555.123.4567, and the same after a `1` trunk prefix; (555) 123-4567 forms are
    # found by _PHONE_PARENTHESES.
    "phone": (
        r"(?<![\w+.-]\d)(?P<phone>\d\d(?P<sep>[-.])\d{3}(?P=sep)\d{4}"
        r"|(?<=1)[ .-](?:\(\d{3}\) ?\d{3}[-.]|\d{3}(?P<sep2>[-.])\d{3}(?P=sep2))\d{4})(?!\w|[.-]\d)"
    ),
}
_PHONE_PARENTHESES = re.compile(r"\((?<![\w+.-]\()(?P<area>\d{3})\) ?\d{3}[-.]\d{4}(?!\w|[.-]\d)")
# Issuer prefixes start with 2-6 (Mastercard 2-series, Amex/Diners/JCB, Visa, Mastercard, Discover/
# UnionPay); this keeps ISBN-13s (978/979) and most long identifiers out even when they pass Luhn.
_CARD_FIRST_DIGITS = frozenset("23456")
# E.164: country code and number together have at most 15 digits; fewer than 8 is not a full number.
MIN_PHONE_DIGITS, MAX_PHONE_DIGITS = 8, 15
# One digit per repeat (with an optional separator or parenthesis around it) leaves the engine a
# single way to split the digits, so a long digit run cannot make it backtrack exponentially.
_PHONE_INTERNATIONAL = re.compile(r"\+(?<![\w+]\+)[1-9]\d{0,2}(?:[ -]?\(?\d\)?){5,14}(?!\w)")


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check that every payment card number satisfies (ISO/IEC 7812-1).

    From the rightmost digit leftwards, double every second digit, subtract 9 from doubles above 9,
    and sum: the number is valid when the sum is a multiple of 10.
    """
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def ssn_valid(area: str, group: str, serial: str) -> bool:
    """Whether AAA-GG-SSSS could have been issued: the SSA never assigns area 000, 666 or 900-999,
    group 00 or serial 0000 (SSA, "Social Security Number Randomization", 2011)."""
    return area != "000" and area != "666" and area[0] != "9" and group != "00" and serial != "0000"


def _public_ipv4(addr: ipaddress.IPv4Address) -> bool:
    return addr.is_global and not addr.is_multicast and str(addr) not in _WELL_KNOWN_IPS


class RedactPII:
    """The `pii` step: redact what the config enables, count hits per type, drop documents over `max_hits`."""

    name = "pii"

    def __init__(self, config: PIIConfig):
        self.config = config
        enabled = {"ip_address": config.ip_addresses, "credit_card": config.credit_cards, "ssn": config.ssns, "phone": config.phones}
        shapes = [shape for kind, shape in _NUMBER_SHAPES.items() if enabled[kind]]
        self._numbers = re.compile(r"\d(?:" + "|".join(shapes) + ")") if shapes else None
        # Order: key blocks and tokens first, so their base64 is never read as numbers or emails;
        # IPv6 before the number pass (an IPv6 address can end in an IPv4 one).
        passes: list[Callable[[str, dict[str, int]], str]] = []
        if config.secrets:
            passes += [self._redact_pem, self._redact_tokens]
        if config.emails:
            passes.append(self._redact_emails)
        if config.ip_addresses:
            passes.append(self._redact_ipv6)
        if self._numbers is not None:
            passes.append(self._redact_numbers)
        if config.phones:
            passes.append(self._redact_phones)
        self._passes = passes

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """The text with every enabled kind of PII replaced, and the number of hits per kind."""
        hits = dict.fromkeys(PLACEHOLDERS, 0)
        # subtle: a placeholder changes what its neighbours see: in "+44 20 7946 0958+44 20 7946
        # 0958" the second number follows a digit and is no phone, but once the first is <PHONE> it
        # follows ">" and is one. So another round runs while a new placeholder touches a character
        # a match could start or end with; the output is then a fixed point (redacting it again
        # changes nothing). Rounds end because placeholders never match.
        while True:
            found = dict.fromkeys(PLACEHOLDERS, 0)
            for redact in self._passes:
                text = redact(text, found)
            for kind, n in found.items():
                hits[kind] += n
            if not any(found.values()) or not _touches_placeholder(text):
                return text, hits

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            text, hits = self.redact(doc.text)
            total = sum(hits.values())
            if self.config.max_hits is not None and total > self.config.max_hits:
                # Counters report what was redacted in kept documents; a dropped one redacted nothing.
                ledger.remove(doc, self.name, "too_many_hits", total, self.config.max_hits)
                continue
            for kind, n in hits.items():
                if n:
                    ledger.count(doc.source, f"pii:{kind}", n)
            yield doc.with_text(text) if total else doc

    # --- passes: each returns the new text and adds its hits to `hits` --------------------------

    @staticmethod
    def _redact_pem(text: str, hits: dict[str, int]) -> str:
        if "PRIVATE KEY" not in text:
            return text
        out: list[str] = []
        pos = 0
        # The next END marker after the current BEGIN. It is searched for again only once a BEGIN
        # lies past it, and never again once none was found: many BEGINs cost one scan, not one each.
        end: re.Match[str] | None = None
        ends_left = True
        while (begin := _PEM_BEGIN.search(text, pos)) is not None:
            if ends_left and (end is None or end.start() < begin.end()):
                end = _PEM_END.search(text, begin.end())
                ends_left = end is not None
            if end is not None and begin.end() <= end.start() <= begin.end() + MAX_PEM_BODY_CHARS:
                stop = end.end()
            else:
                body = _PEM_TRUNCATED_BODY.match(text, begin.end())
                stop = body.end() if body else begin.end()
            out += (text[pos : begin.start()], PLACEHOLDERS["secret"])
            pos = stop
            hits["secret"] += 1
        out.append(text[pos:])
        return "".join(out)

    @staticmethod
    def _redact_tokens(text: str, hits: dict[str, int]) -> str:
        def token(m: re.Match[str]) -> str | None:
            key = m.groupdict().get("sk")
            # subtle: `sk-` also starts kebab-case names (`sk-learn-...`); a real key is random
            # base62, which has upper case, lower case and digits in any 32 characters.
            if key is not None and not (any(c.isdigit() for c in key) and any(c.isupper() for c in key) and any(c.islower() for c in key)):
                return None
            value = m.groupdict().get("value")
            if value is not None:  # keep the variable name, replace only the key
                return m.group(0)[: m.start("value") - m.start()] + PLACEHOLDERS["secret"]
            return PLACEHOLDERS["secret"]

        for markers, pattern in _TOKENS:
            if any(marker in text for marker in markers):
                text = _substitute(pattern, text, token, hits, "secret")
        return text

    @staticmethod
    def _redact_emails(text: str, hits: dict[str, int]) -> str:
        if "@" not in text:
            return text
        out: list[str] = []
        pos = 0
        for m in _EMAIL_DOMAIN.finditer(text):
            at = m.start()
            local = _EMAIL_LOCAL.search(text, max(0, at - _EMAIL_LOCAL_WINDOW), at)
            # subtle: a local part reaching back into the previous address is that address's domain.
            if local is None or local.start() < pos:
                continue
            domain = m.group("domain").lower()
            tld = domain.rpartition(".")[2]
            if tld in _FILE_EXTENSION_TLDS or tld in _RESERVED_TLDS or domain in _RESERVED_DOMAINS or domain.endswith(_RESERVED_SUFFIXES):
                continue
            out += (text[pos : local.start()], PLACEHOLDERS["email"])
            pos = m.end()
            hits["email"] += 1
        out.append(text[pos:])
        return "".join(out)

    def _redact_ipv6(self, text: str, hits: dict[str, int]) -> str:
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
        if not self.config.public_ips_only:
            return True
        mapped = addr.ipv4_mapped
        if mapped is not None:
            return _public_ipv4(mapped)
        return addr in _GLOBAL_UNICAST and addr.is_global and str(addr) not in _WELL_KNOWN_IPS

    def _redact_numbers(self, text: str, hits: dict[str, int]) -> str:
        assert self._numbers is not None

        def number(m: re.Match[str]) -> str | None:
            found = m.group(0)
            kind = m.lastgroup if m.lastgroup in PLACEHOLDERS else next(k for k in PLACEHOLDERS if m.groupdict().get(k) is not None)
            if kind == "ip_address":
                replacement = self._ipv4(m)
            elif kind == "credit_card":
                replacement = _card(found, m.group("s1") is not None)
            elif kind == "ssn":
                replacement = PLACEHOLDERS["ssn"] if ssn_valid(found[0:3], found[4:6], found[7:11]) else None
            else:
                # North American area codes never start with 0 or 1 (NANP), which keeps 123-456-7890.
                area = found[-12:-9].lstrip("(")
                replacement = PLACEHOLDERS["phone"] if len(area) == 3 and area[0] not in "01" else None
            if replacement is not None:
                hits[kind] += 1
            return replacement

        return _substitute(self._numbers, text, number, None, "")

    def _ipv4(self, m: re.Match[str]) -> str | None:
        try:
            addr = ipaddress.IPv4Address(m.group(0))  # rejects octets over 255 and leading zeros
        except ValueError:
            return None
        if self.config.public_ips_only and not _public_ipv4(addr):
            return None
        before = m.string[max(0, m.start() - _VERSION_CONTEXT_CHARS) : m.start()]
        if _VERSION_CONTEXT.search(before):
            return None
        return PLACEHOLDERS["ip_address"]

    @staticmethod
    def _redact_phones(text: str, hits: dict[str, int]) -> str:
        def international(m: re.Match[str]) -> str | None:
            n = sum(c.isdigit() for c in m.group(0))
            return PLACEHOLDERS["phone"] if MIN_PHONE_DIGITS <= n <= MAX_PHONE_DIGITS else None

        if "+" in text:
            text = _substitute(_PHONE_INTERNATIONAL, text, international, hits, "phone")
        if "(" in text:
            text = _substitute(_PHONE_PARENTHESES, text, lambda m: PLACEHOLDERS["phone"] if m["area"][0] not in "01" else None, hits, "phone")
        return text


_PLACEHOLDER = re.compile("<(?:" + "|".join(p[1:-1] for p in PLACEHOLDERS.values()) + ")>")


def _touches_placeholder(text: str) -> bool:
    """Whether a placeholder is glued to a character that a match can end with (before it) or start with (after it)."""
    for m in _PLACEHOLDER.finditer(text):
        before, after = text[m.start() - 1 : m.start()], text[m.end() : m.end() + 1]
        if (before and (before.isalnum() or before in "_:/+-")) or (after and (after.isalnum() or after in "_%+(:-")):
            return True
    return False


def _card(found: str, grouped_by_four: bool) -> str | None:
    """The replacement for a card-shaped number: a placeholder when it passes Luhn, else None."""
    if found[0] not in _CARD_FIRST_DIGITS:
        return None
    digits = found.replace(" ", "").replace("-", "")
    if luhn_valid(digits):
        return PLACEHOLDERS["credit_card"]
    # "4111 1111 1111 1111 123": the trailing group may be the next number rather than the card's.
    if grouped_by_four and len(digits) > 16 and luhn_valid(digits[:16]):
        return PLACEHOLDERS["credit_card"] + found[19:]
    return None


def _substitute(pattern: re.Pattern[str], text: str, decide: Callable[[re.Match[str]], str | None], hits: dict[str, int] | None, kind: str) -> str:
    """`pattern.sub` where `decide` returns the replacement or None to keep the match; counts into `hits[kind]`."""

    def replace(m: re.Match[str]) -> str:
        out = decide(m)
        if out is None:
            return m.group(0)
        if hits is not None:
            hits[kind] += 1
        return out

    return pattern.sub(replace, text)
