"""Phone numbers: `phonenumbers` (libphonenumber's metadata) says the number is valid, or, right after
a phone word (`Phone:`, `mobile`, `tel:`), that it has a possible length whatever its area code.

Three shapes are read: with a `+` country code (`+44 20 7946 0958`, checked for every region); the
North American formats (212-555-0143, 212.555.0143, (212) 555-0143, after a `1` trunk prefix too;
the dashed and dotted ones are found by the number scan, kiln.curate.steps.pii.numbers); and the
national formats of `phone_regions`, a trunk 0 and groups (020 7946 0958, (020) 7946 0958).
A `+` right after an operand (`x)+4155552671`) and a row of a table of numbers are no phone.
Not handled here: numbers without separators or country code (a bare digit run), vanity numbers
(1-800-FLOWERS), extensions (`x123` stays), a phone word after the number (`968-909-5111 (cell)`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import phonenumbers

from kiln.curate.steps.pii.context import after_phone_word
from kiln.curate.steps.pii.placeholders import PLACEHOLDERS, substitute

# An alternative of the one digit scan (kiln.curate.steps.pii.numbers), led by its first digit:
# 212-555-0143, 212.555.0143, and the same after a `1` trunk prefix; (212) 555-0143 forms are
# found by _PHONE_PARENTHESES.
NANP_SHAPE = (
    r"(?<![\w+.-]\d)(?P<phone>\d\d(?P<sep>[-.])\d{3}(?P=sep)\d{4}"
    r"|(?<=1)[ .-](?:\(\d{3}\) ?\d{3}[-.]|\d{3}(?P<sep2>[-.])\d{3}(?P=sep2))\d{4})(?!\w|[.-]\d)"
)
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


def phone_valid(text: str, region: str | None) -> bool:
    """Whether libphonenumber's metadata has `text` as a valid number (`region`: how to read it without a +
    country code)."""
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


def north_american(m: re.Match[str]) -> bool:
    """Whether a match of NANP_SHAPE is a phone: valid (after a 1 trunk prefix, its last 10 digits), or any
    area right after a phone word."""
    digits = "".join(c for c in m.group(0) if c.isdigit())
    return phone_valid(digits[-10:], "US") or after_phone_word(m.string, m.start())


class Phones:
    """The phone detector's own pass: international numbers, the parenthesized area forms, and the national
    formats of `regions` (ISO 3166 codes)."""

    def __init__(self, regions: Iterable[str]):
        self._regions = tuple(regions)

    def redact(self, text: str, hits: dict[str, int]) -> str:
        """The text with each phone number of these shapes replaced by <PHONE>."""
        if "+" in text:
            text = substitute(_PHONE_INTERNATIONAL, text, self._international, hits, "phone")
        if "(" in text:
            text = substitute(_PHONE_PARENTHESES, text, self._parentheses, hits, "phone")
        return substitute(_NATIONAL_PHONE, text, self._national, hits, "phone")

    @staticmethod
    def _international(m: re.Match[str]) -> str | None:
        found = m.group(0)
        candidate = found
        if candidate.count("(") > candidate.count(")"):  # "(10-18 Uhr)" opens after the number: not part of it
            candidate = candidate[: candidate.rfind("(")].rstrip(" -(")
        number = _longest_number(candidate, phone_valid)
        if number is None and after_phone_word(m.string, m.start()):
            number = _longest_number(candidate, phone_possible)
        return None if number is None else PLACEHOLDERS["phone"] + found[len(number) :]

    def _national(self, m: re.Match[str]) -> str | None:
        text = m.string
        if _NOT_NATIONAL.fullmatch(m.group(0)):
            return None  # a shape declined before
        if _IN_NUMBER_RUN.match(text, m.end()) or _NUMBER_RUN_BEFORE.search(text, max(0, m.start() - 8), m.start()):
            return None  # a row of a table of numbers
        return PLACEHOLDERS["phone"] if self._is_phone(m, north_american=False, national=True) else None

    def _parentheses(self, m: re.Match[str]) -> str | None:
        # (020) 7946 0958 is a national format; any three-digit area (968) 909-5111 has the North American shape.
        national = m["area"][0] == "0"
        return PLACEHOLDERS["phone"] if self._is_phone(m, not national or len(m["area"]) == 3, national) else None

    def _in_regions(self, found: str, check: PhoneCheck) -> bool:
        digits = sum(c.isdigit() for c in found)
        if not MIN_NATIONAL_DIGITS <= digits <= MAX_NATIONAL_DIGITS:
            return False
        return any(check(found, region) for region in self._regions)

    def _is_phone(self, m: re.Match[str], north_american: bool, national: bool) -> bool:
        """Whether a phone-shaped match is a phone: valid, or possible right after a phone word (`Phone: 968-909-5111`),
        read as a North American number, or in the national formats of the regions."""
        found = m.group(0)

        def passes(check: PhoneCheck) -> bool:
            return (north_american and check(found, "US")) or (national and self._in_regions(found, check))

        return passes(phone_valid) or (after_phone_word(m.string, m.start()) and passes(phone_possible))
