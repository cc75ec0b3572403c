"""Adaptive mixing: move weight towards the sources whose validation loss improves slowest.

Every mix.adaptive.every steps the trainer scores each source's validation loss and hands it
here. Against the previous measurement, each source's relative improvement r = (before - now) /
before is ranked on [0, 1] between the slowest (1) and the fastest (0) improver; its factor is
multiplied by (1 + step_size) ** (2 * rank - 1): the slowest source's factor grows by
step_size, the fastest one's shrinks by as much, the others' in between. The shares move a little
more than the factors (they are renormalised: three equal sources, step_size 0.2, the slowest
goes from 1/3 to 0.419). The sampler applies the factors
to the recipe's weights and a floor per source. The returned record says why, per source.
Not handled here: scoring (kiln.train) or drawing rows (kiln.mix.sampler).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.mix.config import AdaptiveConfig


def reweight(
    sources: Sequence[str],
    factors: np.ndarray,
    before: Mapping[str, float],
    now: Mapping[str, float],
    cfg: AdaptiveConfig,
) -> dict[str, Any] | None:
    """Update `factors` in place from two measurements; None on the first one (nothing to compare).

    The record holds each measured source's losses and improvement; the sampler adds the weights
    before and after.
    """
    measured = [i for i, s in enumerate(sources) if s in before and s in now and before[s] > 0]
    if len(measured) < 2:
        return None  # first measurement, or fewer than two sources with validation data
    rel = np.array([(before[sources[i]] - now[sources[i]]) / before[sources[i]] for i in measured])
    spread = rel.max() - rel.min()
    rank = (rel.max() - rel) / spread if spread > 0 else np.full(len(rel), 0.5)  # 1 = slowest improver
    for i, r in zip(measured, rank, strict=True):
        factors[i] *= (1 + cfg.step_size) ** (2 * r - 1)
    slowest = sources[measured[int(np.argmax(rank))]]
    return {
        "adaptive": {
            sources[i]: {
                "val_loss_before": round(before[sources[i]], 5),
                "val_loss": round(now[sources[i]], 5),
                "improvement": round(float(rel[k]), 5),
            }
            for k, i in enumerate(measured)
        },
        "reason": (
            f"{slowest} improved slowest ({float(rel[int(np.argmax(rank))]):+.2%} vs up to {float(rel.max()):+.2%}); "
            f"its weight grows by up to {cfg.step_size:.0%}"
        ),
    }
