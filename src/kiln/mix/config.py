"""The `mix` recipe section: which sources training rows come from, in what order, and how often.

Weights are per source, each a constant or a piecewise-linear schedule of training progress
(kiln.mix.schedule); `curriculum` orders each source's documents for the first share of
training; `adaptive` moves weight towards the sources whose validation loss improves slowest;
`replay` mixes in a fixed share of another run's data (continued pretraining); `language_alpha`
weights languages by temperature over the sources' languages (kiln.mix.languages).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.mix.schedule import Schedule, check_schedule, value_at

# Document keys a curriculum can order by: the token count, or a score curation wrote in the
# document's meta (kiln.curate.steps.quality, kiln.curate.steps.language), carried to the token
# shards by the tokenize stage.
META_KEYS = ("quality_score", "perplexity", "language_score")


class CurriculumConfig(Section):
    key: Literal["length", "quality_score", "perplexity", "language_score"] = Field(
        default="length", description="Order documents by their token count or by a score curation left in their meta."
    )
    descending: bool = Field(
        default=False,
        description=(
            "Largest first (e.g. quality_score); the default is smallest first (short documents, low perplexity)."
        ),
    )
    until: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description=(
            "Share of training (progress) the order holds for; after it, the rest of each source's first epoch is "
            "shuffled, and later epochs are too."
        ),
    )
    buckets: int | None = Field(
        default=None,
        ge=2,
        description=(
            "Cut the order into this many equal buckets, shuffled inside each (coarse ordering); None keeps the exact "
            "order."
        ),
    )


class AdaptiveConfig(Section):
    every: int = Field(
        default=50, ge=1, description="Steps between reweightings; each scores every source's validation loss."
    )
    step_size: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description=(
            "Largest relative change of one source's weight factor in one reweighting (0.2: x1.2 for the slowest "
            "improver, /1.2 for the fastest; shares then renormalise)."
        ),
    )
    floor: float = Field(default=0.05, ge=0, lt=1, description="No source's share falls below this.")


class ReplayConfig(Section):
    run: str = Field(
        description=(
            "Run directory whose train token shards are replayed (the run the starting model was trained on); it must "
            "use this run's tokenizer (tokenizer.from_run)."
        )
    )
    fraction: float = Field(
        gt=0,
        lt=1,
        description=(
            "Share of the rows drawn from it, spread over its sources as its own training read them; the rest follow "
            "`weights` over this run's sources."
        ),
    )


class MixConfig(Section):
    weights: dict[str, Schedule] | None = Field(
        default=None,
        description=(
            "Per source: a weight (>= 0, normalized with the others) or a schedule [[progress, weight], ...] of "
            "training progress; None means proportional to each source's train tokens. A source left out is not "
            "sampled."
        ),
    )
    language_alpha: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=(
            "Weight languages (curate's meta.language, counted per source by the tokenize stage) by temperature: "
            "each language's share of the rows is proportional to its train tokens to this power (1 natural, 0.3 as "
            "XLM-R and mT5 lifts small languages, 0 gives every language the same share); `weights` then only share "
            "a language among its sources (kiln.mix.languages). None: sources weighted alone, languages not read."
        ),
    )
    seed: int = Field(default=0, description="Seed of the sampler: document orders per epoch and each row's source.")
    lanes: int = Field(
        default=64,
        ge=1,
        description=(
            "Parts each source's epoch is dealt into; successive rows of a source come from successive parts, so a "
            "batch holds many documents, not consecutive pieces of one."
        ),
    )
    max_epochs: float = Field(
        default=4.0,
        gt=0,
        description=(
            "A source planned to repeat more than this many times over training gets a warning (or an error, "
            "on_overrepeat)."
        ),
    )
    on_overrepeat: Literal["warn", "error"] = Field(
        default="warn",
        description="What a source planned beyond max_epochs does: warn and train, or stop before training.",
    )
    curriculum: CurriculumConfig | None = Field(
        default=None,
        description=(
            "Order each source's documents (short first, or by a curation score) for the first share of training; "
            "None shuffles from the start."
        ),
    )
    adaptive: AdaptiveConfig | None = Field(
        default=None,
        description=(
            "Every N steps, move weight towards the sources whose validation loss improves slowest (bounded steps, a "
            "floor per source); None keeps the recipe's weights."
        ),
    )
    report_windows: int = Field(
        default=10,
        ge=1,
        description=(
            "Windows of steps the realized mixture (tokens per source against the intended weights) is reported over."
        ),
    )
    replay: ReplayConfig | None = Field(
        default=None,
        description=(
            "Continued pretraining: mix in a share of another run's training data (sources named <run>/<source>) "
            "against forgetting; None draws only from this run's sources."
        ),
    )

    @model_validator(mode="after")
    def _replay(self) -> MixConfig:
        if self.replay is not None and self.adaptive is not None:
            # The adaptive factors and floor act on every source drawn: the replayed share would drift from
            # replay.fraction.
            raise ValueError(
                "mix.replay and mix.adaptive together would move the replayed share away from replay.fraction; "
                "use one of them"
            )
        return self

    @model_validator(mode="after")
    def _weights(self) -> MixConfig:
        if self.weights is None:
            return self
        for source, schedule in self.weights.items():
            check_schedule(schedule, f"weights.{source}")
        points = sorted({0.0, 1.0, *(p for s in self.weights.values() if not isinstance(s, int | float) for p, _ in s)})
        for p in points:
            at_p = [value_at(s, p) for s in self.weights.values()]
            if not any(w > 0 for w in at_p):
                raise ValueError(
                    f"weights {self.weights} give no source a positive weight at progress {p}; nothing could be sampled"
                )
            if not math.isfinite(sum(at_p)):
                raise ValueError(
                    f"weights {self.weights} sum to infinity at progress {p}; use relative weights such as 1 and 3"
                )
        return self
