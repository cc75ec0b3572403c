"""Building a model: the same seed gives the same initial weights on any device.

The trainer builds its model here, and evaluation rebuilds the untrained model from the train
stage's config and seed to score the "before" numbers. `build_model` constructs on the CPU
(PyTorch's per-layer default initialisers draw from the seeded generator too) and then calls
`Transformer.init_weights()`: the draw order every kiln checkpoint so far was initialised with.
A model built under `torch.device("meta")`, materialised with `to_empty(device=...)` and then
given init_weights() is as well initialised but not with the same draws for a seed (the meta
constructor draws nothing); that path suits weights that get loaded or sharded anyway.
Not handled here: sharding (kiln.train) or loading trained weights (kiln.model.weights).
"""

from __future__ import annotations

import torch

from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer


def build_model(cfg: ModelConfig, seed: int, device: str | torch.device) -> Transformer:
    """The initialised model on `device`; bit-identical weights for the same config and seed."""
    torch.manual_seed(seed)  # same seed, same initial weights, on any device
    model = Transformer(cfg)
    model.init_weights()
    return model.to(device)
