"""Payment card numbers: an issuer's prefix with one of its lengths, and the Luhn check.

Issuers: Visa, Mastercard, American Express, Discover, Diners Club, JCB, UnionPay, Maestro, Mir.
Not handled here: groupings other than unseparated, 4-4-4-4(-3) and 4-6-5/4-6-4; numbers glued
to a path, decimal point or other digits; issuers not listed.
"""

from __future__ import annotations

from kiln.curate.steps.pii.placeholders import PLACEHOLDERS

# An alternative of the one digit scan (kiln.curate.steps.pii.numbers), led by its first digit:
# Unseparated 13-19 digits, or the printed groupings 4-4-4-4(-3) and 4-6-5 (Amex) / 4-6-4
# (Diners), one separator throughout; digits glued to a path, decimal point or other digits are
# something else.
CARD_SHAPE = (
    r"(?<![\w.,/:#@+-]\d)(?P<credit_card>\d{12,18}"
    r"|\d{3}(?P<s1>[ -])\d{4}(?P=s1)\d{4}(?P=s1)\d{4}(?:(?P=s1)\d{3})?"
    r"|\d{3}(?P<s2>[ -])\d{6}(?P=s2)\d{4,5})(?!\w|[.,]\d)"
)

# Issuer identification numbers and the lengths each issuer uses (ISO/IEC 7812; the networks'
# published ranges): (first digits from, to) -> lengths. A number outside them is an order, an
# IMEI, an ISBN or a timestamp, whatever its Luhn check says.
_CARD_ISSUERS: tuple[tuple[int, int, frozenset[int]], ...] = tuple(
    (low, high, frozenset(lengths))
    for low, high, lengths in (
        (4, 4, (13, 16, 19)),  # Visa
        (51, 55, (16,)),
        (2221, 2720, (16,)),  # Mastercard
        (34, 34, (15,)),
        (37, 37, (15,)),  # American Express
        (6011, 6011, range(16, 20)),
        (644, 649, range(16, 20)),
        (65, 65, range(16, 20)),  # Discover
        (300, 305, range(14, 20)),
        (3095, 3095, range(14, 20)),  # Diners Club
        (36, 36, range(14, 20)),
        (38, 39, range(14, 20)),  # Diners Club
        (3528, 3589, range(16, 20)),  # JCB
        (62, 62, range(16, 20)),  # UnionPay
        (5018, 5018, range(12, 20)),
        (5020, 5020, range(12, 20)),
        (5038, 5038, range(12, 20)),  # Maestro
        (5893, 5893, range(12, 20)),
        (6304, 6304, range(12, 20)),
        (6759, 6759, range(12, 20)),  # Maestro
        (6761, 6763, range(12, 20)),  # Maestro
        (2200, 2204, range(16, 20)),  # Mir
    )
)


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
    return any(
        low <= int(digits[: len(str(low))]) <= high and len(digits) in lengths for low, high, lengths in _CARD_ISSUERS
    )


def card_replacement(found: str, grouped_by_four: bool) -> str | None:
    """The replacement for a card-shaped number: a placeholder when an issuer uses its prefix and
    length and it passes Luhn, else None."""
    digits = found.replace(" ", "").replace("-", "")
    if card_issued(digits) and luhn_valid(digits):
        return PLACEHOLDERS["credit_card"]
    # "4111 1111 1111 1111 123": the trailing group may be the next number rather than the card's.
    if grouped_by_four and len(digits) > 16 and card_issued(digits[:16]) and luhn_valid(digits[:16]):
        return PLACEHOLDERS["credit_card"] + found[19:]
    return None
