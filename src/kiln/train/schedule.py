"""The `train.schedule` section and the learning rate it gives: linear warmup, then a decay to a floor.

lr(step) for step = 1..steps: warmup reaches the peak (train.optim.lr) at step warmup_steps; then
  cosine  falls along half a cosine to min_lr_ratio * peak at the last step;
  linear  falls in a straight line to the floor at the last step;
  wsd     (warmup-stable-decay) holds the peak, then falls linearly to the floor over the last
          decay_fraction of the steps, so a run can be cut or extended before its decay starts
          and checkpoints of the stable phase can be annealed later.
Not handled here: per-group learning rates (kiln.train.optim scales them from this one).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from kiln.core.config import Section


class ScheduleConfig(Section):
    kind: Literal["cosine", "linear", "wsd"] = Field(default="cosine", description="Decay after warmup: cosine, linear, or wsd (constant, then a linear decay over the last decay_fraction of the steps).")
    warmup_steps: int = Field(default=30, ge=0, description="Linear warmup steps from 0 to train.optim.lr; below train.steps.")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="The floor the decay ends at, as a fraction of train.optim.lr.")
    decay_fraction: float = Field(default=0.2, gt=0, le=1, description="wsd: share of all steps spent decaying at the end.")


def lr_at(step: int, peak: float, warmup_steps: int, total_steps: int, min_lr_ratio: float, kind: str = "cosine", decay_fraction: float = 0.2) -> float:
    if step <= warmup_steps:
        return peak * step / max(warmup_steps, 1)
    floor = peak * min_lr_ratio
    if kind == "wsd":
        decay_steps = max(1, round(decay_fraction * total_steps))
        decay_start = max(total_steps - decay_steps, warmup_steps)
        if step <= decay_start:
            return peak
        return peak + (floor - peak) * min((step - decay_start) / max(total_steps - decay_start, 1), 1.0)
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if kind == "linear":
        return peak + (floor - peak) * progress
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
