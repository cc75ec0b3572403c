"""Training checkpoints: the model's weights (kiln.model.weights) plus `train_state.pt` (optimizer,
step, sampler and torch RNG state, enough to continue the exact run), swapped in whole.

Not handled here: sharded or async checkpoints across processes (the trainer-at-scale issue).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kiln.core.atomic import replace_dir
from kiln.model.transformer import Transformer
from kiln.model.weights import write_weights

TRAIN_STATE = "train_state.pt"


def save_checkpoint(folder: Path, model: Transformer, train_state: dict[str, Any]) -> list[Path]:
    """Write the checkpoint beside `folder`, then swap it in; a crash keeps the previous one."""

    def write(tmp: Path) -> None:
        write_weights(tmp, model)
        torch.save(train_state, tmp / TRAIN_STATE)

    replace_dir(folder, write)
    return [folder / "model.safetensors", folder / "config.json", folder / TRAIN_STATE]
