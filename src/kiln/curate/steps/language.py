"""The `language` step: identify each document's language with fastText lid.176 (kiln.text.language) and its
script from its letters (kiln.text.scripts), and keep the languages, and scripts, the recipe asks for.

Every kept document gets `meta.language` (the lid.176 label of the whole text), `meta.language_score` and
`meta.script` (ISO 15924: Latn, Cyrl, Hans, Hant, Jpan, ...; Zyyy for a text with no letters). A language
may have its own lowest score (`min_scores`), and an entry of `languages` may name a script (`zh-Hant`,
`sr-Latn`) to keep only that script. A kept document scoring below MIXED_BELOW_SCORE whose paragraphs,
predicted one by one (kiln.text.language.language_shares; a paragraph counts when its score reaches its
language's lowest score), give another language at least `mixed_min_share` of their letters is reported mixed:
`meta.languages` holds every language's share and the counter `language_mixed` counts it; its language
stays the whole-text prediction.
Not handled: dropping mixed documents (they are only reported), a script asked for a language lid.176
labels otherwise (Serbian in Latin letters: lid.176 labels 0.80 of the sr@latin gettext documents sr, and
half their sentences, the rest sh, hr, sl or bs; `sr-Latn` keeps only what is labelled sr), and romanised text
of a language usually written in another script (Hindi in Latin letters is whatever lid.176 says).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from pydantic import Field, field_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.audit import Ledger
from kiln.curate.steps.base import Drop, Filter
from kiln.text.language import (
    BLOCK_CHARS,
    LID176_LANGUAGES,
    SCORE_DIGITS,
    language_shares,
    load_model,
    predict_language,
)
from kiln.text.scripts import SCRIPTS, text_script

_TAG = re.compile(r"^([a-z]{2,3})(?:-([A-Za-z]{4}))?$")
_TAG_FORM = (
    "a lid.176 language code (en, de, zh: fasttext.cc/docs/en/language-identification.html), optionally followed "
    "by '-' and an ISO 15924 script kiln tells apart (zh-Hant, zh-Hans, sr-Latn, sr-Cyrl, ja-Jpan; the scripts "
    "are kiln.text.scripts.SCRIPTS)"
)


def split_tag(tag: str) -> tuple[str, str | None]:
    """`zh-Hant` -> ("zh", "Hant"), `en` -> ("en", None); ValueError naming the entry and the form otherwise."""
    m = _TAG.match(tag)
    script = m.group(2).title() if m and m.group(2) else None  # BCP 47 writes it Hant; any case is read
    if m is None or m.group(1) not in LID176_LANGUAGES or (script is not None and script not in SCRIPTS):
        raise ValueError(f"{tag!r} is not {_TAG_FORM}")
    return m.group(1), script


# perf: a document the whole-text prediction is this sure of holds no second language worth reporting, so its
# paragraphs are not predicted. Measured on the machine's translated messages (four paragraphs, one of them in
# fr, de, ja, zh or ru, the rest English): all 125 such documents scored below 0.95, and 84% of 150 documents in
# one language at or above it, so the paragraph pass runs on about a sixth of unmixed documents.
MIXED_BELOW_SCORE = 0.95


class LanguageConfig(Section):
    enabled: bool = Field(True, description="Run language identification.")
    languages: list[str] | None = Field(
        ["en"],
        description=(
            "Languages to keep: lid.176 codes (en, de, zh...), each optionally with an ISO 15924 script to keep only "
            "that script (zh-Hant, sr-Latn; plain zh keeps every script); None or [] keeps every language and only "
            "annotates."
        ),
    )
    # FineWeb (Penedo et al. 2024) keeps English documents whose lid.176 score is at least 0.65.
    min_score: float = Field(
        0.65,
        ge=0.0,
        le=1.0,
        description="Lowest top-language score (0-1) at which a document in an allowed language is kept.",
    )
    min_scores: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "lid.176 code -> lowest score (0-1) that keeps a document of that language, in place of min_score "
            "(FineWeb-2 sets one per language)."
        ),
    )
    mixed_min_share: float | None = Field(
        0.2,
        gt=0.0,
        le=1.0,
        description=(
            "Share of the letters (0-1) of a kept document's paragraphs, predicted one by one (each from its first "
            f"{BLOCK_CHARS} characters), that a language other than the document's must cover for it to be reported "
            "mixed (meta.languages, counter language_mixed); a document whose whole text scores 0.95 or more is taken "
            "as unmixed; None predicts no paragraphs."
        ),
    )
    mixed_min_letters: int = Field(
        40,
        ge=1,
        description="Fewest letters a paragraph needs to be predicted on its own; shorter ones count for no language.",
    )
    max_chars_predicted: int | None = Field(
        None,
        gt=0,
        description=(
            "Predict on at most this many leading characters (faster on long documents; the script and paragraph "
            "shares read the same prefix); None reads the whole text, as FineWeb does."
        ),
    )

    @field_validator("languages")
    @classmethod
    def _known_tags(cls, tags: list[str] | None) -> list[str] | None:
        """Each entry a lid.176 code with an optional known script, the script written in title case (zh-Hant)."""
        if tags is None:
            return None
        out = []
        for tag in tags:
            code, script = split_tag(tag)
            out.append(code if script is None else f"{code}-{script}")
        return out

    @field_validator("min_scores")
    @classmethod
    def _known_codes(cls, scores: dict[str, float]) -> dict[str, float]:
        for code, score in scores.items():
            if code not in LID176_LANGUAGES:
                raise ValueError(
                    f"{code!r} is not a lid.176 language code; the keys are codes such as en, de, zh "
                    "(fasttext.cc/docs/en/language-identification.html), without a script"
                )
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"{code}: {score} is not a score; write one from 0 to 1")
        return scores


class LanguageID(Filter):
    """The `language` step: annotates every kept document, drops languages or scripts not asked for, and unsure
    predictions."""

    name = "language"

    def __init__(self, config: LanguageConfig):
        self.config = config
        # language -> the scripts kept for it, None for every script (a plain code wins over code-Script entries)
        self.allowed: dict[str, frozenset[str] | None] = {}
        for tag in config.languages or ():
            code, script = split_tag(tag)
            held = self.allowed.get(code, frozenset())
            self.allowed[code] = None if script is None or held is None else held | {script}
        self.listed = ", ".join(sorted(config.languages or ()))
        load_model()  # fail at construction, before any work, if the model is not installed

    def text(self, doc: Document) -> str:
        """What the predictions read: the text, or its first max_chars_predicted characters."""
        limit = self.config.max_chars_predicted
        return doc.text if limit is None else doc.text[:limit]

    def predict(self, doc: Document) -> tuple[str, float]:
        """(language, score rounded to SCORE_DIGITS), computed once per text and kept in doc.cache."""
        found = doc.cache.get("language")
        if found is None:
            language, score = predict_language(doc.text, self.config.max_chars_predicted)
            found = doc.cache["language"] = (language, round(score, SCORE_DIGITS))
        return found

    def script(self, doc: Document) -> str:
        """The ISO 15924 script of the text's letters, computed once per text and kept in doc.cache."""
        found = doc.cache.get("script")
        if found is None:
            found = doc.cache["script"] = text_script(self.text(doc))
        return found

    def check(self, doc: Document) -> Drop | None:
        if not self.allowed:
            return None
        language, score = self.predict(doc)
        if language not in self.allowed:
            return Drop("not_allowed", score, None, note=f"detected {language}; allowed {self.listed}")
        # The rounded score decides, so the recorded value and the decision never disagree.
        threshold = self.config.min_scores.get(language, self.config.min_score)
        if score < threshold:
            return Drop("low_score", score, threshold, note=f"detected {language}")
        scripts = self.allowed[language]
        if scripts is not None and (script := self.script(doc)) not in scripts:
            return Drop("script_not_allowed", note=f"detected {language} in {script}; allowed {self.listed}")
        return None

    def mixed(self, doc: Document, language: str, score: float) -> dict[str, float] | None:
        """Every language's share of the paragraphs' letters when one other than `language` covers at least
        mixed_min_share of them; None otherwise (or when the text has fewer than two paragraphs long enough)."""
        min_share = self.config.mixed_min_share
        if min_share is None or score >= MIXED_BELOW_SCORE:
            return None
        cfg = self.config
        shares = language_shares(self.text(doc), cfg.mixed_min_letters, cfg.min_score, cfg.min_scores)
        if shares is None or not any(share >= min_share for code, share in shares.items() if code != language):
            return None
        return shares

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            drop = self.check(doc)
            if drop is not None:
                ledger.remove(doc, self.name, drop.rule, drop.value, drop.threshold, note=drop.note)
                continue
            language, score = self.predict(doc)
            script = self.script(doc)
            # perf: paragraphs are predicted only for kept documents, once the cheaper decisions are made
            shares = self.mixed(doc, language, score)
            if shares is None:
                yield doc.with_meta(language=language, language_score=score, script=script)
                continue
            ledger.count(doc.source, "language_mixed")
            yield doc.with_meta(language=language, language_score=score, script=script, languages=shares)
