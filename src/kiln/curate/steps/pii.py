"""Redact personal data and credentials: emails, phones, IP addresses, card numbers, US SSNs, secrets.

Each hit becomes a typed placeholder (`<EMAIL>`, `<PHONE>`, `<IP_ADDRESS>`, `<CREDIT_CARD>`,
`<SSN>`, `<SECRET>`) and is counted per source as `pii:<type>`. Regexes only propose candidates;
a candidate is redacted once Python confirms it by its validity and its context:
- emails: a dotted domain with a letter TLD; not reserved or local names (example.com, .test,
  .local, .internal, ...), image names (`icon@2x.png`) or SCP-style remotes (`git@host:path`);
- phones: `phonenumbers` (libphonenumber's metadata) says the number is valid: with a `+` country
  code, in the North American formats, or in a national format (trunk 0 and groups) of one of
  `phone_regions`; right after a phone word (`Phone:`, `mobile`, `tel:`), a possible length is
  enough, whatever its area code; a `+` right after an operand (`x)+4155552671`) or a bare digit
  run never is;
- IP addresses: `ipaddress` parses it; by default not the reserved ranges of `keep_ip_ranges`
  (private, loopback, link-local, unspecified, documentation, multicast, other reserved, public
  DNS resolvers), not an IPv4 that the text marks as a version or a number (pii_context: a version
  word, version name or product name before it, a changelog heading, a section word, a Debian
  package header, a revision after it), and not one of more than four parts;
- cards: Luhn, and an issuer's prefix with one of its lengths (Visa, Mastercard, Amex, Discover,
  Diners, JCB, UnionPay, Maestro, Mir);
- SSNs: the SSA's allocation rules, and not the numbers printed in advertising (078-05-1120, ...);
- secrets: token formats as their issuers document them, private-key blocks, and values assigned
  to a name ending in password, secret, token, api_key, access_key, private_key, ... that look
  random (8+ characters with letters and digits, not a placeholder, a variable or a call); plain
  digests (`sha256:...`, git object ids) match none of these.
Every pattern is written so that a match can start only at the beginning of a run of its
characters and every repeat is bounded or unambiguous: no input makes a pass superlinear (the
tests time 1 MB adversarial strings).
Not handled: names, postal addresses, passwords in prose, national ids other than US SSNs, phone
numbers without separators or country code, and text split by markup (`john&#64;example.com`).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import phonenumbers
from pydantic import Field, field_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.pii_context import after_phone_word, ipv4_is_version

IPRange = Literal["private", "loopback", "link_local", "unspecified", "documentation", "multicast", "reserved", "resolvers"]


class PIIConfig(Section):
    enabled: bool = Field(True, description="Run PII redaction.")
    emails: bool = Field(True, description="Replace email addresses with <EMAIL>.")
    phones: bool = Field(True, description="Replace phone numbers that libphonenumber validates (+country code; US (212) 555-0143, 212-555-0143, 212.555.0143; national formats of phone_regions), or of a possible length right after a phone word (Phone:, mobile, tel:), with <PHONE>.")
    phone_regions: list[str] = Field(["GB", "DE", "FR", "IT", "ES", "NL", "AU", "IE", "IN"], description="Regions (ISO 3166 codes) whose national formats, trunk 0 and groups (020 7946 0958), are checked; numbers with a + country code and the North American formats are checked for every region.")
    ip_addresses: bool = Field(True, description="Replace IPv4 and IPv6 addresses with <IP_ADDRESS>.")
    keep_ip_ranges: list[IPRange] = Field(["private", "loopback", "link_local", "unspecified", "documentation", "multicast", "reserved", "resolvers"], description="Address ranges left as they are: private (RFC 1918, 100.64/10, fc00::/7), loopback, link_local (169.254/16, fe80::/10), unspecified (0.0.0.0/8, ::), documentation (192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32), multicast, reserved (any other range not routed on the internet), resolvers (public DNS resolvers such as 8.8.8.8); [] redacts every address.")
    credit_cards: bool = Field(True, description="Replace card numbers (an issuer's prefix and length, passing the Luhn check) with <CREDIT_CARD>.")
    ssns: bool = Field(True, description="Replace US social security numbers written AAA-GG-SSSS that the SSA could have issued with <SSN>.")
    secrets: bool = Field(True, description="Replace API keys and tokens of known formats, PEM private-key blocks and random-looking values assigned to password/secret/token/key names with <SECRET>.")
    max_hits: int | None = Field(None, ge=0, description="Drop a document with more than this many redactions (all types together); None never drops.")

    @field_validator("phone_regions")
    @classmethod
    def _known_regions(cls, regions: list[str]) -> list[str]:
        unknown = [r for r in regions if r not in phonenumbers.SUPPORTED_REGIONS]
        if unknown:
            raise ValueError(f"unknown phone regions {unknown}; use ISO 3166 codes such as GB, DE, FR")
        return regions


# The curate summary shows a few redactions per source and kind, in their redacted form, with this
# many characters around the placeholder (audit/pii_examples.json keeps them with document ids).
EXAMPLES_PER_KIND, EXAMPLE_CONTEXT = 3, 40

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

# Token formats as their issuers document them. Each pattern opens with a literal of two or more
# characters, so the engine finds candidates by a fast substring search (2 GB/s; one `in` test per
# marker had cost 1 ms per MB each); the guard that a token starts where a run of [A-Za-z0-9_-]
# starts is a lookbehind right after that literal.
_TOKEN_END = r"(?![A-Za-z0-9_-])"


def _token(literal: str, rest: str) -> re.Pattern[str]:
    return re.compile(re.escape(literal) + r"(?<![A-Za-z0-9_-]" + re.escape(literal) + ")" + rest + _TOKEN_END)


_TOKENS: tuple[re.Pattern[str], ...] = (
    _token("AKIA", r"[0-9A-Z]{16}"), _token("ASIA", r"[0-9A-Z]{16}"),  # AWS access key id (ASIA: temporary)
    _token("gh", r"[pousr]_[A-Za-z0-9]{36}"),  # GitHub classic tokens
    _token("github_pat_", r"[A-Za-z0-9_]{82}"),  # GitHub fine-grained token
    _token("xox", r"[abposr]-[A-Za-z0-9-]{10,250}"),  # Slack tokens
    _token("AIza", r"[0-9A-Za-z_-]{35}"),  # Google API key
    _token("sk_", r"(?:live|test)_[0-9A-Za-z]{16,247}"), _token("rk_", r"(?:live|test)_[0-9A-Za-z]{16,247}"),  # Stripe secret/restricted (pk_ is public)
    _token("sk-", r"(?P<sk>[A-Za-z0-9_-]{32,250})"),  # OpenAI / Anthropic style
    _token("eyJ", r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT: base64url '{"' header and payload
    _token("gl", r"(?:pat|ptt|dt|rt|soat|cbt)-[A-Za-z0-9_-]{20,64}"),  # GitLab tokens
    _token("hf_", r"[A-Za-z0-9]{34}"),  # Hugging Face
    _token("npm_", r"[A-Za-z0-9]{36}"),  # npm
    _token("pypi-AgEIcHlwaS5vcmc", r"[A-Za-z0-9_-]{16,400}"),  # PyPI (a macaroon for pypi.org)
    _token("SG.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),  # SendGrid
    _token("GOCSPX-", r"[A-Za-z0-9_-]{28}"),  # Google OAuth client secret
    re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9]{6,20}/B[A-Za-z0-9]{6,20}/[A-Za-z0-9]{16,40}"),  # Slack webhook
    # HTTP bearer credentials: the token ends where the header value ends (a space, quote, bracket or
    # line end), so text glued after it, a placeholder included, never makes a shorter token match.
    re.compile(r"earer(?<=[Bb]earer)[ \t]+(?P<value>[A-Za-z0-9._~+/-]{20,}=*)(?=[\s\"'`,;)\]}]|\Z)"),
)

# A value assigned to a name that ends in one of these words (DB_PASSWORD=..., "client_secret": "...",
# apiKey: ...) is a secret when it looks random (random_looking); the name stays, the value goes. The
# names are found with str.find on the lower-cased text (a case-insensitive regex alternation ran at
# 4 MB/s on /usr/share/doc text), the assignment after each by _ASSIGNED_TAIL.
_SECRET_NAMES = ("passw", "pwd", "secret", "token", "credential", "key")  # passw: password, passwd; credential(s)
_KEY_QUALIFIERS = ("api", "access", "secret", "private", "account", "auth")  # api_key, accessKey, ...
_ASSIGNMENT_FIRST = frozenset("\"' \t:=")  # what may follow a name that is assigned to
_ASSIGNED_TAIL = re.compile(r"[\"']?[ \t]*(?::=|=>|[:=])[ \t]*[\"']?(?P<value>[^\s\"'`,;<>]{8,})")  # the whole run: a session token runs to 1,000+
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Values that stand for a secret rather than being one.
_PLACEHOLDER_WORDS = ("your", "example", "changeme", "placeholder", "dummy", "redacted", "xxxx", "****", "secret_here", "token_here")
_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
MIN_SECRET_ENTROPY = 2.5  # bits per character: hunter22 has 2.75, aaaa1111 has 1.0


def random_looking(value: str) -> bool:
    """Whether an assigned value looks like a credential: letters and digits, varied, not a
    placeholder (`<...>`, `${VAR}`, `YOUR_KEY`), a call, an index or a dotted name."""
    if len(value) < 8 or value[0] in "$%{[(" or "(" in value or "[" in value:
        return False
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    lower = value.lower()
    if any(word in lower for word in _PLACEHOLDER_WORDS) or _DOTTED_NAME.fullmatch(value):
        return False
    counts = [value.count(c) for c in set(value)]
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts) >= MIN_SECRET_ENTROPY


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
# ... and these name hosts on a local network, which no outside mail reaches (RFC 6762, 8375, ICANN).
_RESERVED_TLDS = frozenset({"example", "test", "invalid", "localhost", "local", "localdomain", "lan", "home", "internal", "intranet", "corp", "private", "arpa"})
_RESERVED_SUFFIXES = tuple("." + d for d in _RESERVED_DOMAINS)

# --- IP addresses ---------------------------------------------------------------------------------

# A candidate has two colons among its first groups; `ipaddress` decides. Bounded to the 45
# characters of the longest textual IPv6 address (with an embedded IPv4 tail).
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4})?:(?:[0-9A-Fa-f]{1,4})?:[0-9A-Fa-f:]{0,36}(?:\.\d{1,3}){0,3}(?![\w:]|\.\d)")
_IPV6_HINT = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6_RUN = re.compile(r"[0-9A-Fa-f:.]*")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
# Public resolvers: printed in every networking tutorial, they identify no person.
_WELL_KNOWN_IPS = frozenset({
    "8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "9.9.9.9", "149.112.112.112", "208.67.222.222", "208.67.220.220",
    "2001:4860:4860::8888", "2001:4860:4860::8844", "2606:4700:4700::1111", "2606:4700:4700::1001", "2620:fe::fe", "2620:fe::9",
})
_IP_RANGES: dict[str, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {
    kind: [ipaddress.ip_network(n) for n in nets] for kind, nets in {
        "private": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"],  # RFC 1918, 6598, 4193
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


# --- numbers: IPv4, card numbers, SSNs, phones -----------------------------------------------------

# These shapes never overlap, so one scan that stops only at digits serves them all (one pass
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
    # 212-555-0143, 212.555.0143, and the same after a `1` trunk prefix; (212) 555-0143 forms are
    # found by _PHONE_PARENTHESES.
    "phone": (
        r"(?<![\w+.-]\d)(?P<phone>\d\d(?P<sep>[-.])\d{3}(?P=sep)\d{4}"
        r"|(?<=1)[ .-](?:\(\d{3}\) ?\d{3}[-.]|\d{3}(?P<sep2>[-.])\d{3}(?P=sep2))\d{4})(?!\w|[.-]\d)"
    ),
}
# A national number: trunk 0, an area code, then groups (020 7946 0958, 030 901820, 01 42 68 53 00).
# Its own pass after the number shapes (led by a literal 0 it scans at 700 MB/s; as a fifth shape it
# slowed that pass by a third); what those shapes declined is excluded by shape here: an SSN's
# 3-2-4 (000-12-3456) and a US ZIP+4 (02110-1301).
_NATIONAL_PHONE = re.compile(r"0(?<![\w+.,/-]0)\d{1,4}(?:[ /.-]\d{2,8}){1,4}(?!\w|[.,/-]\d)")
_NOT_NATIONAL = re.compile(r"\d{3}-\d{2}-\d{4}|\d{5}-\d{4}")
# Digit groups that go on before or after the candidate: a table (octal codes, coordinates), not a number.
_IN_NUMBER_RUN = re.compile(r"[ \t]+\d")  # on the same line: a phone list keeps one number per line
_NUMBER_RUN_BEFORE = re.compile(r"\d[ \t]+\Z")
_PHONE_PARENTHESES = re.compile(r"\((?<![\w+.-]\()(?P<area>\d{2,5})\) ?\d{2,4}(?:[ .-]?\d{2,4}){1,3}(?!\w|[.-]\d)")
MIN_NATIONAL_DIGITS, MAX_NATIONAL_DIGITS = 9, 12
# E.164: country code and number together have at most 15 digits; fewer than 8 is not a full number.
MIN_PHONE_DIGITS, MAX_PHONE_DIGITS = 8, 15
# One digit per repeat (with an optional separator or parenthesis around it) leaves the engine a
# single way to split the digits, so a long digit run cannot make it backtrack exponentially. A `+`
# right after an operand (`(x)+4155552671`, `a+1`) is arithmetic.
_PHONE_INTERNATIONAL = re.compile(r"\+(?<![\w+)\]]\+)[1-9]\d{0,2}(?:[ -]?\(?\d\)?){5,14}(?!\w|[.,]\d)")

# Issuer identification numbers and the lengths each issuer uses (ISO/IEC 7812; the networks'
# published ranges): (first digits from, to) -> lengths. A number outside them is an order, an
# IMEI, an ISBN or a timestamp, whatever its Luhn check says.
_CARD_ISSUERS: tuple[tuple[int, int, frozenset[int]], ...] = tuple(
    (low, high, frozenset(lengths)) for low, high, lengths in (
        (4, 4, (13, 16, 19)),  # Visa
        (51, 55, (16,)), (2221, 2720, (16,)),  # Mastercard
        (34, 34, (15,)), (37, 37, (15,)),  # American Express
        (6011, 6011, range(16, 20)), (644, 649, range(16, 20)), (65, 65, range(16, 20)),  # Discover
        (300, 305, range(14, 20)), (3095, 3095, range(14, 20)), (36, 36, range(14, 20)), (38, 39, range(14, 20)),  # Diners Club
        (3528, 3589, range(16, 20)),  # JCB
        (62, 62, range(16, 20)),  # UnionPay
        (5018, 5018, range(12, 20)), (5020, 5020, range(12, 20)), (5038, 5038, range(12, 20)), (5893, 5893, range(12, 20)),
        (6304, 6304, range(12, 20)), (6759, 6759, range(12, 20)), (6761, 6763, range(12, 20)),  # Maestro
        (2200, 2204, range(16, 20)),  # Mir
    )
)
# Printed in advertising and on sample cards, used by thousands, belonging to no one (SSA).
_PUBLISHED_SSNS = frozenset({"078-05-1120", "219-09-9999", "123-45-6789"})


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


def card_issued(digits: str) -> bool:
    """Whether an issuer uses this number's prefix with this length."""
    return any(low <= int(digits[: len(str(low))]) <= high and len(digits) in lengths for low, high, lengths in _CARD_ISSUERS)


