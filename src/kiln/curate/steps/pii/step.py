"""The `pii` step and its config: which detectors run, in what order, and what a hit does to a document.

Each hit becomes its kind's placeholder (kiln.curate.steps.pii.placeholders) and is counted per
source as `pii:<kind>`; the first few redactions per source and kind are recorded as examples for
the summary; a document over `max_hits` redactions is dropped. The detectors, one module each:
secrets, emails, ip_addresses, cards, ssns, phones, and numbers (the one digit scan that finds the
shapes of IPv4, cards, SSNs and North American phones for their detectors).
A document's language (`meta.language`) adds the phone regions it names (kiln.curate.steps.pii.regions)
when `phone_regions_from_language` is on; phone words and section words of many languages are context
for every document (kiln.curate.steps.pii.context).
Not handled here: what any kind is and how it is found (the detector modules); other settings by a
document's language (`curate.languages.<code>.pii` sets those, as a source sets its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import phonenumbers
from pydantic import Field, field_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.pii.emails import redact_emails
from kiln.curate.steps.pii.ip_addresses import IPAddresses, IPRange
from kiln.curate.steps.pii.numbers import NumberScan
from kiln.curate.steps.pii.phones import Phones
from kiln.curate.steps.pii.placeholders import PLACEHOLDERS, touches_placeholder
from kiln.curate.steps.pii.regions import language_regions
from kiln.curate.steps.pii.secrets import redact_assigned, redact_pem, redact_tokens


class PIIConfig(Section):
    enabled: bool = Field(True, description="Run PII redaction.")
    emails: bool = Field(True, description="Replace email addresses with <EMAIL>.")
    phones: bool = Field(
        True,
        description="Replace phone numbers that libphonenumber validates (+country code; US (212) 555-0143, "
        "212-555-0143, 212.555.0143; national formats of phone_regions and of the document language's regions), "
        "or of a possible length right after a phone word (Phone:, mobile, tel:, Teléfono, 电话, ...), with <PHONE>.",
    )
    phone_regions: list[str] = Field(
        ["GB", "DE", "FR", "IT", "ES", "NL", "AU", "IE", "IN"],
        description="Regions (ISO 3166 codes) whose national formats, trunk 0 and groups (020 7946 0958), are "
        "checked in every document; numbers with a + country code and the North American formats are checked for "
        "every region.",
    )
    phone_regions_from_language: bool = Field(
        True,
        description="Also check the national formats of the regions a document's language (meta.language) names: "
        "ja JP, de DE AT CH, pt BR PT, zh CN TW HK, ... (kiln.curate.steps.pii.regions), with a trunk 0 "
        "(03-1234-5678) and, for those regions only, without one (612 34 56 78, 8 (495) 123-45-67); "
        "phone_regions are checked all the same.",
    )
    ip_addresses: bool = Field(True, description="Replace IPv4 and IPv6 addresses with <IP_ADDRESS>.")
    keep_ip_ranges: list[IPRange] = Field(
        ["private", "loopback", "link_local", "unspecified", "documentation", "multicast", "reserved", "resolvers"],
        description="Address ranges left as they are: private (RFC 1918, 100.64/10, fc00::/7), loopback, link_local "
        "(169.254/16, fe80::/10), unspecified (0.0.0.0/8, ::), documentation (192.0.2/24, 198.51.100/24, "
        "203.0.113/24, 2001:db8::/32), multicast, reserved (any other range not routed on the internet), "
        "resolvers (public DNS resolvers such as 8.8.8.8); [] redacts every address.",
    )
    credit_cards: bool = Field(
        True,
        description="Replace card numbers (an issuer's prefix and length, passing the Luhn check) with <CREDIT_CARD>.",
    )
    ssns: bool = Field(
        True,
        description="Replace US social security numbers written AAA-GG-SSSS that the SSA could have issued with <SSN>.",
    )
    secrets: bool = Field(
        True,
        description="Replace API keys and tokens of known formats, PEM private-key blocks and random-looking values "
        "assigned to password/secret/token/key names with <SECRET>.",
    )
    max_hits: int | None = Field(
        None,
        ge=0,
        description="Drop a document with more than this many redactions (all types together); None never drops.",
    )

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


class RedactPII:
    """The `pii` step: redact what the config enables, count hits per type, drop documents over `max_hits`."""

    name = "pii"

    def __init__(self, config: PIIConfig):
        self.config = config
        self._ips = IPAddresses(config.keep_ip_ranges)
        enabled = {
            "ip_address": config.ip_addresses,
            "credit_card": config.credit_cards,
            "ssn": config.ssns,
            "phone": config.phones,
        }
        self._kinds = [kind for kind, on in enabled.items() if on]
        # Order: key blocks and tokens first, so their base64 is never read as numbers or emails;
        # IPv6 before the number pass (an IPv6 address can end in an IPv4 one).
        passes: list[Callable[[str, dict[str, int]], str]] = []
        if config.secrets:
            passes += [redact_pem, redact_tokens, redact_assigned]
        if config.emails:
            passes.append(redact_emails)
        if config.ip_addresses:
            passes.append(self._ips.redact_ipv6)
        self._passes = passes  # then the number scan and phones, chosen by the document's language (_passes_for)
        self._by_language: dict[str | None, list[Callable[[str, dict[str, int]], str]]] = {}
        self._examples: dict[tuple[str, str], int] = {}  # (source, kind) -> examples recorded

    def redact(self, text: str, language: str | None = None) -> tuple[str, dict[str, int]]:
        """The text with every enabled kind of PII replaced, and the number of hits per kind; `language` (a
        document's meta.language) adds the phone regions it names."""
        passes = self._passes_for(language)
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
            for redact in passes:
                text = redact(text, found)
            for kind, n in found.items():
                hits[kind] += n
            if not any(found.values()) or not touches_placeholder(text, self.config.secrets):
                return text, hits

    def _passes_for(self, language: str | None) -> list[Callable[[str, dict[str, int]], str]]:
        """Every pass for a document of `language`: the phone regions it names join phone_regions (if asked)."""
        passes = self._by_language.get(language)
        if passes is None:
            hinted = language_regions(language) if self.config.phone_regions_from_language else ()
            phones = Phones(self.config.phone_regions, hinted)
            grouped = phones.grouped if phones.without_trunk else None
            passes = (
                [*self._passes, NumberScan(self._kinds, self._ips, grouped).redact] if self._kinds else self._passes
            )
            if self.config.phones:
                passes = [*passes, phones.redact]
            self._by_language[language] = passes
        return passes

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            language = doc.meta.get("language")
            text, hits = self.redact(doc.text, language if isinstance(language, str) else None)
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
        """Record the redacted text around this kind's first placeholder, for the first few documents per source
        and kind (per worker)."""
        key = (doc.source, kind)
        if self._examples.get(key, 0) >= EXAMPLES_PER_KIND:
            return
        self._examples[key] = self._examples.get(key, 0) + 1
        at = redacted.find(PLACEHOLDERS[kind])
        end = at + len(PLACEHOLDERS[kind])
        snippet = redacted[max(0, at - EXAMPLE_CONTEXT) : end + EXAMPLE_CONTEXT]
        example = {"source": doc.source, "kind": kind, "id": doc.id, "text": " ".join(snippet.split())}
        ledger.record("pii_example", example)
