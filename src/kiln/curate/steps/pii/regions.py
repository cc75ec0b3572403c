"""The phone regions a document's language names, for the `pii` step: a Japanese page's 03-1234-5678
is read as a Japanese number, a Spanish page's 612 34 56 78 as a Spanish one.

The hint only adds regions to `phone_regions` (kiln.curate.steps.pii.phones checks both); a language
not in the table, or a document without `meta.language`, adds none.
Not handled: English (its numbers are the North American shapes and the default phone_regions), a
language's smaller countries (a Chilean page is read as Spanish, Mexican, Argentine or Colombian), a
page whose numbers belong to another country than its language's.
"""

from __future__ import annotations

import re

import phonenumbers

# Language (ISO 639-1, as lid.176 labels documents) -> ISO 3166 regions, largest first. Chosen by hand for
# the web's most common languages after English: the countries where the language is the main or an official
# one and most of its readers live, at most four, since each region costs a libphonenumber parse per
# candidate. Numbers there are written with a trunk 0 (Japan, Germany, France, Korea, ...), with none
# (Spain, Portugal, Italy's mobiles, Greece, Poland), with none for mobiles (China, Brazil, Mexico) or
# with a trunk 8 (Russia, Kazakhstan, Belarus).
LANGUAGE_REGIONS: dict[str, tuple[str, ...]] = {
    "ar": ("EG", "SA", "AE", "MA"),
    "cs": ("CZ",),
    "de": ("DE", "AT", "CH"),
    "el": ("GR", "CY"),
    "es": ("ES", "MX", "AR", "CO"),
    "fa": ("IR", "AF"),
    "fr": ("FR", "BE", "CH", "CA"),
    "hi": ("IN",),
    "hu": ("HU",),
    "id": ("ID",),
    "it": ("IT", "CH"),
    "ja": ("JP",),
    "ko": ("KR",),
    "nl": ("NL", "BE"),
    "pl": ("PL",),
    "pt": ("BR", "PT"),
    "ro": ("RO", "MD"),
    "ru": ("RU", "KZ", "BY"),
    "sv": ("SE", "FI"),
    "th": ("TH",),
    "tr": ("TR",),
    "uk": ("UA",),
    "vi": ("VN",),
    "zh": ("CN", "TW", "HK"),
}
assert all(r in phonenumbers.SUPPORTED_REGIONS for regions in LANGUAGE_REGIONS.values() for r in regions)


def language_regions(language: str | None) -> tuple[str, ...]:
    """The regions a language code names: its table entry, after a region subtag that libphonenumber knows
    (`pt-BR` -> BR, PT; `zh_Hant` -> CN, TW, HK; `xx` or None -> none)."""
    if not language:
        return ()
    code, *subtags = re.split(r"[-_]", language)
    own = tuple(tag.upper() for tag in subtags if tag.upper() in phonenumbers.SUPPORTED_REGIONS)
    return tuple(dict.fromkeys(own + LANGUAGE_REGIONS.get(code.lower(), ())))