def ssn_valid(area: str, group: str, serial: str) -> bool:
    """Whether AAA-GG-SSSS could have been issued: the SSA never assigns area 000, 666 or 900-999,
    group 00 or serial 0000 (SSA, "Social Security Number Randomization", 2011)."""
    return area != "000" and area != "666" and area[0] != "9" and group != "00" and serial != "0000"


def phone_valid(text: str, region: str | None) -> bool:
    """Whether libphonenumber's metadata has `text` as a valid number (`region`: how to read it without a + country code)."""
    try:
        return phonenumbers.is_valid_number(phonenumbers.parse(text, region))
    except phonenumbers.NumberParseException:
        return False


def phone_possible(text: str, region: str | None) -> bool:
    """Whether `text` has a length that its country's numbers have (libphonenumber's possible lengths), whatever
    its area code or range: enough right after a phone word, where a number is a phone even in an unassigned area."""
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return False
    # IS_POSSIBLE_LOCAL_ONLY is a number without its area code (555-0143): not a whole number.
    return phonenumbers.is_possible_number_with_reason(number) == phonenumbers.ValidationResult.IS_POSSIBLE


PhoneCheck = Callable[[str, str | None], bool]


def _longest_number(candidate: str, check: PhoneCheck) -> str | None:
    """The longest prefix of an international candidate that `check` accepts: "+44 20 7946 0958 (24/7 line)" is
    matched up to "(24"; digits that follow a number are not its own."""
    while sum(c.isdigit() for c in candidate) >= MIN_PHONE_DIGITS:
        if sum(c.isdigit() for c in candidate) <= MAX_PHONE_DIGITS and check(candidate, None):
            return candidate
        cut = max(candidate.rfind(" "), candidate.rfind("-"), candidate.rfind("("))
        if cut <= 0:
            return None
        candidate = candidate[:cut].rstrip(" -(")
    return None


