"""The `curate` recipe section: where text comes from, which steps run, with which thresholds.

Each step owns its config (defined beside the step, defaults from the published rule sets);
this section composes them. Without a recipe, `kiln curate --input PATH` uses these defaults:
every step on, the local executor with one worker per core.
`sources` gives one source its own settings for any document step (`curate.sources.docs.
gopher_quality.min_words: 20`, `curate.sources.code.pii.enabled: false`): `for_source` is the
section with them applied, validated like the rest when the recipe loads. `languages` does the same
per language (`curate.languages.fr.gopher_quality.max_mean_word_length: 12`), over the settings kiln
ships for each language (kiln.curate.languages says which value wins); `for_language` applies them.
Not handled here: the steps themselves (kiln.curate.steps).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from kiln.core.config import Section
from kiln.core.executors import ExecutorConfig
from kiln.curate.dedup.exact import ExactDedupConfig
from kiln.curate.dedup.minhash import MinHashConfig
from kiln.curate.languages import LANGUAGE_DEFAULTS, LANGUAGE_KEYS, PER_LANGUAGE_STEPS, resolve, shipped, with_keys
from kiln.curate.readers.config import InputConfig
from kiln.curate.steps.bad_words import BadWordsConfig
from kiln.curate.steps.c4 import C4Config
from kiln.curate.steps.code import CodeConfig
from kiln.curate.steps.decontaminate import DecontaminateConfig
from kiln.curate.steps.fineweb import FineWebQualityConfig
from kiln.curate.steps.gopher import GopherQualityConfig, GopherRepetitionConfig
from kiln.curate.steps.labels import ClassifiersConfig
from kiln.curate.steps.language import LanguageConfig
from kiln.curate.steps.lines import LineDedupConfig
from kiln.curate.steps.normalize import LengthConfig
from kiln.curate.steps.pii import PIIConfig
from kiln.curate.steps.quality import ClassifierFilterConfig, PerplexityConfig
from kiln.curate.steps.url import URLFilterConfig
from kiln.text.language import LID176_LANGUAGES

# The built-in corpus marks its kinds: pydoc topics live in a .py file but are prose.
DEFAULT_INPUTS = (
    InputConfig(source="code", format="stdlib_code", code=True),
    InputConfig(source="prose", format="pydoc_topics", code=False),
    InputConfig(source="docs", format="usr_share_doc", code=False),
)


# Steps a source can set for itself, and the keys each may not (global work: the line counts,
# the decontamination index and the quality models are built once for all sources).
PER_SOURCE_STEPS = (
    "url_filter",
    "line_dedup",
    "language",
    "bad_words",
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
    "perplexity",
    "quality_classifier",
    "classifiers",
    "code_quality",
    "pii",
    "length",
    "decontaminate",
)
PER_SOURCE_ONLY = {"line_dedup": ("enabled",), "decontaminate": ("enabled", "action"), "classifiers": ("enabled",)}
# Steps whose shared work exists only when the step is on for all sources: a source can turn them off, not on.
GLOBAL_WORK = {
    "line_dedup": "the line counts",
    "decontaminate": "the contamination index",
    "perplexity": "the model folder",
    "quality_classifier": "the model folder",
    "classifiers": "the model folders",
}


class CurateConfig(Section):
    NOT_HASHED = frozenset({"executor"})  # shards do not depend on the executor or worker count
    inputs: tuple[InputConfig, ...] = Field(
        default=DEFAULT_INPUTS,
        min_length=1,
        description="Input streams, read in this order; `kiln curate --input PATH` replaces them.",
    )
    max_total_mb: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Cap on raw input in MB (1e6 bytes on disk, compressed files counted compressed), shared fairly between "
            "inputs; None reads everything."
        ),
    )
    max_doc_mb: float = Field(
        default=1.0,
        gt=0,
        description=(
            "A document with more text than this (MB of UTF-8) is quarantined, never loaded whole into the steps."
        ),
    )
    extract_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds allowed for extracting the main text of one HTML page (extraction runs in a helper process); a "
            "page not done by then has its extractor killed and is quarantined (extract:timeout)."
        ),
    )
    shard_mb: float = Field(
        default=4.0,
        gt=0,
        description=(
            "Raw input bytes per shard task (MB) for one-document-per-file inputs and Parquet row groups (a JSONL or "
            "WARC file is one task); shard names depend on this, never on the worker count."
        ),
    )
    executor: ExecutorConfig = Field(
        default_factory=ExecutorConfig, description="Where shard tasks run: local process pool or Ray."
    )
    sample_size: int = Field(
        default=20,
        ge=0,
        description="Removed documents kept per source and reason under audit/samples/ for inspection.",
    )
    duplicate_ids: Literal["rename", "refuse"] = Field(
        default="rename",
        description=(
            "An id that two input documents share (ids name documents in removed.parquet and --explain): rename gives "
            "each later one `<id>#<n>` (counted as read:duplicate_id, listed in audit/duplicate_ids.json); refuse "
            "stops the run naming the first."
        ),
    )
    url_filter: URLFilterConfig = Field(
        default_factory=URLFilterConfig, description="Block lists for documents with a URL (meta.url)."
    )
    line_dedup: LineDedupConfig = Field(
        default_factory=LineDedupConfig,
        description="CCNet-style removal of lines repeated across many documents of a source (prose only).",
    )
    language: LanguageConfig = Field(
        default_factory=LanguageConfig,
        description="Language identification (fastText lid.176) and the languages kept (prose only).",
    )
    bad_words: BadWordsConfig = Field(
        default_factory=BadWordsConfig,
        description="C4's filter of documents holding obscene words, per language (LDNOOBW's lists; prose only).",
    )
    gopher_repetition: GopherRepetitionConfig = Field(
        default_factory=GopherRepetitionConfig, description="Gopher repetition rules (prose only)."
    )
    gopher_quality: GopherQualityConfig = Field(
        default_factory=GopherQualityConfig, description="Gopher quality rules (prose only)."
    )
    c4: C4Config = Field(default_factory=C4Config, description="C4 line and document rules (prose only).")
    fineweb: FineWebQualityConfig = Field(
        default_factory=FineWebQualityConfig, description="FineWeb's additional rules (prose only)."
    )
    perplexity: PerplexityConfig = Field(
        default_factory=PerplexityConfig,
        description=(
            "CCNet-style perplexity filter under a reference n-gram model (prose only; off by default, needs `kiln "
            "quality train-lm`)."
        ),
    )
    quality_classifier: ClassifierFilterConfig = Field(
        default_factory=ClassifierFilterConfig,
        description=(
            "Reference-vs-corpus classifier filter (prose only; off by default, needs `kiln quality train-classifier`)."
        ),
    )
    classifiers: ClassifiersConfig = Field(
        default_factory=ClassifiersConfig,
        description=(
            "Classifiers trained on labels (`kiln quality train-labels`): scores in meta.scores, removal by "
            "threshold (prose only)."
        ),
    )
    code_quality: CodeConfig = Field(
        default_factory=CodeConfig, description="Rules for code documents, applied instead of the prose rules."
    )
    pii: PIIConfig = Field(
        default_factory=PIIConfig,
        description="Redaction of emails, phone numbers, IP addresses, card numbers, SSNs and secrets.",
    )
    length: LengthConfig = Field(default_factory=LengthConfig, description="Document length limits, after every edit.")
    decontaminate: DecontaminateConfig = Field(
        default_factory=DecontaminateConfig,
        description=(
            "Removal (or flagging) of documents sharing a word n-gram with an evaluation set (`kiln curate "
            "--decontaminate EVAL.jsonl`)."
        ),
    )
    exact_dedup: ExactDedupConfig = Field(
        default_factory=ExactDedupConfig,
        description="Removal of exact duplicates (normalized text) across all sources.",
    )
    minhash_dedup: MinHashConfig = Field(
        default_factory=MinHashConfig,
        description=(
            "Removal of near-duplicates (MinHash LSH with exact Jaccard verification) across all sources, after exact "
            "dedup."
        ),
    )
    sources: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description=(
            "Settings of one source: sources.<source>.<step>.<key> replaces curate.<step>.<key> for that source's "
            "documents (e.g. docs: {gopher_quality: {min_words: 20}}, code: {pii: {enabled: false}}); steps: "
            "url_filter, line_dedup (enabled only), language, bad_words, gopher_repetition, gopher_quality, c4, "
            "fineweb, perplexity and quality_classifier (not model), classifiers (enabled only), code_quality, pii, "
            "length, decontaminate (enabled and action only)."
        ),
    )

    languages: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description=(
            "Settings of one language (lid.176's code, the documents' meta.language): languages.<code>.<step>.<key> "
            "for prose documents of that language, over the settings kiln ships for it (FineWeb-2's, "
            "kiln/curate/languages.yaml) and over curate.<step>.<key>; a source's own settings still win. Steps: "
            "language (min_score only), gopher_repetition, gopher_quality, c4, fineweb, pii, length."
        ),
    )
    language_defaults: str | None = Field(
        default=LANGUAGE_DEFAULTS,
        description=(
            f"The per-language settings kiln ships ({LANGUAGE_DEFAULTS}: FineWeb-2's stop words and thresholds for 29 "
            "languages), used where the recipe keeps kiln's default; null: none (only curate.languages)."
        ),
    )

    @model_validator(mode="after")
    def _check_sources(self) -> CurateConfig:
        if self.language_defaults not in (None, LANGUAGE_DEFAULTS):
            raise ValueError(
                f"curate.language_defaults: {self.language_defaults!r} is not a set of settings this kiln ships; "
                f"use {LANGUAGE_DEFAULTS!r} or null"
            )
        for code, steps in self.languages.items():
            where = f"curate.languages.{code}"
            if code not in LID176_LANGUAGES:
                raise ValueError(
                    f"{where}: {code!r} is not a language code documents carry; use lid.176's ISO 639 codes such as "
                    "fr, de, zh (meta.language)"
                )
            for step, keys in steps.items():
                if step not in PER_LANGUAGE_STEPS:
                    raise ValueError(
                        f"{where}.{step}: not a step a language can set (url_filter and line_dedup run before the "
                        f"language is known; the model filters and decontaminate judge documents together); choose "
                        f"from {', '.join(PER_LANGUAGE_STEPS)}"
                    )
                self._check_keys(where, step, keys, LANGUAGE_KEYS.get(step))
                if keys.get("enabled") is True and not getattr(self, step).enabled:
                    raise ValueError(
                        f"{where}.{step}.enabled: a language can turn a step off, not on; turn it on for all "
                        f"(curate.{step}.enabled: true) and off for the languages that should skip it"
                    )
        for source, steps in self.sources.items():
            for step, keys in steps.items():
                if step not in PER_SOURCE_STEPS:
                    raise ValueError(
                        f"curate.sources.{source}.{step}: not a step a source can set; choose from "
                        f"{', '.join(PER_SOURCE_STEPS)}"
                    )
                self._check_keys(f"curate.sources.{source}", step, keys, PER_SOURCE_ONLY.get(step))
                if keys.get("enabled") is True and not getattr(self, step).enabled and step in GLOBAL_WORK:
                    raise ValueError(
                        f"curate.sources.{source}.{step}.enabled: {step} is off for all sources, and its shared "
                        f"work ({GLOBAL_WORK[step]}) is built only when it is on; "
                        f"turn it on for all (curate.{step}.enabled: true) and off for the sources that should skip it"
                    )
        return self

    def _check_keys(self, where: str, step: str, keys: dict[str, Any], allowed: tuple[str, ...] | None) -> None:
        """`where.step`'s keys: only `allowed` ones (None: all but a model filter's model), with valid values."""
        kind = where.split(".")[1]  # sources or languages
        refused = [
            k
            for k in keys
            if (allowed is not None and k not in allowed)
            or (step in ("perplexity", "quality_classifier") and k == "model")
        ]
        if refused:
            raise ValueError(
                f"{where}.{step}.{refused[0]}: set for all {kind} only (curate.{step}.{refused[0]}); one may set "
                f"{', '.join(allowed or ()) or 'every key but model'}"
            )
        try:
            self._own_section(step, keys)
        except ValidationError as e:
            first = e.errors()[0]
            key = ".".join(str(x) for x in first["loc"])
            raise ValueError(f"{where}.{step}.{key}: {first['msg']}") from None

    def for_source(self, source: str) -> CurateConfig:
        """This config with `source`'s own step settings applied (itself when it has none)."""
        return self._per_source.get(source, self)

    def language_codes(self) -> list[str]:
        """The languages with settings of their own: shipped (unless language_defaults is null) and the recipe's."""
        return sorted({*(shipped() if self.language_defaults else {}), *self.languages})

    def for_language(self, source: str, code: str) -> CurateConfig:
        """This config as `source`'s documents in language `code` use it (kiln.curate.languages says which value
        wins); itself when nothing differs."""
        given = shipped().get(code, {}) if self.language_defaults else {}
        own = self.languages.get(code, {})
        update = {}
        for step in PER_LANGUAGE_STEPS:
            if step in given or step in own:
                section = resolve(getattr(self, step), given.get(step, {}), own.get(step, {}))
                update[step] = with_keys(section, self.sources.get(source, {}).get(step, {}))
        return self.for_source(source).model_copy(update=update) if update else self.for_source(source)

    def _own_section(self, step: str, keys: dict[str, Any]) -> Section:
        """curate.<step> with a source's own keys in place of the shared ones, validated."""
        return with_keys(getattr(self, step), keys)

    @cached_property
    def _per_source(self) -> dict[str, CurateConfig]:
        return {
            source: self.model_copy(update={step: self._own_section(step, keys) for step, keys in steps.items()})
            for source, steps in self.sources.items()
        }

    def source_settings(self, source: str) -> list[str]:
        """`step.key=value` for each setting `source` has of its own (what the summary and --explain show)."""
        return [
            f"{step}.{key}={value}"
            for step, keys in self.sources.get(source, {}).items()
            for key, value in keys.items()
        ]

    @property
    def near_priority(self) -> tuple[str, ...]:
        """Source priority for near-duplicate clusters: minhash_dedup's own, else exact_dedup's."""
        own = self.minhash_dedup.source_priority
        return self.exact_dedup.source_priority if own is None else own
