"""The `eval` and `generate` recipe sections."""

from __future__ import annotations

from pydantic import Field

from kiln.core.config import Section


class EvalConfig(Section):
    NOT_HASHED = frozenset({"batch_size"})
    seq_len: int | None = Field(default=None, ge=2, description="Window length for validation loss (tokens); None means the seq_len the checkpoint was trained with.")
    max_tokens_per_source: int = Field(default=65536, ge=1, description="Validation tokens scored per source (from the start of its split).")
    batch_size: int = Field(default=8, ge=1, description="Windows per forward pass.")


class GenerateConfig(Section):
    prompt: str = Field(default="def ", description="Text the sample continues.")
    max_new_tokens: int = Field(default=80, ge=1, description="Tokens to generate (stops early at end of document).")
    temperature: float = Field(default=0.8, ge=0, description="Softmax temperature; 0 means greedy.")
    top_k: int | None = Field(default=50, ge=1, description="Keep only the k most likely tokens; None disables.")
    top_p: float | None = Field(default=0.95, gt=0, le=1, description="Nucleus sampling: keep the smallest set with this much probability; None disables.")
    seed: int = Field(default=0, description="Sampling seed.")
