"""A model's weights on disk: `model.safetensors` (tied embeddings stored once) and `config.json`
(the resolved ModelConfig with its format version).

Every stage that reads or writes a model goes through here: the trainer's checkpoints, evaluation,
generation and the tokenizer extension. Not handled here: training state (optimizer, sampler,
RNG; kiln.train.checkpoint) or sharded checkpoints across processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from kiln.core.atomic import replace_dir
from kiln.core.errors import FatalError
from kiln.core.hardware import available_memory, check_memory
from kiln.model.config import ModelConfig, build_bytes, count_params
from kiln.model.transformer import Transformer

FORMAT = "kiln-checkpoint v1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"


def write_weights(folder: Path, model: Transformer) -> list[Path]:
    """Write the weights and config into an existing folder; returns the two paths."""
    save_model(model, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(
        json.dumps({"format": FORMAT, "model": model.cfg.model_dump(mode="json")}, indent=2) + "\n"
    )
    return [folder / WEIGHTS, folder / CONFIG]


def save_weights(folder: Path, model: Transformer) -> list[Path]:
    """Weights and config only (no training state), swapped in whole: a model to start another run from."""
    replace_dir(folder, lambda tmp: write_weights(tmp, model))
    return [folder / WEIGHTS, folder / CONFIG]


def checkpoint_config(folder: Path) -> ModelConfig:
    """The ModelConfig a checkpoint folder was saved with (its format checked)."""
    config_path = folder / CONFIG
    if not config_path.is_file():
        raise FatalError(f"{folder}: no checkpoint (config.json missing); run `kiln train` first")
    try:
        meta = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FatalError(
            f"{config_path}: not a kiln checkpoint config ({type(e).__name__}: {e}); it is damaged, or not from kiln"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FatalError(
            f"{config_path}: format {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}"
        )
    try:
        return ModelConfig.model_validate(meta["model"])
    except KeyError:
        raise FatalError(f"{config_path}: no model section; it is damaged, or not from kiln") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise FatalError(
            f"{config_path}: model.{'.'.join(map(str, first['loc']))}: {first['msg']}; the file is damaged"
        ) from None


def _load(model: Transformer, folder: Path, device: str) -> None:
    """safetensors' load into `model`, its failures as one line naming the file."""
    path = folder / WEIGHTS
    if not path.is_file():
        raise FatalError(
            f"{path}: missing; the checkpoint folder holds only "
            f"{', '.join(sorted(p.name for p in folder.iterdir())) or 'nothing'}"
        )
    try:
        load_model(model, str(path), device=device)
    except (SafetensorError, OSError, ValueError) as e:
        raise FatalError(
            f"{path}: cannot be read as safetensors ({type(e).__name__}: {e}); the file is damaged or truncated: "
            "train again, or restore it"
        ) from None
    except RuntimeError as e:  # shapes or names that are not the config's
        first = str(e).strip().splitlines()
        raise FatalError(
            f"{path}: the weights do not match {folder / CONFIG} "
            f"({first[1].strip() if len(first) > 1 else first[0] if first else 'unknown'}); the two files are "
            "from different models"
        ) from None


def architecture(cfg: ModelConfig) -> dict[str, object]:
    """What a checkpoint's weights mean: the config less how it was spelt (a preset, a width
    multiplier instead of the width) and less what only shapes training (z-loss, the init)."""
    spelt = cfg.model_dump(
        mode="json",
        exclude={"preset", "ffn_multiplier", "ffn_hidden", "n_kv_heads", "z_loss", "init_std", "init_depth_scale"},
    )
    return spelt | {"ffn_hidden": cfg.hidden, "n_kv_heads": cfg.kv_heads}


def load_weights_into(model: Transformer, folder: Path) -> None:
    """Copy a checkpoint's weights into `model` (same device and dtype as it has), which must have
    the checkpoint's architecture: a difference stops with each differing key named."""
    saved = architecture(checkpoint_config(folder))
    differ = [
        f"model.{k}: {saved.get(k)!r} in the checkpoint, {v!r} here"
        for k, v in architecture(model.cfg).items()
        if saved.get(k) != v
    ]
    if differ:
        raise FatalError(
            f"{folder}: the checkpoint is a different model: {'; '.join(differ)}. Give the model section the "
            "checkpoint's shape"
        )
    _load(model, folder, str(next(model.parameters()).device))


def load_trained_model(folder: Path, device: str | torch.device = "cpu") -> Transformer:
    """The checkpoint's model, in eval mode on `device`; stops before building one this machine cannot hold."""
    cfg = checkpoint_config(folder)
    check_memory(
        f"{folder / CONFIG}: a {count_params(cfg):,}-parameter model (fp32)",
        build_bytes(cfg),
        available_memory(),
        "this machine",
        "the config is damaged or the model too big for this machine",
    )
    model = Transformer(cfg)
    _load(model, folder, str(device))
    return model.to(device).eval()
