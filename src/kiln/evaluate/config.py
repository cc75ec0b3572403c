"""The `eval` and `generate` recipe sections.

`eval` is the validation scorer's settings (kiln.model.perplexity.ScoringConfig, shared with the
trainer's monitoring evaluations) plus where and in what precision the eval stage runs the model.
"""

from __future__ import annotations

from pydantic import Field

from kiln.core.config import Section
from kiln.model.perplexity import ScoringConfig
from kiln.model.precision import PrecisionConfig


class EvalConfig(ScoringConfig):
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig, description="Device and matmul precision of the eval stage (auto: bf16 autocast on cuda, fp32 on cpu).")

    def scoring(self) -> ScoringConfig:
        """The scoring settings alone: what the trainer's monitoring evaluations take."""
        return ScoringConfig.model_validate(self.model_dump(include=set(ScoringConfig.model_fields)))


class GenerateConfig(Section):
    prompt: str = Field(default="def ", description="Text the sample continues.")
    max_new_tokens: int = Field(default=80, ge=1, description="Tokens to generate (stops early at end of document).")
    temperature: float = Field(default=0.8, ge=0, description="Softmax temperature; 0 means greedy.")
    top_k: int | None = Field(default=50, ge=1, description="Keep only the k most likely tokens; None disables.")
    top_p: float | None = Field(default=0.95, gt=0, le=1, description="Nucleus sampling: keep the smallest set with this much probability; None disables.")
    seed: int = Field(default=0, description="Sampling seed.")
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig, description="Device and matmul precision of sampling (auto: bf16 autocast on cuda, fp32 on cpu).")
