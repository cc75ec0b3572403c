"""Email addresses: a local part, `@`, and a dotted domain with a letter TLD.

An address is redacted unless its domain is reserved for documentation (example.com, .example,
.test, .invalid) or names a local network (.local, .internal, .lan, ...), its TLD is a file
extension (`icon@2x.png` is an image name), or it is an SCP-style remote (`git@host:path`).
Not handled here: addresses split by markup (`john&#64;example.com`, `john [at] example.com`),
quoted local parts (`"john smith"@mail.org`), IP-literal domains (`user@[192.0.2.1]`).
"""

from __future__ import annotations

import re

from kiln.curate.steps.pii.placeholders import PLACEHOLDERS

# Found from the `@` (a literal the engine finds at memory speed) outwards. Domain: dot-separated
# labels and a letter TLD of 2+ characters, so `user@localhost` and `a@b` stay. Local part, matched
# backwards on the 66 characters before the `@`: the practical set (letters, digits, . _ % + -),
# starting at the start of its run, at most 64 characters (RFC 5321).
_EMAIL_DOMAIN = re.compile(r"@(?P<domain>(?:[^\W_][\w-]{0,62}\.)+[^\W\d_]{2,63})(?![\w-])")
_EMAIL_LOCAL = re.compile(r"(?<![\w.%+-])[\w%+-][\w.%+-]{0,63}\Z")
_EMAIL_LOCAL_WINDOW = 66
# `icon@2x.png` is an image name, not an address.
_FILE_EXTENSION_TLDS = frozenset(
    {"png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "avif", "css", "js", "ts", "min"}
)
# RFC 2606 reserves these for documentation: addresses there belong to no one.
_RESERVED_DOMAINS = ("example.com", "example.org", "example.net")
# ... and these name hosts on a local network, which no outside mail reaches (RFC 6762, 8375, ICANN).
_RESERVED_TLDS = frozenset(
    {
        "example",
        "test",
        "invalid",
        "localhost",
        "local",
        "localdomain",
        "lan",
        "home",
        "internal",
        "intranet",
        "corp",
        "private",
        "arpa",
    }
)
_RESERVED_SUFFIXES = tuple("." + d for d in _RESERVED_DOMAINS)


def redact_emails(text: str, hits: dict[str, int]) -> str:
    """The text with each email address, not reserved or local, replaced by <EMAIL>."""
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
        if tld in _FILE_EXTENSION_TLDS or tld in _RESERVED_TLDS:
            continue
        if domain in _RESERVED_DOMAINS or domain.endswith(_RESERVED_SUFFIXES):
            continue
        if text[m.end() : m.end() + 1] == ":" and text[m.end() + 1 : m.end() + 2] not in ("", " ", "\t", "\n"):
            continue  # an SCP-style remote, git@github.com:org/repo.git
        out += (text[pos : local.start()], PLACEHOLDERS["email"])
        pos = m.end()
        hits["email"] += 1
    out.append(text[pos:])
    return "".join(out)
