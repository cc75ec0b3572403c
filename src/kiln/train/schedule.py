"""The `train.schedule` section and the learning rate it gives: linear warmup, then a decay to a floor.

lr(step) for step = 1..steps: warmup reaches the peak (train.optim.lr) at step warmup_steps (given as a
number, or as warmup_fraction of the steps: round(fraction x steps), at most steps - 1); then
  cosine  falls along half a cosine to min_lr_ratio * peak at the last step;
  linear  falls in a straight line to the floor at the last step;
  wsd     (warmup-stable-decay) holds the peak, then falls linearly to the floor over the last
          decay_fraction of the steps, so a run can be cut or extended before its decay starts
          and checkpoints of the stable phase can be annealed later.
Not handled here: per-group learning rates (kiln.train.optim scales them from this one).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from kiln.core.config import Section


class ScheduleConfig(Section):
    kind: Literal["cosine", "linear", "wsd"] = Field(
        default="cosine",
        description=(
            "Decay after warmup: cosine, linear, or wsd (constant, then a linear decay over the last decay_fraction "
            "of the steps)."
        ),
    )
    warmup_steps: int | None = Field(
        default=30,
        ge=0,
        description="Linear warmup steps from 0 to train.optim.lr; below train.steps. Not with warmup_fraction.",
    )
    warmup_fraction: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description=(
            "Warmup as a share of train.steps instead of warmup_steps: round(fraction x steps) steps, at most steps - "
            "1, so it fits any run length."
        ),
    )
    min_lr_ratio: float = Field(
        default=0.1, ge=0, le=1, description="The floor the decay ends at, as a fraction of train.optim.lr."
    )
    decay_fraction: float = Field(
        default=0.2, gt=0, le=1, description="wsd: share of all steps spent decaying at the end."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_warmup(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("warmup_fraction") is None:
            if "warmup_steps" in data and data["warmup_steps"] is None:
                raise ValueError(
                    "warmup_steps is null and warmup_fraction is not set; give one of them, e.g. warmup_fraction: 0.1"
                )
            return data
        if data.get("warmup_steps") is not None:
            raise ValueError(
                f"warmup_steps ({data['warmup_steps']}) and warmup_fraction ({data['warmup_fraction']}) are both "
                "set; keep one"
                " (on the command line, --set train.schedule.warmup_fraction=null or "
                "train.schedule.warmup_steps=null drops the other)"
            )
        return {**data, "warmup_steps": None}  # the default of 30 steps does not apply: the fraction decides

    def warmup(self, steps: int) -> int:
        """Warmup steps of a run of `steps` steps: warmup_steps, or the fraction's share of them."""
        if self.warmup_fraction is None:
            assert self.warmup_steps is not None  # _one_warmup leaves one of the two
            return self.warmup_steps
        # Round to the nearest step (round() also absorbs float noise: 0.29 * 100 is 28.999...);
        # at most steps - 1, so that a fraction near 1 of a short run still leaves a step after warmup.
        return min(round(self.warmup_fraction * steps), steps - 1)

    def stable_until(self, steps: int) -> int | None:
        """wsd: the last step at the peak lr (the decay takes the steps after it); None for other kinds."""
        return wsd_decay_start(self.warmup(steps), steps, self.decay_fraction) if self.kind == "wsd" else None


def wsd_decay_start(warmup_steps: int, total_steps: int, decay_fraction: float) -> int:
    """The last step of a wsd schedule's stable phase: its decay takes round(decay_fraction x steps) steps (at least
    one) after it."""
    return max(total_steps - max(1, round(decay_fraction * total_steps)), warmup_steps)


def lr_at(
    step: int,
    peak: float,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
    kind: str = "cosine",
    decay_fraction: float = 0.2,
) -> float:
    if step <= warmup_steps:
        return peak * step / max(warmup_steps, 1)
    floor = peak * min_lr_ratio
    if kind == "wsd":
        decay_start = wsd_decay_start(warmup_steps, total_steps, decay_fraction)
        if step <= decay_start:
            return peak
        return peak + (floor - peak) * min((step - decay_start) / max(total_steps - decay_start, 1), 1.0)
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if kind == "linear":
        return peak + (floor - peak) * progress
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
