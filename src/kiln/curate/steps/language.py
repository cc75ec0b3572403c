"""The `language` step: identify each document's language with fastText lid.176 (kiln.text.language)
and keep the languages the recipe asks for. Every kept document gets `meta.language` (ISO 639
code, as lid.176 names it) and `meta.language_score`.
Not handled: documents mixing languages (one label for the whole text), scripts lid.176 does not
know, per-language thresholds, and dialect or script variants (zh is one label).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.steps.base import Drop, Filter
from kiln.text.language import LID176_LANGUAGES, SCORE_DIGITS, load_model, predict_language


class LanguageConfig(Section):
    enabled: bool = Field(True, description="Run language identification.")
    languages: list[str] | None = Field(
        ["en"],
        description=(
            "lid.176 language codes to keep (en, de, zh...); None or [] keeps every language and only annotates."
        ),
    )
    # FineWeb (Penedo et al. 2024) keeps English documents whose lid.176 score is at least 0.65.
    min_score: float = Field(
        0.65,
        ge=0.0,
        le=1.0,
        description="Lowest top-language score (0-1) at which a document in an allowed language is kept.",
    )
    max_chars_predicted: int | None = Field(
        None,
        gt=0,
        description=(
            "Predict on at most this many leading characters (faster on long documents); None reads the whole text, "
            "as FineWeb does."
        ),
    )


class LanguageID(Filter):
    """The `language` step: annotates every kept document, drops languages not asked for or unsure ones."""

    name = "language"

    def __init__(self, config: LanguageConfig):
        unknown = sorted(set(config.languages or ()) - LID176_LANGUAGES)
        if unknown:
            raise ConfigError(
                f"language.languages: {unknown} are not lid.176 labels; use its ISO 639 codes such as en, de, zh "
                "(see fasttext.cc/docs/en/language-identification.html)"
            )
        self.config = config
        self.allowed = frozenset(config.languages or ())
        load_model()  # fail at construction, before any work, if the model is not installed

    def predict(self, doc: Document) -> tuple[str, float]:
        """(language, score rounded to SCORE_DIGITS), computed once per text and kept in doc.cache."""
        found = doc.cache.get("language")
        if found is None:
            language, score = predict_language(doc.text, self.config.max_chars_predicted)
            found = doc.cache["language"] = (language, round(score, SCORE_DIGITS))
        return found

    def check(self, doc: Document) -> Drop | None:
        if not self.allowed:
            return None
        language, score = self.predict(doc)
        if language not in self.allowed:
            return Drop(
                "not_allowed", score, None, note=f"detected {language}; allowed {', '.join(sorted(self.allowed))}"
            )
        # The rounded score decides, so the recorded value and the decision never disagree.
        if score < self.config.min_score:
            return Drop("low_score", score, self.config.min_score, note=f"detected {language}")
        return None

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            drop = self.check(doc)
            if drop is not None:
                ledger.remove(doc, self.name, drop.rule, drop.value, drop.threshold, note=drop.note)
                continue
            language, score = self.predict(doc)
            yield doc.with_meta(language=language, language_score=score)
