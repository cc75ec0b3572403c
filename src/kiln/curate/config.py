"""The `curate` recipe section: where text comes from, which steps run, with which thresholds.

Each step owns its config (defined beside the step, defaults from the published rule sets);
this section composes them. Without a recipe, `kiln curate --input PATH` uses these defaults:
every step on, the local executor with one worker per core.
Not handled here: per-source rule sets (a source is prose or code; both kinds share the
thresholds below), and the steps themselves (kiln.curate.steps).
"""

from __future__ import annotations

from pydantic import Field

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


class CurateConfig(Section):
    NOT_HASHED = frozenset({"executor"})  # shards do not depend on the executor or worker count
    inputs: tuple[InputConfig, ...] = Field(default=DEFAULT_INPUTS, min_length=1, description="Input streams, read in this order; `kiln curate --input PATH` replaces them.")
    max_total_mb: float | None = Field(default=None, gt=0, description="Cap on raw input in MB (1e6 bytes on disk, compressed files counted compressed), shared fairly between inputs; None reads everything.")
    max_doc_mb: float = Field(default=1.0, gt=0, description="A document with more text than this (MB of UTF-8) is quarantined, never loaded whole into the steps.")
    extract_timeout_s: float = Field(default=5.0, gt=0, description="Seconds allowed for extracting the main text of one HTML page (extraction runs in a helper process); a page not done by then has its extractor killed and is quarantined (extract:timeout).")
    shard_mb: float = Field(default=4.0, gt=0, description="Raw input bytes per shard task (MB) for one-document-per-file inputs and Parquet row groups (a JSONL or WARC file is one task); shard names depend on this, never on the worker count.")
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig, description="Where shard tasks run: local process pool or Ray.")
    sample_size: int = Field(default=20, ge=0, description="Removed documents kept per source and reason under audit/samples/ for inspection.")
    url_filter: URLFilterConfig = Field(default_factory=URLFilterConfig, description="Block lists for documents with a URL (meta.url).")
    line_dedup: LineDedupConfig = Field(default_factory=LineDedupConfig, description="CCNet-style removal of lines repeated across many documents of a source (prose only).")
    language: LanguageConfig = Field(default_factory=LanguageConfig, description="Language identification (fastText lid.176) and the languages kept (prose only).")
    gopher_repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig, description="Gopher repetition rules (prose only).")
    gopher_quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig, description="Gopher quality rules (prose only).")
    c4: C4Config = Field(default_factory=C4Config, description="C4 line and document rules (prose only).")
    fineweb: FineWebQualityConfig = Field(default_factory=FineWebQualityConfig, description="FineWeb's additional rules (prose only).")
    perplexity: PerplexityConfig = Field(default_factory=PerplexityConfig, description="CCNet-style perplexity filter under a reference n-gram model (prose only; off by default, needs `kiln quality train-lm`).")
    quality_classifier: ClassifierFilterConfig = Field(default_factory=ClassifierFilterConfig, description="Reference-vs-corpus classifier filter (prose only; off by default, needs `kiln quality train-classifier`).")
    code_quality: CodeConfig = Field(default_factory=CodeConfig, description="Rules for code documents, applied instead of the prose rules.")
    pii: PIIConfig = Field(default_factory=PIIConfig, description="Redaction of emails, phone numbers, IP addresses, card numbers, SSNs and secrets.")
    length: LengthConfig = Field(default_factory=LengthConfig, description="Document length limits, after every edit.")
    decontaminate: DecontaminateConfig = Field(default_factory=DecontaminateConfig, description="Removal (or flagging) of documents sharing a word n-gram with an evaluation set (`kiln curate --decontaminate EVAL.jsonl`).")
    exact_dedup: ExactDedupConfig = Field(default_factory=ExactDedupConfig, description="Removal of exact duplicates (normalized text) across all sources.")
    minhash_dedup: MinHashConfig = Field(default_factory=MinHashConfig, description="Removal of near-duplicates (MinHash LSH with exact Jaccard verification) across all sources, after exact dedup.")

    @property
    def near_priority(self) -> tuple[str, ...]:
        """Source priority for near-duplicate clusters: minhash_dedup's own, else exact_dedup's."""
        own = self.minhash_dedup.source_priority
        return self.exact_dedup.source_priority if own is None else own
