"""Phone numbers: `phonenumbers` (libphonenumber's metadata) says the number is valid, or, right after
a phone word (`Phone:`, `mobile`, `tel:`), that it has a possible length whatever its area code.

Four shapes are read: with a `+` country code (`+44 20 7946 0958`, checked for every region); the
North American formats (212-555-0143, 212.555.0143, (212) 555-0143, after a `1` trunk prefix too);
the national formats of `phone_regions` and of the regions the document's language names
(kiln.curate.steps.pii.regions), a trunk 0 and groups (020 7946 0958, (020) 7946 0958); and, for those
of the language's regions that write numbers without a trunk 0 (Spain, Brazil's and China's mobiles,
Russia's trunk 8), such numbers in groups (612 34 56 78, 138 0013 8000, (11) 91234-5678,
8 (495) 123-45-67), which libphonenumber must also format without a trunk 0 (Germany writes
0612 345678, so 612 34 56 78 is no German number). The digit-led North American and grouped shapes
are found by the number scan (kiln.curate.steps.pii.numbers), the rest by this detector's own pass.
A `+` right after an operand (`x)+4155552671`), a row of a table of numbers, a date or a time
(01.02.2024 12:30) and an amount grouped in thousands (1 234 567 890, 612.345.678) are no phone.
Not handled here: numbers without separators or country code (a bare digit run), numbers of fewer than
nine digits (Hong Kong's 2345 6789), digits other than ASCII (full-width, Arabic-Indic), vanity numbers
(1-800-FLOWERS), extensions (`x123` stays), a phone word after the number (`968-909-5111 (cell)`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

import phonenumbers

from kiln.curate.steps.pii.context import CONTEXT_CHARS, after_phone_word
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
# An alternative of the one digit scan, for a document whose language names regions that write numbers
# without a trunk 0: three to six groups of digits split by spaces or dashes (612 34 56 78, 55 1234 5678),
# after Russia's trunk 8 an area in parentheses (8 (495) 123-45-67; (11) 91234-5678 is a form of
# _PHONE_PARENTHESES). Led by a digit other than 0 (a trunk 0 is _NATIONAL_PHONE's); dots are left out:
# they split versions, addresses and thousands. In the scan it costs nothing measurable, as a pass of its
# own it took a fifth of the step's time on the benchmark's code and prose.
GROUPED_SHAPE = (
    r"(?<![\w+.,/:(-]\d)(?P<grouped>(?:(?<=8)[ -]?\([1-9]\d{1,4}\)[ -]?|(?<=[1-9])\d{0,4}[ -])"
    r"\d{2,5}(?:[ -]\d{2,5}){1,4})(?!\w|[.,/-]\d)"
)
# A date or a year first (01.02.2024 12, 2024-01-15 10), or a time right after (12:30): no phone either.
_DATE_FIRST = re.compile(r"\d{1,2}[./-]\d{1,2}[./-](?:19|20)\d\d|(?:19|20)\d\d[ ./-]\d")
_TIME_AFTER = re.compile(r":\d")
# Thousands in groups of three with spaces: an amount (1 234 567 890), unless a phone word says otherwise;
# three groups of three too when a currency or unit stands beside them (123 456 789 zł, € 612 345 678).
# Otherwise those stay candidates: that is how Spain, Portugal, Poland and Czechia write mobiles (612 345 678).
_THOUSANDS = re.compile(r"[1-9]\d?(?: \d{3})+|\d{3}(?: \d{3}){3,}")
_THOUSANDS_ONLY = re.compile(r"\d{3} \d{3} \d{3}")
_AMOUNT_AFTER = re.compile(
    r"[ \t]?(?:[%€$£¥₽₴₺₩]|(?i:z[lł]|k[cč]|kr|eur|usd|pln|czk|руб|грн|lei|ron|ft|m[²2]|km|kg)\b)"
)
_AMOUNT_BEFORE = re.compile(r"[€$£¥₽₴₺₩][ \t]?\Z")
# Digit groups that go on before or after the candidate: a table (octal codes, coordinates), not a number.
_IN_NUMBER_RUN = re.compile(r"[ \t]+\d")  # on the same line: a phone list keeps one number per line
_NUMBER_RUN_BEFORE = re.compile(r"\d[ \t]+\Z")
# ... but three groups of three digits alone on a line, beside a line of digit groups, are a table's row
# (a column of octal codes: 040 101 145 above 133 112 255) even so.
_ALONE_BEFORE = re.compile(r"(?:\A|\n)[ \t]*\Z")
_ALONE_AFTER = re.compile(r"[ \t]*(?:\n|\Z)")
_ROW = r"[ \t]*\d{1,3}(?:[ \t]+\d{1,3})+[ \t]*"
_ROW_BEFORE = re.compile(rf"(?:\A|\n){_ROW}\Z")
_ROW_AFTER = re.compile(rf"{_ROW}(?:\n|\Z)")
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


def written_without_trunk(text: str, region: str, possible: bool = False) -> bool:
    """Whether `text` is a valid (or, with `possible`, a possible) national number of `region`, written as the
    region writes it: the digits of libphonenumber's national format, or those without a leading trunk 8
    (Russia and Kazakhstan write (495) 123-45-67 as often as 8 (495) 123-45-67). 612 34 56 78 is a Spanish
    number; read as German it lacks the trunk 0 of 06123 45678, as Belarusian the 8 0 of 8 061 234-56-78."""
    try:
        number = phonenumbers.parse(text, region)  # once: a parse is most of the cost
    except phonenumbers.NumberParseException:
        return False
    if possible:
        if phonenumbers.is_possible_number_with_reason(number) != phonenumbers.ValidationResult.IS_POSSIBLE:
            return False
    elif not phonenumbers.is_valid_number(number):
        return False
    national = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL)
    written, formatted = "".join(c for c in text if c.isdigit()), "".join(c for c in national if c.isdigit())
    return written in (formatted, formatted.removeprefix("8"))


@functools.cache
def writes_without_trunk(region: str) -> bool:
    """Whether `region` writes some of its numbers without a trunk 0: libphonenumber's national format of its
    example fixed-line or mobile number starts with another digit (Spain's 612 34 56 78, China's mobile
    131 2345 6789, Russia's 8 (301) 123-45-67; not Germany's 030 123456 or Japan's 090-1234-5678)."""
    kinds = (phonenumbers.PhoneNumberType.FIXED_LINE, phonenumbers.PhoneNumberType.MOBILE)
    examples = [phonenumbers.example_number_for_type(region, kind) for kind in kinds]
    national = [phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.NATIONAL) for n in examples if n]
    return any(next((c for c in number if c.isdigit()), "0") != "0" for number in national)


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
    """The phone detector: its own pass (international numbers, the parenthesized area forms, the national
    formats of `regions` (ISO 3166 codes) and of `hinted`, the regions of the document's language), and the
    number scan's decision on the grouped shape (`grouped`, for the `hinted` regions that write numbers
    without a trunk 0: `without_trunk`)."""

    def __init__(self, regions: Iterable[str], hinted: Iterable[str] = ()):
        self._regions = tuple(dict.fromkeys((*regions, *hinted)))
        self.without_trunk = tuple(region for region in hinted if writes_without_trunk(region))

    def redact(self, text: str, hits: dict[str, int]) -> str:
        """The text with each phone number of the pass's shapes replaced by <PHONE>."""
        if "+" in text:
            text = substitute(_PHONE_INTERNATIONAL, text, self._international, hits, "phone")
        if "(" in text:
            text = substitute(_PHONE_PARENTHESES, text, self._parentheses, hits, "phone")
        return substitute(_NATIONAL_PHONE, text, self._national, hits, "phone")

    def grouped(self, m: re.Match[str]) -> bool:
        """Whether digit groups without a trunk 0 (a match of GROUPED_SHAPE, or a North American shape or
        parenthesized area that is no North American number) are a phone of the `without_trunk` regions: valid,
        or possible right after a phone word; never a date, a time, a table's row or an amount."""
        found = m.group(0)
        if not MIN_NATIONAL_DIGITS <= sum(c.isdigit() for c in found) <= MAX_NATIONAL_DIGITS or _not_a_number(m):
            return False
        phone_word = after_phone_word(m.string, m.start())
        if not phone_word and (_THOUSANDS.fullmatch(found) or (_THOUSANDS_ONLY.fullmatch(found) and _amount(m))):
            return False
        modes = (False, True) if phone_word else (False,)
        return any(
            written_without_trunk(found, region, possible) for possible in modes for region in self.without_trunk
        )

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
        if _not_a_number(m):
            return None
        return PLACEHOLDERS["phone"] if self._is_phone(m, north_american=False, national=True) else None

    def _parentheses(self, m: re.Match[str]) -> str | None:
        # (020) 7946 0958 is a national format; any three-digit area (968) 909-5111 has the North American shape.
        national = m["area"][0] == "0"
        if self._is_phone(m, not national or len(m["area"]) == 3, national):
            return PLACEHOLDERS["phone"]
        return PLACEHOLDERS["phone"] if not national and self.without_trunk and self.grouped(m) else None

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


