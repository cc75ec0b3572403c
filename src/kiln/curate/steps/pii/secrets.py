"""Secrets: private-key blocks, API tokens of known formats, random-looking values assigned to secret names.

- private keys: a PEM `-----BEGIN ... PRIVATE KEY-----` block up to its END line, or, truncated,
  the BEGIN line and the base64 and header lines right after it;
- tokens: the formats their issuers document (AWS, GitHub, Slack, Google, Stripe, OpenAI-style
  `sk-`, JWT, GitLab, Hugging Face, npm, PyPI, SendGrid, Slack webhooks, HTTP bearer values);
- assigned values: a value assigned to a name ending in password, secret, token, api_key,
  access_key, private_key, ... that looks random (`random_looking`: 8+ characters with letters and
  digits, varied, not a placeholder, a variable or a call); the name stays, the value goes.
Plain digests (`sha256:...`, git object ids) match none of these.
Not handled here: passwords in prose (`my password is hunter22`), secrets split across lines or
string concatenations, tokens of formats not listed, public keys (left as they are).
"""

from __future__ import annotations

import math
import re

from kiln.curate.steps.pii.placeholders import PLACEHOLDERS, substitute

# A private key may be truncated (no END line) and still leak; then the BEGIN line and the base64 and
# header lines right after it go. An END further than this from its BEGIN is not trusted to close it:
# an RSA-8192 private key is about 6.5 KB of base64.
MAX_PEM_BODY_CHARS = 16_384
_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
_PEM_TRUNCATED_BODY = re.compile(
    r"(?:[ \t\r]*\n[ \t]*(?:[A-Za-z0-9+/]{16,}={0,2}|(?:Proc-Type|DEK-Info|Comment):[^\n]*))*"
)

# Token formats as their issuers document them. Each pattern opens with a literal of two or more
# characters, so the engine finds candidates by a fast substring search (2 GB/s; one `in` test per
# marker had cost 1 ms per MB each); the guard that a token starts where a run of [A-Za-z0-9_-]
# starts is a lookbehind right after that literal.
_TOKEN_END = r"(?![A-Za-z0-9_-])"


def _token(literal: str, rest: str) -> re.Pattern[str]:
    return re.compile(re.escape(literal) + r"(?<![A-Za-z0-9_-]" + re.escape(literal) + ")" + rest + _TOKEN_END)


_TOKENS: tuple[re.Pattern[str], ...] = (
    _token("AKIA", r"[0-9A-Z]{16}"),
    _token("ASIA", r"[0-9A-Z]{16}"),  # AWS access key id (ASIA: temporary)
    _token("gh", r"[pousr]_[A-Za-z0-9]{36}"),  # GitHub classic tokens
    _token("github_pat_", r"[A-Za-z0-9_]{82}"),  # GitHub fine-grained token
    _token("xox", r"[abposr]-[A-Za-z0-9-]{10,250}"),  # Slack tokens
    _token("AIza", r"[0-9A-Za-z_-]{35}"),  # Google API key
    # Stripe secret and restricted keys (pk_ is public)
    _token("sk_", r"(?:live|test)_[0-9A-Za-z]{16,247}"),
    _token("rk_", r"(?:live|test)_[0-9A-Za-z]{16,247}"),
    _token("sk-", r"(?P<sk>[A-Za-z0-9_-]{32,250})"),  # OpenAI / Anthropic style
    # JWT: base64url '{"' header and payload
    _token("eyJ", r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    _token("gl", r"(?:pat|ptt|dt|rt|soat|cbt)-[A-Za-z0-9_-]{20,64}"),  # GitLab tokens
    _token("hf_", r"[A-Za-z0-9]{34}"),  # Hugging Face
    _token("npm_", r"[A-Za-z0-9]{36}"),  # npm
    _token("pypi-AgEIcHlwaS5vcmc", r"[A-Za-z0-9_-]{16,400}"),  # PyPI (a macaroon for pypi.org)
    _token("SG.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}"),  # SendGrid
    _token("GOCSPX-", r"[A-Za-z0-9_-]{28}"),  # Google OAuth client secret
    # Slack webhook
    re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9]{6,20}/B[A-Za-z0-9]{6,20}/[A-Za-z0-9]{16,40}"),
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
# The value is the whole run: a session token runs to 1,000+ characters.
_ASSIGNED_TAIL = re.compile(r"[\"']?[ \t]*(?::=|=>|[:=])[ \t]*[\"']?(?P<value>[^\s\"'`,;<>]{8,})")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Values that stand for a secret rather than being one.
_PLACEHOLDER_WORDS = (
    "your",
    "example",
    "changeme",
    "placeholder",
    "dummy",
    "redacted",
    "xxxx",
    "****",
    "secret_here",
    "token_here",
)
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


def redact_pem(text: str, hits: dict[str, int]) -> str:
    """The text with each private-key block (or truncated block) replaced by <SECRET>."""
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


def redact_tokens(text: str, hits: dict[str, int]) -> str:
    """The text with each token of a known format replaced by <SECRET> (a bearer header keeps its name)."""

    def token(m: re.Match[str]) -> str | None:
        key = m.groupdict().get("sk")
        # subtle: `sk-` also starts kebab-case names (`sk-learn-...`); a real key is random
        # base62, which has upper case, lower case and digits in any 32 characters.
        if key is not None and not all(any(test(c) for c in key) for test in (str.isdigit, str.isupper, str.islower)):
            return None
        value = m.groupdict().get("value")
        if value is not None:  # keep the variable name, replace only the key
            if not random_looking(value):
                return None
            return m.group(0)[: m.start("value") - m.start()] + PLACEHOLDERS["secret"]
        return PLACEHOLDERS["secret"]

    for pattern in _TOKENS:
        text = substitute(pattern, text, token, hits, "secret")
    return text


def redact_assigned(text: str, hits: dict[str, int]) -> str:
    """The text with each random-looking value assigned to a secret name replaced by <SECRET>."""
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
            qualified = name != "key" or low[max(0, at - 9) : at].rstrip("_-").endswith(_KEY_QUALIFIERS)
            if end >= 0 and low[end : end + 1] in _ASSIGNMENT_FIRST and qualified:
                names.append(end)
            at = low.find(name, end if end > at else at + 1)
    out: list[str] = []
    pos = 0
    for end in sorted(set(names)):
        if end < pos:
            continue  # a name inside a value already read: `token:token:...` stays linear
        # subtle: a name ending a value read (`token = get_token()aws_secret_access_key = <value>`) is still read:
        # skipping it left that key's value for a second pass to redact (the step must be idempotent)
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
