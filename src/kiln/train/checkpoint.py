"""Checkpoints: safetensors weights, the model config, and the training state.

A checkpoint folder holds `model.safetensors` (tied embeddings stored once), `config.json`
(the resolved ModelConfig, with its format version) and `train_state.pt` (optimizer, step,
sampler and torch RNG state, enough to continue the exact run).
Not handled here: sharded or async checkpoints across processes (the trainer-at-scale issue).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from kiln.core.errors import FatalError
from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer

FORMAT = "kiln-checkpoint v1"


def save_checkpoint(folder: Path, model: Transformer, train_state: dict[str, Any]) -> list[Path]:
    """Write the checkpoint beside `folder`, then swap it in.

    A crash while writing leaves the old checkpoint in place; a crash during the two renames
    leaves a complete one under `<folder>.old` or `<folder>.tmp`.
    """
    return _swap_in(folder, model, train_state)


def save_weights(folder: Path, model: Transformer) -> list[Path]:
    """Weights and config only (no training state): a model to start another run from."""
    return _swap_in(folder, model, None)


def _swap_in(folder: Path, model: Transformer, train_state: dict[str, Any] | None) -> list[Path]:
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps({"format": FORMAT, "model": model.cfg.model_dump(mode="json")}, indent=2) + "\n")
    if train_state is not None:
        torch.save(train_state, tmp / "train_state.pt")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old)
    return [folder / "model.safetensors", folder / "config.json"] + ([folder / "train_state.pt"] if train_state is not None else [])


def load_trained_model(folder: Path, device: str | torch.device = "cpu") -> Transformer:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FatalError(f"{folder}: no checkpoint (config.json missing); run `kiln train` first")
    meta = json.loads(config_path.read_text())
    if meta.get("format") != FORMAT:
        raise FatalError(f"{config_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    model = Transformer(ModelConfig.model_validate(meta["model"]))
    load_model(model, str(folder / "model.safetensors"), device=str(device))
    return model.to(device).eval()
