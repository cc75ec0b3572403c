"""Building a model: the same seed gives the same initial weights on any device.

The trainer builds its model here, and evaluation rebuilds the untrained model from the train
stage's config and seed to score the "before" numbers.
Not handled here: sharding (kiln.train) or loading trained weights (kiln.model.weights).
"""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer


def build_model(cfg: ModelConfig, seed: int, device: torch.device) -> Transformer:
    torch.manual_seed(seed)  # same seed, same initial weights, on any device
    return Transformer(cfg).to(device)
