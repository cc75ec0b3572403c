"""The `tokenizer` (training) and `tokenize` (encoding) recipe sections."""

from __future__ import annotations

from pydantic import Field

from kiln.core.config import Section

EOT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOT, PAD)
BYTE_ALPHABET = 256


class TokenizerConfig(Section):
    vocab_size: int = Field(default=8192, ge=BYTE_ALPHABET + len(SPECIAL_TOKENS) + 1, le=1_000_000, description="Vocabulary size including the 256 byte tokens and the special tokens.")
    sample_mb: float = Field(default=20.0, gt=0, description="MB of curated training text (not held out) to learn merges from, split across sources by size.")
    heldout_fraction: float = Field(default=0.02, gt=0, lt=1, description="Fraction of documents (by id hash) kept out of training and used to report bytes per token.")
    heldout_mb: float = Field(default=2.0, gt=0, description="At most this many MB of held-out text are encoded for the report.")
    min_frequency: int = Field(default=2, ge=1, description="A pair must occur this many times to become a merge.")


class TokenizeConfig(Section):
    NOT_HASHED = frozenset({"batch_docs"})  # batching changes speed, never the ids
    val_fraction: float = Field(default=0.02, gt=0, lt=1, description="Fraction of documents (by id hash) written to the validation split instead of train.")
    batch_docs: int = Field(default=512, ge=1, description="Documents per encode_batch call.")
