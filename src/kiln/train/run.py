"""The train stage: skip-or-redo, then kiln.train.loop.train, then counts, summary and manifest.

The caller (kiln.pipeline) wires in the data: `make_rows(seq_len, split)` builds a RowSource
(kiln.mix's sampler in a kiln run) and `data_config` is the recipe section that configured it,
hashed with `model` and `train` so that different data redoes the stage. The objective's
collator (kiln.train.collate) turns its windows into batches; for any objective but plain clm,
fixed validation batches built the same way are scored at each validation. The scoring
settings shape only the monitoring evaluations, so they are not hashed.
Not handled here: resuming an interrupted run from its checkpoint (it starts over).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.core.layout import CHECKPOINT, TOKENIZE, TRAIN, RunLayout
from kiln.core.manifest import Stage, read_manifest, recorded_outputs
from kiln.model.batch import Batch, RowSource
from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.model.perplexity import ScoringConfig
from kiln.text.tokenizer import KilnTokenizer
from kiln.train.collate import build_collator
from kiln.train.config import TrainConfig
from kiln.train.loop import train
from kiln.train.objectives import check_objectives, token_ids

# Validation rows for an objective's own loss: at most this many micro-batches.
MAX_OBJECTIVE_VAL_BATCHES = 32

log = logging.getLogger("kiln.train")


def objective_val_batches(make_rows: Callable[[int, str], RowSource], cfg: TrainConfig, scoring: ScoringConfig, ids: Any) -> list[Batch] | None:
    """Fixed held-out batches built by the objective (the same rows at every validation), or None for plain clm."""
    if cfg.objectives == {"clm": 1.0} and not cfg.masks_documents("clm"):
        return None  # the perplexity scorer already measures exactly this
    val = build_collator(make_rows(cfg.seq_len, "val"), cfg, ids)
    n = min(MAX_OBJECTIVE_VAL_BATCHES, max(1, scoring.max_tokens_per_source * len(val.sources) // (cfg.micro_batch_size * cfg.seq_len)))
    return [val.next_batch(cfg.micro_batch_size) for _ in range(n)]


def run(model_cfg: ModelConfig, cfg: TrainConfig, data_config: Section, make_rows: Callable[[int, str], RowSource], scoring: ScoringConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
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
    vocab_size = tokenized["counts"]["vocab_size"]
    if model_cfg.vocab_size is not None and model_cfg.vocab_size < vocab_size:
        raise ConfigError(f"model.vocab_size {model_cfg.vocab_size} is below the tokenizer's {vocab_size} ids; leave it unset to take the tokenizer's")
    model_cfg = model_cfg.resolved(vocab_size)
    # Everything below stops before begin(): an objective the tokenizer or shards cannot serve,
    # a window longer than every source's tokens.
    ids = token_ids(KilnTokenizer.load(layout.tokenizer_json))
    check_objectives(cfg.objectives, cfg.seq_len, cfg.span_corruption, ids, tokenized["config"]["tokenize"].get("fim"))
    batches = build_collator(make_rows(cfg.seq_len, "train"), cfg, ids)
    val_batches = objective_val_batches(make_rows, cfg, scoring, ids)
    stage.begin()
    result = train(model_cfg, cfg, batches, scoring, run_dir, stage.dir, val_batches)

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
