"""One scan for every digit-led shape: IPv4 addresses, card numbers, SSNs, North American phones, and
for a document whose language names regions that write numbers without a trunk 0, grouped national numbers.

The shapes never overlap, so one scan that stops only at digits serves them all (one pass instead
of four: 4x faster on digit-heavy changelogs). Each shape lives with its detector (IPV4_SHAPE,
CARD_SHAPE, SSN_SHAPE, NANP_SHAPE, GROUPED_SHAPE) and carries its own guard on the character before
the first digit, which the scan's leading `\\d` consumes so the engine can skip to digits; its named
group says which shape matched (the group names are distinct across shapes). The detector decides.
Not handled here: digit-led shapes that need context beyond a match, which their detectors scan in
passes of their own (IPv6 addresses, international and national phone numbers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from kiln.curate.steps.pii.cards import CARD_SHAPE, card_replacement
from kiln.curate.steps.pii.ip_addresses import IPV4_SHAPE, IPAddresses
from kiln.curate.steps.pii.phones import GROUPED_SHAPE, NANP_SHAPE, north_american
from kiln.curate.steps.pii.placeholders import PLACEHOLDERS, substitute
from kiln.curate.steps.pii.ssns import SSN_SHAPE, is_ssn

# In this order in the scan's alternation (the order the shapes were always tried in).
SHAPES = {"ip_address": IPV4_SHAPE, "credit_card": CARD_SHAPE, "ssn": SSN_SHAPE, "phone": NANP_SHAPE}


class NumberScan:
    """The digit scan for `kinds` (names of SHAPES); `ips` judges IPv4 candidates, `grouped` (when given, with
    phones among the kinds) the grouped national numbers, and North American shapes that are no North
    American number (kiln.curate.steps.pii.phones.Phones.grouped)."""

    def __init__(
        self, kinds: Collection[str], ips: IPAddresses, grouped: Callable[[re.Match[str]], bool] | None = None
    ):
        self._kinds = [kind for kind in SHAPES if kind in kinds]
        self._grouped = grouped if "phone" in self._kinds else None
        shapes = [SHAPES[kind] for kind in self._kinds] + ([GROUPED_SHAPE] if self._grouped else [])
        self._shapes = self._kinds + (["grouped"] if self._grouped else [])  # the named groups, in scan order
        # Every shape goes on for at least four digits, dots, spaces, dashes or a parenthesis after its
        # first digit: the lookahead turns most digits of prose and code away before any alternative
        # is tried (21 -> 15 ms per MB on /usr/share/doc text and code, the same matches). The grouped
        # shape comes last: a number of an earlier shape is never read as one.
        self._pattern = re.compile(r"\d(?=[\d. (-]{4})(?:" + "|".join(shapes) + ")")
        self._ips = ips

    def redact(self, text: str, hits: dict[str, int]) -> str:
        """The text with each number its detector accepts replaced by that kind's placeholder."""

        def number(m: re.Match[str]) -> str | None:
            shape = next(k for k in self._shapes if m.group(k) is not None)
            out = self._replacement(shape, m)
            if out is not None:
                hits["phone" if shape == "grouped" else shape] += 1
            return out

        return substitute(self._pattern, text, number, None, "")

    def _replacement(self, kind: str, m: re.Match[str]) -> str | None:
        """What the detector of `kind` (or of phones, for `grouped`) puts in place of the match, or None to keep it."""
        if kind == "grouped":
            assert self._grouped is not None
            return PLACEHOLDERS["phone"] if self._grouped(m) else None
        if kind == "ip_address":
            return PLACEHOLDERS[kind] if self._ips.ipv4_redactable(m) else None
        if kind == "credit_card":
            return card_replacement(m.group(0), m.group("s1") is not None)
        if kind == "ssn":
            return PLACEHOLDERS[kind] if is_ssn(m.group(0)) else None
        if north_american(m) or (self._grouped is not None and self._grouped(m)):
            return PLACEHOLDERS[kind]
        return None
