"""The `mix` recipe section: how training sequences are drawn from sources."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from kiln.core.config import Section


class MixConfig(Section):
    weights: dict[str, Annotated[float, Field(ge=0)]] | None = Field(default=None, description="Sampling weight per source (>= 0, normalized); None means proportional to each source's train tokens. A source left out is not sampled.")
    seed: int = Field(default=0, description="Seed of the sampler's random stream.")

    @model_validator(mode="after")
    def _some_weight(self) -> MixConfig:
        if self.weights is not None and not any(w > 0 for w in self.weights.values()):
            raise ValueError(f"weights {self.weights} give no source a positive weight; nothing could be sampled")
        if self.weights is not None and not math.isfinite(sum(self.weights.values())):
            raise ValueError(f"weights {self.weights} sum to infinity; use relative weights such as 1 and 3")
        return self
