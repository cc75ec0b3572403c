"""The typed placeholders that replace personal data, and how a detector's pass puts them into text.

A pass proposes candidates with a regex and decides each one in Python (`substitute`), counting its
hits per kind. `touches_placeholder` says when a new placeholder sits where a neighbouring match
could now start, end or read its context, so the step runs another round over the text
(kiln.curate.steps.pii.step).
Not handled here: what any kind of personal data is (one module per detector); placeholders that
keep the original's length, format or a hash of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

PLACEHOLDERS = {
    "email": "<EMAIL>",
    "phone": "<PHONE>",
    "ip_address": "<IP_ADDRESS>",
    "credit_card": "<CREDIT_CARD>",
    "ssn": "<SSN>",
    "secret": "<SECRET>",
}

_PLACEHOLDER = re.compile("<(?:" + "|".join(p[1:-1] for p in PLACEHOLDERS.values()) + ")>")
# What ends a value assigned to a secret name, or makes random_looking refuse it either way.
_VALUE_EDGE = frozenset(" \t\n\r\f\v\"'`,;<>([")


def touches_placeholder(text: str, secrets: bool) -> bool:
    """Whether a placeholder is glued to a character that a match can end with (before it) or
    start with (after it), or that a context rule reads (`=` after it: `x==1.2.3.4` pins a version,
    `<PHONE>==1.2.3.4` does not); with secrets, also any character an assigned value can hold."""
    for m in _PLACEHOLDER.finditer(text):
        before, after = text[m.start() - 1 : m.start()], text[m.end() : m.end() + 1]
        if after and (after.isalnum() or after in "_%+(:-="):
            return True
        if before and (before.isalnum() or before in "_:/+-"):
            return True
        if before and secrets and before not in _VALUE_EDGE and not before.isspace():
            return True
    return False


def substitute(
    pattern: re.Pattern[str],
    text: str,
    decide: Callable[[re.Match[str]], str | None],
    hits: dict[str, int] | None,
    kind: str,
) -> str:
    """`pattern.sub` where `decide` returns the replacement or None to keep the match; counts into `hits[kind]`."""

    def replace(m: re.Match[str]) -> str:
        out = decide(m)
        if out is None:
            return m.group(0)
        if hits is not None:
            hits[kind] += 1
        return out

    return pattern.sub(replace, text)
