"""`kiln import-hf DIR --run NAME`: a Llama (or Qwen3) Hugging Face folder as a kiln run.

The folder's config.json becomes a ModelConfig (kiln.model.hf; settings kiln cannot reproduce,
such as RoPE scaling, biases or sliding windows, stop the import with each named), its
safetensors weights (one file, or shards listed in model.safetensors.index.json) are renamed to
kiln's parameters and loaded strictly, and its tokenizer.json must be one kiln made
(kiln.text.tokenizer.adopt). The run gets two stages with manifests, as if it had trained:
`tokenizer/` (tokenizer.json + kiln_tokenizer.json) and `train/checkpoint/` (model.safetensors +
config.json). From there `kiln generate`, `kiln export`, `kiln eval --data FILE`, and continued
pretraining (`train.init_from: runs/NAME/train/checkpoint`, `tokenizer.from_run: runs/NAME`,
the model section printed at the end) work as on a run kiln trained.
Not handled here: PyTorch pickles (`pytorch_model.bin`: kiln never unpickles downloaded files),
tokenizers of other kinds, architectures other than Llama and Qwen3.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

from kiln.core.errors import FatalError
from kiln.core.layout import TOKENIZER, TRAIN, RunLayout
from kiln.core.manifest import Stage
from kiln.evaluate.config import ImportConfig
from kiln.model.config import ModelConfig, count_params
from kiln.model.hf import architecture, from_hf_state, model_config_from_hf
from kiln.model.transformer import Transformer
from kiln.model.weights import save_weights
from kiln.text.tokenizer import KilnTokenizer, adopt

log = logging.getLogger("kiln.import")
INDEX = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files: model.safetensors, or the shards its index lists."""
    if (folder / INDEX).is_file():
        index = json.loads((folder / INDEX).read_text())
        return [folder / name for name in sorted(set(index["weight_map"].values()))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    pickles = sorted(p.name for p in folder.glob("*.bin"))
    raise FatalError(f"{folder}: no model.safetensors or {INDEX}" + (f" (found {', '.join(pickles)}: kiln does not unpickle weights; save them with safe_serialization=True)" if pickles else ""))


def read_folder(folder: Path) -> tuple[ModelConfig, Transformer, KilnTokenizer]:
    """The model (fp32, on the CPU) and tokenizer a Hugging Face folder holds; FatalError naming the first problem."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FatalError(f"{folder}: no config.json; give a Hugging Face model folder")
    cfg = model_config_from_hf(json.loads(config_path.read_text()), str(config_path))
    tokenizer = adopt(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None
    if tokenizer is None:
        raise FatalError(f"{folder}: no tokenizer.json (kiln needs the model's tokenizer to encode text for it)")
    if tokenizer.vocab_size > (cfg.vocab_size or 0):
        raise FatalError(f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens, the model's embedding only {cfg.vocab_size} rows")
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        state |= load_file(str(path))
    model = Transformer(cfg)
    names = [n for n, _ in model.named_parameters()]  # a tied weight once
    weights = {k: v.float() for k, v in from_hf_state(state, cfg, names, str(folder)).items()}
    if cfg.tie_embeddings:
        weights["lm_head.weight"] = weights["embed.weight"]
    shapes = [f"{k}: {tuple(v.shape)} in the folder, {tuple(p.shape)} for the config" for k, v in weights.items() if (p := model.state_dict()[k]).shape != v.shape]
    if shapes:
        raise FatalError(f"{folder}: weights do not fit config.json: {'; '.join(shapes[:3])}")
    model.load_state_dict(weights, strict=True)
    return cfg, model.eval(), tokenizer


def run(cfg: ImportConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    folder, run_dir = Path(cfg.source), Path(run_dir)
    layout = RunLayout(run_dir)
    model_cfg, model, tokenizer = read_folder(folder)
    arch = architecture(model_cfg)
    files = [folder / "config.json", folder / "tokenizer.json", *weight_files(folder)]
    tok_stage = Stage(run_dir, TOKENIZER, {"import": cfg}, inputs=[folder / "tokenizer.json"])
    if not tok_stage.up_to_date(force):
        tok_stage.begin()
        outputs = tokenizer.save(tok_stage.dir / layout.tokenizer_json.name)
        tok_stage.finish(outputs, {"vocab_size": tokenizer.vocab_size, "imported_from": str(folder)}, f"vocab {tokenizer.vocab_size:,}, imported from {folder}")
    stage = Stage(run_dir, TRAIN, {"import": cfg}, inputs=files, upstream=[TOKENIZER])
    if done := stage.up_to_date(force, lambda m: f"{m['counts']['params']:,} params from {folder}"):
        return done
    stage.begin()
    outputs = save_weights(stage.dir / layout.checkpoint.name, model)
    section = yaml.safe_dump({"model": {k: v for k, v in model_cfg.model_dump(mode="json").items() if v is not None}}, sort_keys=False)
    summary = (f"{arch} with {count_params(model_cfg):,} params imported from {folder} into {layout.checkpoint}\n"
               f"continued pretraining: train.init_from: {layout.checkpoint}, tokenizer.from_run: {run_dir}, and this model section:\n{section}")
    counts = {"params": count_params(model_cfg), "architecture": arch, "imported_from": str(folder)}
    return stage.finish(outputs, counts, summary, extra={"model": model_cfg.model_dump(mode="json")})
