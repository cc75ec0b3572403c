"""The `train.schedule` section and the learning rate it gives: linear warmup, then cosine decay to a floor.

lr(step) for step = 1..steps: warmup reaches the peak (train.optim.lr) at step warmup_steps;
cosine falls from the peak to min_lr_ratio * peak at the last step.
Not handled here: WSD (the trainer issue).
"""

from __future__ import annotations

import math

from pydantic import Field

from kiln.core.config import Section


class ScheduleConfig(Section):
    warmup_steps: int = Field(default=30, ge=0, description="Linear warmup steps from 0 to train.optim.lr; below train.steps.")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="Cosine decay floor as a fraction of train.optim.lr.")


def lr_at(step: int, peak: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    if step <= warmup_steps:
        return peak * step / max(warmup_steps, 1)
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    floor = peak * min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