def _amount(m: re.Match[str]) -> bool:
    """Whether a currency sign or a unit stands right before or after the match."""
    return bool(
        _AMOUNT_AFTER.match(m.string, m.end()) or _AMOUNT_BEFORE.search(m.string, max(0, m.start() - 2), m.start())
    )


def _not_a_number(m: re.Match[str]) -> bool:
    """Whether a national candidate is something else by its shape or neighbours: a shape the number scan
    declined (an SSN's 3-2-4, a ZIP+4), a date or time, or a row of a table of numbers."""
    text, found = m.string, m.group(0)
    if _NOT_NATIONAL.fullmatch(found) or _DATE_FIRST.match(found) or _TIME_AFTER.match(text, m.end()):
        return True
    if _THOUSANDS_ONLY.fullmatch(found) and _in_column(m):
        return True
    return bool(
        _IN_NUMBER_RUN.match(text, m.end()) or _NUMBER_RUN_BEFORE.search(text, max(0, m.start() - 8), m.start())
    )


def _in_column(m: re.Match[str]) -> bool:
    """Whether the match is alone on its line and the line before or after it is a row of digit groups. Reads
    at most CONTEXT_CHARS around the match each way (a table's rows are short), so a long line costs no more."""
    text, start, end = m.string, m.start(), m.end()
    before = _ALONE_BEFORE.search(text, max(0, start - CONTEXT_CHARS), start)
    after = _ALONE_AFTER.match(text, end)
    if before is None or after is None:
        return False
    rows = []
    if text.startswith("\n", before.start()):  # the line before, whole within the window
        row = _ROW_BEFORE.search(text, max(0, before.start() - CONTEXT_CHARS), before.start())
        rows.append(row)
    if text.startswith("\n", after.end() - 1):  # the line after
        rows.append(_ROW_AFTER.match(text, after.end()))
    return any(row is not None for row in rows)
