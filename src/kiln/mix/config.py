"""The `mix` recipe section: how training sequences are drawn from sources."""

from __future__ import annotations

from pydantic import Field

from kiln.core.config import Section


class MixConfig(Section):
    weights: dict[str, float] | None = Field(default=None, description="Sampling weight per source (normalized); None means proportional to each source's train tokens. A source left out is not sampled.")
    seed: int = Field(default=0, description="Seed of the sampler's random stream.")
