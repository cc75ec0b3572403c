"""The train stage: skip-or-redo, then kiln.train.loop.train, then counts, summary and manifest.

The caller (kiln.pipeline) wires in the data: `make_batches(seq_len)` builds the BatchSource
(kiln.mix's sampler in a kiln run) and `data_config` is the recipe section that configured it,
hashed with `model` and `train` so that different data redoes the stage. The scoring settings
shape only the monitoring evaluations, so they are not hashed.
Not handled here: resuming an interrupted run from its checkpoint (it starts over).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.core.config import Section
from kiln.core.layout import CHECKPOINT, TOKENIZE, TRAIN, RunLayout
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.model.batch import BatchSource
from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.model.perplexity import ScoringConfig
from kiln.train.config import TrainConfig
from kiln.train.loop import train

log = logging.getLogger("kiln.train")


def run(model_cfg: ModelConfig, cfg: TrainConfig, data_config: Section, make_batches: Callable[[int], BatchSource], scoring: ScoringConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    tokenize_dir = layout.token_shards
    tokenized = read_manifest(tokenize_dir)
    inputs = [layout.tokenizer_json, *(p for p in recorded_outputs(tokenize_dir) if p.suffix in (".bin", ".idx"))]
    # data_config is recorded under "mix", the recipe section a kiln run configures its data with.
    stage = Stage(run_dir, TRAIN, {"model": model_cfg, "train": cfg, "mix": data_config}, inputs, upstream=[TOKENIZE])
    if done := stage.up_to_date(force, lambda m: f"{m['counts']['steps']} steps, val loss {m['counts']['val_after']['all']['loss']:.3f}"):
        return done
    # Until resuming exists, checkpoints of an earlier run are never overwritten: --force moves them aside.
    stage.refuse_to_replace([CHECKPOINT], "checkpoints of an earlier training run (resuming is not supported yet)", force)
    model_cfg = model_cfg.resolved(tokenized["counts"]["vocab_size"])
    batches = make_batches(cfg.seq_len)  # a window longer than every source's tokens stops here, before begin()
    stage.begin()
    result = train(model_cfg, cfg, batches, scoring, run_dir, stage.dir)

    n_params = count_params(model_cfg)
    fpt = flops_per_token(model_cfg, cfg.seq_len)
    tokens_trained = cfg.steps * cfg.tokens_per_step
    counts = {
        "params": n_params,
        "params_non_embedding": count_params(model_cfg, include_embeddings=False),
        "steps": cfg.steps,
        "tokens_trained": tokens_trained,
        "tokens_by_source": batches.tokens_by_source(),
        "flops_per_token": fpt,
        "train_flops": fpt * tokens_trained,
        "final_train_loss": round(result.final_loss, 5),
        "val_before": result.val_before,
        "val_after": result.val_after,
        "device": str(result.device),
    }
    before, after = result.val_before, result.val_after
    lines = [f"{n_params:,} params, {cfg.steps} steps, {tokens_trained:,} tokens on {result.device}"]
    if before:
        lines.append(f"validation loss {before['all']['loss']:.3f} -> {after['all']['loss']:.3f} nats/token, bpb {before['all']['bpb']:.3f} -> {after['all']['bpb']:.3f}")
    else:
        lines.append(f"validation loss {after['all']['loss']:.3f} nats/token, bpb {after['all']['bpb']:.3f}")
    extra = {"model": model_cfg.model_dump(mode="json"), "monitoring_eval": scoring.model_dump(mode="json")}
    return stage.finish(result.checkpoint, counts, "\n".join(lines), extra=extra, logs=[stage.dir / layout.metrics.name])
