"""A model's weights on disk: `model.safetensors` (tied embeddings stored once) and `config.json`
(the resolved ModelConfig with its format version).

Every stage that reads or writes a model goes through here: the trainer's checkpoints, evaluation,
generation and the tokenizer extension. A checkpoint can also be written and read tensor by tensor
(save_streamed, checked_tensors: an import or an export holds one tensor, never the model); its
tensors may then be in any float dtype (an import keeps the folder's bf16), since every loader
copies them into the model it built, in that model's dtype.
Not handled here: training state (optimizer, sampler, RNG; kiln.train.checkpoint) or sharded
checkpoints across processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from kiln.core.atomic import replace_dir
from kiln.core.errors import FatalError
from kiln.core.hardware import available_memory, check_memory
from kiln.model.config import ModelConfig, build_bytes, count_params
from kiln.model.safetensors_stream import SafetensorsWriter, TensorSpec, header_specs, open_safetensors
from kiln.model.transformer import Transformer

FORMAT = "kiln-checkpoint v1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"


def write_config(folder: Path, cfg: ModelConfig) -> Path:
    (folder / CONFIG).write_text(json.dumps({"format": FORMAT, "model": cfg.model_dump(mode="json")}, indent=2) + "\n")
    return folder / CONFIG


def write_weights(folder: Path, model: Transformer) -> list[Path]:
    """Write the weights and config into an existing folder; returns the two paths."""
    save_model(model, str(folder / WEIGHTS))
    return [folder / WEIGHTS, write_config(folder, model.cfg)]


def save_weights(folder: Path, model: Transformer) -> list[Path]:
    """Weights and config only (no training state), swapped in whole: a model to start another run from."""
    replace_dir(folder, lambda tmp: write_weights(tmp, model))
    return [folder / WEIGHTS, folder / CONFIG]


def weights_file(folder: Path) -> Path:
    """The checkpoint's model.safetensors; FatalError saying what the folder holds instead."""
    path = folder / WEIGHTS
    if not path.is_file():
        raise FatalError(
            f"{path}: missing; the checkpoint folder holds only "
            f"{', '.join(sorted(p.name for p in folder.iterdir())) or 'nothing'}"
        )
    return path


def parameter_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape by kiln name, in the model's order, a tied output projection once (as
    embed.weight, the name save_model keeps): from a model built on the meta device, so no memory."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def tied_metadata(cfg: ModelConfig) -> dict[str, str] | None:
    """What safetensors' save_model records of a tied output projection it leaves out (None: nothing)."""
    return {"lm_head.weight": "embed.weight"} if cfg.tie_embeddings else None


def save_streamed(
    folder: Path, cfg: ModelConfig, specs: list[TensorSpec], fill: Callable[[SafetensorsWriter], object]
) -> list[Path]:
    """A checkpoint written tensor by tensor (`fill` writes every spec, named and shaped as
    parameter_shapes says, in any float dtype) with its config, swapped in whole; the same names
    and metadata as save_weights, so every loader reads it."""
    assert {s.name: s.shape for s in specs} == parameter_shapes(cfg), "a checkpoint holds the model's parameters"

    def write(tmp: Path) -> None:
        with SafetensorsWriter(tmp / WEIGHTS, specs, tied_metadata(cfg)) as writer:
            fill(writer)
        write_config(tmp, cfg)

    replace_dir(folder, write)
    return [folder / WEIGHTS, folder / CONFIG]


def checked_tensors(folder: Path, cfg: ModelConfig) -> dict[str, TensorSpec]:
    """The checkpoint's tensors from its header alone (no data read), in the model's order, each
    checked against `cfg`; FatalError naming the file and what differs. Read them with
    open_safetensors(folder / WEIGHTS, ...)."""
    path = weights_file(folder)
    with open_safetensors(path, "the file is damaged or truncated: train again, or restore it") as f:
        stored = header_specs(f, path)
    expected = parameter_shapes(cfg)
    missing, unexpected = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or unexpected:
        raise FatalError(
            f"{path}: the weights do not match {folder / CONFIG} (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}); the two files are from different models"
        )
    for name, shape in expected.items():
        if stored[name].shape != shape:
            raise FatalError(
                f"{path}: {name} is {stored[name].shape}, {folder / CONFIG} makes it {shape}; the two files are from "
                "different models"
            )
    return {name: stored[name] for name in expected}


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
    path = weights_file(folder)
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
