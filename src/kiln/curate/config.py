"""The `curate` recipe section: where text comes from, which steps run, with which thresholds.

Each step owns its config (defined beside the step, defaults from the published rule sets);
this section composes them. Without a recipe, `kiln curate --input PATH` uses these defaults:
every step on, the local executor with one worker per core.
`sources` gives one source its own settings for any document step (`curate.sources.docs.
gopher_quality.min_words: 20`, `curate.sources.code.pii.enabled: false`): `for_source` is the
section with them applied, validated like the rest when the recipe loads.
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
from kiln.curate.readers.config import InputConfig
from kiln.curate.steps.c4 import C4Config
from kiln.curate.steps.code import CodeConfig
from kiln.curate.steps.decontaminate import DecontaminateConfig
from kiln.curate.steps.fineweb import FineWebQualityConfig
from kiln.curate.steps.gopher import GopherQualityConfig, GopherRepetitionConfig
from kiln.curate.steps.language import LanguageConfig
from kiln.curate.steps.lines import LineDedupConfig
from kiln.curate.steps.normalize import LengthConfig
from kiln.curate.steps.pii import PIIConfig
from kiln.curate.steps.quality import ClassifierFilterConfig, PerplexityConfig
from kiln.curate.steps.url import URLFilterConfig

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
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
    "perplexity",
    "quality_classifier",
    "code_quality",
    "pii",
    "length",
    "decontaminate",
)
PER_SOURCE_ONLY = {"line_dedup": ("enabled",), "decontaminate": ("enabled", "action")}
# Steps whose shared work exists only when the step is on for all sources: a source can turn them off, not on.
GLOBAL_WORK = {
    "line_dedup": "the line counts",
    "decontaminate": "the contamination index",
    "perplexity": "the model folder",
    "quality_classifier": "the model folder",
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
            "url_filter, line_dedup (enabled only), language, gopher_repetition, gopher_quality, c4, fineweb, "
            "perplexity and quality_classifier (not model), code_quality, pii, length, decontaminate (enabled and "
            "action only)."
        ),
    )

    @model_validator(mode="after")
    def _check_sources(self) -> CurateConfig:
        for source, steps in self.sources.items():
            for step, keys in steps.items():
                if step not in PER_SOURCE_STEPS:
                    raise ValueError(
                        f"curate.sources.{source}.{step}: not a step a source can set; choose from "
                        f"{', '.join(PER_SOURCE_STEPS)}"
                    )
                if not isinstance(keys, dict):
                    raise ValueError(
                        f"curate.sources.{source}.{step}: give the step's settings as a mapping, e.g. {{enabled: "
                        f"false}}"
                    )
                if keys.get("enabled") is True and not getattr(self, step).enabled and step in GLOBAL_WORK:
                    raise ValueError(
                        f"curate.sources.{source}.{step}.enabled: {step} is off for all sources, and its shared "
                        f"work ({GLOBAL_WORK[step]}) is built only when it is on; "
                        f"turn it on for all (curate.{step}.enabled: true) and off for the sources that should skip it"
                    )
                allowed = PER_SOURCE_ONLY.get(step)
                refused = [
                    k
                    for k in keys
                    if (allowed is not None and k not in allowed)
                    or (step in ("perplexity", "quality_classifier") and k == "model")
                ]
                if refused:
                    raise ValueError(
                        f"curate.sources.{source}.{step}.{refused[0]}: set for all sources only "
                        f"(curate.{step}.{refused[0]}); a source may set "
                        f"{', '.join(allowed or ()) or 'every key but model'}"
                    )
                try:
                    self._own_section(step, keys)
                except ValidationError as e:
                    first = e.errors()[0]
                    where = ".".join(str(x) for x in first["loc"])
                    raise ValueError(f"curate.sources.{source}.{step}.{where}: {first['msg']}") from None
        return self

    def for_source(self, source: str) -> CurateConfig:
        """This config with `source`'s own step settings applied (itself when it has none)."""
        return self._per_source.get(source, self)

    def _own_section(self, step: str, keys: dict[str, Any]) -> Section:
        """curate.<step> with a source's own keys in place of the shared ones, validated."""
        section = getattr(self, step)
        return type(section).model_validate({**section.model_dump(), **keys})

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
