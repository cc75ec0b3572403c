"""Per-document curation steps: normalization and the first quality filters.

A step is `process(docs, ledger) -> Iterator[Document]`: it yields what it keeps and records
what it drops in the ledger (the ledger is passed in rather than held, so a step object has
no per-shard state and can be rebuilt anywhere). A filter implements only `check(doc)`,
returning None to keep or the failed rule's name; the reason becomes `<filter>:<rule>`.
Not handled here: global steps such as dedup (kiln.curate.dedup), full Gopher/C4/FineWeb
rule sets, language ID, PII (later issues add them as more steps).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Protocol

from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig


class Step(Protocol):
    name: str

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]: ...


class Filter:
    """Base for steps that only decide keep or drop; subclasses implement `check`."""

    name = "filter"

    def check(self, doc: Document) -> str | None:
        raise NotImplementedError

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            rule = self.check(doc)
            if rule is None:
                yield doc
            else:
                ledger.remove(doc.id, doc.source, f"{self.name}:{rule}")


_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")
# C0/C1 controls other than tab and newline, which carry no text and confuse tokenizers.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def normalize_text(text: str) -> str:
    """NFC, newlines unified, control characters and trailing spaces gone, blank runs capped at one empty line.

    Indentation is kept: code is a source, and its leading whitespace is meaning.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _TRAILING_SPACE.sub("\n", text + "\n")
    text = _BLANK_RUNS.sub("\n\n", text)
    # subtle: NFC comes last; removing a control character can join a base letter and its
    # combining mark ("e\x00\u0301"), and only a final NFC leaves the output composed and idempotent.
    return unicodedata.normalize("NFC", text.strip("\n"))


class Normalize:
    name = "normalize"

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            yield doc.with_text(normalize_text(doc.text))


class LengthFilter(Filter):
    name = "length"

    def __init__(self, min_chars: int, max_chars: int):
        self.min_chars, self.max_chars = min_chars, max_chars

    def check(self, doc: Document) -> str | None:
        if len(doc.text) < self.min_chars:
            return "too_short"
        if len(doc.text) > self.max_chars:
            return "too_long"
        return None


class MeanWordLengthFilter(Filter):
    """Gopher (Rae et al. 2021, Appendix A): mean word length between 3 and 10 characters."""

    name = "gopher_quality"

    def __init__(self, min_length: float, max_length: float):
        self.min_length, self.max_length = min_length, max_length

    def check(self, doc: Document) -> str | None:
        words = doc.text.split()
        if not words:
            return "no_words"
        mean = sum(map(len, words)) / len(words)
        if mean < self.min_length:
            return "mean_word_length_below_min"
        if mean > self.max_length:
            return "mean_word_length_above_max"
        return None


class SymbolRatioFilter(Filter):
    """Gopher: at most 0.1 hash symbols plus ellipses per word."""

    name = "gopher_quality"

    def __init__(self, max_ratio: float):
        self.max_ratio = max_ratio

    def check(self, doc: Document) -> str | None:
        words = len(doc.text.split())
        symbols = doc.text.count("#") + doc.text.count("...") + doc.text.count("\u2026")
        if words == 0 or symbols / words > self.max_ratio:
            return "symbol_word_ratio_above_max"
        return None


def build_steps(cfg: CurateConfig) -> list[Step]:
    return [
        Normalize(),
        LengthFilter(cfg.min_chars, cfg.max_chars),
        MeanWordLengthFilter(cfg.min_mean_word_length, cfg.max_mean_word_length),
        SymbolRatioFilter(cfg.max_symbol_word_ratio),
    ]


def run_steps(docs: Iterable[Document], steps: list[Step], ledger: Ledger) -> Iterator[Document]:
    for step in steps:
        docs = step.process(docs, ledger)
    yield from docs
