"""Redact personal data and credentials: emails, phones, IP addresses, card numbers, US SSNs, secrets.

The `pii` step (step.py: RedactPII and PIIConfig) runs one detector per kind, each in a module of
its own: secrets (private keys, tokens, values assigned to secret names), emails, ip_addresses,
cards, ssns, phones, and numbers, the one digit scan that finds the IPv4, card, SSN and North
American phone shapes for their detectors; context.py holds what the text around a number says
(a version, a section, a phone word, in many languages), regions.py the phone regions a document's
language names. Regexes only propose candidates; a candidate is redacted once Python
confirms it by its validity and its context. Every pattern is written so that a match can start
only at the beginning of a run of its characters and every repeat is bounded or unambiguous: no
input makes a pass superlinear (the tests time 1 MB adversarial strings).
Not handled: names, postal addresses, passwords in prose, national ids other than US SSNs, phone
numbers without separators or country code, and text split by markup (`john&#64;example.com`).
"""

from kiln.curate.steps.pii.cards import card_issued, luhn_valid
from kiln.curate.steps.pii.ip_addresses import IPRange, ip_range
from kiln.curate.steps.pii.phones import (
    MAX_NATIONAL_DIGITS,
    MAX_PHONE_DIGITS,
    MIN_NATIONAL_DIGITS,
    MIN_PHONE_DIGITS,
    PhoneCheck,
    phone_possible,
    phone_valid,
    writes_without_trunk,
)
from kiln.curate.steps.pii.placeholders import PLACEHOLDERS
from kiln.curate.steps.pii.regions import LANGUAGE_REGIONS, language_regions
from kiln.curate.steps.pii.secrets import MAX_PEM_BODY_CHARS, MIN_SECRET_ENTROPY, random_looking
from kiln.curate.steps.pii.ssns import ssn_valid
from kiln.curate.steps.pii.step import EXAMPLE_CONTEXT, EXAMPLES_PER_KIND, PIIConfig, RedactPII

__all__ = [
    "EXAMPLES_PER_KIND",
    "EXAMPLE_CONTEXT",
    "IPRange",
    "LANGUAGE_REGIONS",
    "MAX_NATIONAL_DIGITS",
    "MAX_PEM_BODY_CHARS",
    "MAX_PHONE_DIGITS",
    "MIN_NATIONAL_DIGITS",
    "MIN_PHONE_DIGITS",
    "MIN_SECRET_ENTROPY",
    "PLACEHOLDERS",
    "PIIConfig",
    "PhoneCheck",
    "RedactPII",
    "card_issued",
    "ip_range",
    "language_regions",
    "luhn_valid",
    "phone_possible",
    "phone_valid",
    "random_looking",
    "ssn_valid",
    "writes_without_trunk",
]