class RedactPII:
    """The `pii` step: redact what the config enables, count hits per type, drop documents over `max_hits`."""

    name = "pii"

    def __init__(self, config: PIIConfig):
        self.config = config
        self._keep_ranges = frozenset(config.keep_ip_ranges)
        enabled = {"ip_address": config.ip_addresses, "credit_card": config.credit_cards, "ssn": config.ssns, "phone": config.phones}
        shapes = [shape for kind, shape in _NUMBER_SHAPES.items() if enabled[kind]]
        # Every shape goes on for at least four digits, dots, spaces, dashes or a parenthesis after its
        # first digit: the lookahead turns most digits of prose and code away before any alternative
        # is tried (21 -> 15 ms per MB on /usr/share/doc text and code, the same matches).
        self._numbers = re.compile(r"\d(?=[\d. (-]{4})(?:" + "|".join(shapes) + ")") if shapes else None
        # Order: key blocks and tokens first, so their base64 is never read as numbers or emails;
        # IPv6 before the number pass (an IPv6 address can end in an IPv4 one).
        passes: list[Callable[[str, dict[str, int]], str]] = []
        if config.secrets:
            passes += [self._redact_pem, self._redact_tokens, self._redact_assigned]
        if config.emails:
            passes.append(self._redact_emails)
        if config.ip_addresses:
            passes.append(self._redact_ipv6)
        if self._numbers is not None:
            passes.append(self._redact_numbers)
        if config.phones:
            passes.append(self._redact_phones)
        self._passes = passes
        self._phone_regions = tuple(config.phone_regions)
        self._examples: dict[tuple[str, str], int] = {}  # (source, kind) -> examples recorded

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        """The text with every enabled kind of PII replaced, and the number of hits per kind."""
        hits = dict.fromkeys(PLACEHOLDERS, 0)
        # subtle: a placeholder changes what its neighbours see: in "+44 20 7946 0958+44 20 7946
        # 0958" the second number follows a digit and is no phone, but once the first is <PHONE> it
        # follows ">" and is one; a value assigned to a secret name now ends at its "<". So another
        # round runs while a new placeholder touches a character a match could start or end with;
        # the output is then a fixed point (redacting it again changes nothing). Rounds end because
        # placeholders never match. (A round after every hit cost a third of the speed: most
        # placeholders sit between spaces or in <...>.)
        while True:
            found = dict.fromkeys(PLACEHOLDERS, 0)
            for redact in self._passes:
                text = redact(text, found)
            for kind, n in found.items():
                hits[kind] += n
            if not any(found.values()) or not _touches_placeholder(text, self.config.secrets):
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
                    self._offer_example(doc, kind, text, ledger)
            yield doc.with_text(text) if total else doc

    def _offer_example(self, doc: Document, kind: str, redacted: str, ledger: Ledger) -> None:
        """Record the redacted text around this kind's first placeholder, for the first few documents per source and kind (per worker)."""
        key = (doc.source, kind)
        if self._examples.get(key, 0) >= EXAMPLES_PER_KIND:
            return
        self._examples[key] = self._examples.get(key, 0) + 1
        at = redacted.find(PLACEHOLDERS[kind])
        end = at + len(PLACEHOLDERS[kind])
        snippet = redacted[max(0, at - EXAMPLE_CONTEXT) : end + EXAMPLE_CONTEXT]
        ledger.record("pii_example", {"source": doc.source, "kind": kind, "id": doc.id, "text": " ".join(snippet.split())})

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
                if not random_looking(value):
                    return None
                return m.group(0)[: m.start("value") - m.start()] + PLACEHOLDERS["secret"]
            return PLACEHOLDERS["secret"]

        for pattern in _TOKENS:
            text = _substitute(pattern, text, token, hits, "secret")
        return text

    @staticmethod
    def _redact_assigned(text: str, hits: dict[str, int]) -> str:
        # subtle: str.lower() may lengthen a non-ASCII text (İ becomes two characters), which would
        # shift every offset; then A-Z alone are lowered (translate: 10 MB/s, lower: 400).
        low = text.lower()
        if len(low) != len(text):
            low = text.translate(_ASCII_LOWER)
        names: list[int] = []  # where an assignment may follow
        for name in _SECRET_NAMES:
            at = low.find(name)
            while at >= 0:
                end = at + len(name)
                if name == "passw":
                    end = at + 8 if low.startswith("password", at) else at + 6 if low.startswith("passwd", at) else -1
                elif name == "credential" and low.startswith("s", end):
                    end += 1
                # The cheap test first: most hits ("keyword", "tokenize") are not followed by an assignment.
                if end >= 0 and low[end : end + 1] in _ASSIGNMENT_FIRST and (name != "key" or low[max(0, at - 9) : at].rstrip("_-").endswith(_KEY_QUALIFIERS)):
                    names.append(end)
                at = low.find(name, end if end > at else at + 1)
        out: list[str] = []
        pos = 0
        for end in sorted(set(names)):
            if end <= pos:
                continue  # a name inside (or ending) a value already read: `token:token:...` stays linear
            m = _ASSIGNED_TAIL.match(text, end)
            if m is None:
                continue
            if random_looking(m["value"]):
                out += (text[pos : m.start("value")], PLACEHOLDERS["secret"])
                hits["secret"] += 1
            else:
                out.append(text[pos : m.start("value")] + m["value"])
            pos = m.end("value")
        out.append(text[pos:])
        return "".join(out)

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
            if text[m.end() : m.end() + 1] == ":" and text[m.end() + 1 : m.end() + 2] not in ("", " ", "\t", "\n"):
                continue  # an SCP-style remote, git@github.com:org/repo.git
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
        mapped = addr.ipv4_mapped
        return self._redactable_ip(mapped if mapped is not None else addr)

    def _redactable_ip(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        kind = ip_range(addr)
        return kind is None or kind not in self._keep_ranges

    def _redact_numbers(self, text: str, hits: dict[str, int]) -> str:
        assert self._numbers is not None

        def number(m: re.Match[str]) -> str | None:
            found = m.group(0)
            groups = m.groupdict()
            kind = next(k for k in _NUMBER_SHAPES if groups.get(k) is not None)
            if kind == "ip_address":
                ok = self._ipv4(m)
            elif kind == "credit_card":
                replacement = _card(found, m.group("s1") is not None)
                if replacement is not None:
                    hits[kind] += 1
                return replacement
            elif kind == "ssn":
                ok = ssn_valid(found[0:3], found[4:6], found[7:11]) and found not in _PUBLISHED_SSNS
            else:
                # after a 1 trunk prefix, its last 10 digits; a phone word before it makes any area do
                digits = "".join(c for c in found if c.isdigit())
                ok = phone_valid(digits[-10:], "US") or after_phone_word(m.string, m.start())
            if not ok:
                return None
            hits[kind] += 1
            return PLACEHOLDERS[kind]

        return _substitute(self._numbers, text, number, None, "")

    def _ipv4(self, m: re.Match[str]) -> bool:
        try:
            addr = ipaddress.IPv4Address(m.group(0))  # rejects octets over 255 and leading zeros
        except ValueError:
            return False
        if not self._redactable_ip(addr):
            return False
        return not ipv4_is_version(m.string, m.start(), m.end())

    def _national_phone(self, found: str, check: PhoneCheck = phone_valid) -> bool:
        digits = sum(c.isdigit() for c in found)
        return MIN_NATIONAL_DIGITS <= digits <= MAX_NATIONAL_DIGITS and any(check(found, region) for region in self._phone_regions)

    def _phone(self, m: re.Match[str], north_american: bool, national: bool) -> bool:
        """Whether a phone-shaped match is a phone: valid, or possible right after a phone word (`Phone: 968-909-5111`),
        read as a North American number, or in the national formats of phone_regions."""
        found = m.group(0)

        def passes(check: PhoneCheck) -> bool:
            return (north_american and check(found, "US")) or (national and self._national_phone(found, check))

        return passes(phone_valid) or (after_phone_word(m.string, m.start()) and passes(phone_possible))

    def _redact_phones(self, text: str, hits: dict[str, int]) -> str:
        def international(m: re.Match[str]) -> str | None:
            found = m.group(0)
            candidate = found
            if candidate.count("(") > candidate.count(")"):  # "(10-18 Uhr)" opens after the number: not part of it
                candidate = candidate[: candidate.rfind("(")].rstrip(" -(")
            number = _longest_number(candidate, phone_valid)
            if number is None and after_phone_word(m.string, m.start()):
                number = _longest_number(candidate, phone_possible)
            return None if number is None else PLACEHOLDERS["phone"] + found[len(number) :]

        def national(m: re.Match[str]) -> str | None:
            text = m.string
            if _NOT_NATIONAL.fullmatch(m.group(0)) or _IN_NUMBER_RUN.match(text, m.end()) or _NUMBER_RUN_BEFORE.search(text, max(0, m.start() - 8), m.start()):
                return None  # a shape declined before, or a row of a table of numbers
            return PLACEHOLDERS["phone"] if self._phone(m, north_american=False, national=True) else None

        def parentheses(m: re.Match[str]) -> str | None:
            # (020) 7946 0958 is a national format; any three-digit area (968) 909-5111 has the North American shape.
            national = m["area"][0] == "0"
            return PLACEHOLDERS["phone"] if self._phone(m, not national or len(m["area"]) == 3, national) else None

        if "+" in text:
            text = _substitute(_PHONE_INTERNATIONAL, text, international, hits, "phone")
        if "(" in text:
            text = _substitute(_PHONE_PARENTHESES, text, parentheses, hits, "phone")
        return _substitute(_NATIONAL_PHONE, text, national, hits, "phone")


_PLACEHOLDER = re.compile("<(?:" + "|".join(p[1:-1] for p in PLACEHOLDERS.values()) + ")>")
# What ends a value assigned to a secret name, or makes random_looking refuse it either way.
_VALUE_EDGE = frozenset(" \t\n\r\f\v\"'`,;<>([")


def _touches_placeholder(text: str, secrets: bool) -> bool:
    """Whether a placeholder is glued to a character that a match can end with (before it) or
    start with (after it), or that a context rule reads (`=` after it: `x==1.2.3.4` pins a version,
    `<PHONE>==1.2.3.4` does not); with secrets, also any character an assigned value can hold."""
    for m in _PLACEHOLDER.finditer(text):
        before, after = text[m.start() - 1 : m.start()], text[m.end() : m.end() + 1]
        if after and (after.isalnum() or after in "_%+(:-="):
            return True
        if before and (before.isalnum() or before in "_:/+-" or (secrets and before not in _VALUE_EDGE and not before.isspace())):
            return True
    return False


def _card(found: str, grouped_by_four: bool) -> str | None:
    """The replacement for a card-shaped number: a placeholder when an issuer uses its prefix and
    length and it passes Luhn, else None."""
    digits = found.replace(" ", "").replace("-", "")
    if card_issued(digits) and luhn_valid(digits):
        return PLACEHOLDERS["credit_card"]
    # "4111 1111 1111 1111 123": the trailing group may be the next number rather than the card's.
    if grouped_by_four and len(digits) > 16 and card_issued(digits[:16]) and luhn_valid(digits[:16]):
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
