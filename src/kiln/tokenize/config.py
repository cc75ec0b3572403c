"""The `tokenizer` (training) and `tokenize` (encoding) recipe sections."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.executors import ExecutorConfig
from kiln.text.specials import BYTE_ALPHABET, special_tokens


class BoundaryConfig(Section):
    """The tokens around each document, over those an imported tokenizer's folder names (None keeps each)."""

    bos: str | bool | None = Field(
        default=None,
        description=(
            "Token to start every document with: a spelling, true for the folder's bos_token, false for none."
        ),
    )
    eos: str | None = Field(default=None, description="Token that ends every document (a spelling).")
    pad: str | None = Field(default=None, description="Token that pads rows (a spelling).")


class TokenizerConfig(Section):
    # No `ge` here: _room_for_merges gives the floor with the specials counted and the fix.
    vocab_size: int = Field(
        default=8192, le=1_000_000, description="Vocabulary size including the 256 byte tokens and the special tokens."
    )
    sentinel_tokens: int = Field(
        default=32, ge=0, le=10_000, description="Span-corruption sentinels <|sentinel_0|>... to reserve."
    )
    reserved_tokens: int = Field(
        default=16,
        ge=0,
        le=100_000,
        description="Unused specials <|reserved_0|>... kept for later objectives or formats without retraining.",
    )
    sample_mb: float = Field(
        default=20.0,
        gt=0,
        description=(
            "MB of curated training text (not held out) to learn merges from, split across sources by source_weights."
        ),
    )
    source_weights: dict[str, Annotated[float, Field(ge=0)]] | None = Field(
        default=None,
        description=(
            "Share of the training sample per source (normalized); None means in proportion to each source's curated "
            "bytes. A source left out is not sampled."
        ),
    )
    heldout_fraction: float = Field(
        default=0.02,
        gt=0,
        lt=1,
        description="Fraction of documents (by id hash) kept out of training and used for the report.",
    )
    heldout_mb: float = Field(
        default=2.0, gt=0, description="At most this many MB of held-out text per source are encoded for the report."
    )
    language_alpha: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "Balance languages (meta.language) in the training sample: each language's share of the sample's bytes "
            "becomes proportional to its natural share to this power; 1 keeps the natural mix, 0.3 (XLM-R, mT5) "
            "lifts small languages, 0 gives all the same share; the report adds a tokenizer of the natural mix "
            "(trained too: twice the training time). None: the natural mix, languages not read."
        ),
    )
    min_frequency: int = Field(default=2, ge=1, description="A pair must occur this many times to become a merge.")
    from_run: str | None = Field(
        default=None,
        description=(
            "Run directory whose tokenizer this run uses unchanged instead of training one (continued "
            "pretraining keeps the starting model's ids), or that run's tokenizer-extended folder (after `kiln "
            "extend-tokenizer`; start from its checkpoint); the settings above are then unused."
        ),
    )

    boundaries: BoundaryConfig | None = Field(
        default=None,
        description=(
            "With from_run of an imported model: the tokens around each document, instead of those its tokenizer "
            "folder gives (bos, eos, pad; see the tokenize summary for what is in use)."
        ),
    )

    @property
    def specials(self) -> list[str]:
        return special_tokens(self.sentinel_tokens, self.reserved_tokens)

    @model_validator(mode="after")
    def _room_for_merges(self) -> TokenizerConfig:
        floor = BYTE_ALPHABET + len(self.specials) + 1
        if self.vocab_size < floor:
            raise ValueError(
                f"vocab_size {self.vocab_size} leaves no room for merges: 256 byte tokens + {len(self.specials)} "
                "special tokens "
                f"({self.sentinel_tokens} sentinels, {self.reserved_tokens} reserved) need at least {floor}; "
                "raise vocab_size or lower sentinel_tokens/reserved_tokens"
            )
        if self.source_weights is not None and not any(w > 0 for w in self.source_weights.values()):
            raise ValueError(
                f"source_weights {self.source_weights} give no source a positive weight; nothing could be sampled"
            )
        return self


class CompareConfig(Section):
    """What `kiln train-tokenizer --compare` measures beside the run's tokenizer (the tokenizer-compare stage's
    settings; the flag sets them, not the recipe)."""

    tokenizers: list[str] = Field(
        default_factory=list,
        description="Run directories, tokenizer folders or tokenizer.json files, in the order given.",
    )


class FimConfig(Section):
    rate: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of train-split documents rearranged for fill-in-the-middle (drawn per document).",
    )
    spm_rate: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Share of the rearranged documents laid out suffix-prefix-middle; the rest prefix-suffix-middle.",
    )
    sources: list[str] | None = Field(
        default=None, description="Sources whose documents may be rearranged (e.g. [code]); None means every source."
    )
    seed: int = Field(default=0, description="Seed of the per-document draws.")


class TokenizeConfig(Section):
    NOT_HASHED = frozenset({"batch_docs", "executor"})  # batching and workers change speed, never the ids
    val_fraction: float = Field(
        default=0.02,
        gt=0,
        lt=1,
        description="Fraction of documents (by id hash) written to the validation split instead of train.",
    )
    dtype: Literal["auto", "uint16", "uint32"] = Field(
        default="auto",
        description="Token shard integer type; auto is uint16 for vocabularies up to 65,536, else uint32.",
    )
    batch_docs: int = Field(default=256, ge=1, description="Documents encoded per call inside a task.")
    executor: ExecutorConfig = Field(
        default_factory=ExecutorConfig,
        description="Where the per-shard encoding tasks run (local process pool or ray).",
    )
    fim: FimConfig | None = Field(
        default=None,
        description=(
            "Fill-in-the-middle for the train split (train.objective fim trains on it); None leaves every document as "
            "it is. Validation documents are never rearranged, so perplexity stays comparable."
        ),
    )
