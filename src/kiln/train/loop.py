"""The training loop: one `train()` that reads top to bottom, its setup in `build_*` functions.

Per optimizer step: grad_accum_steps micro-batches of micro_batch_size windows of seq_len
tokens (tokens per step = their product), loss scaled by 1/grad_accum_steps so gradients
average, global-norm clipping, AdamW, lr from warmup + cosine. Validation runs before step 1
(the untrained baseline, loss near ln(vocab)) and after the last step.
Monitoring and checkpointing are hooks (kiln.train.hooks) called around each step.
Not handled here: DDP/FSDP (kiln.train.distributed, later), resume from a checkpoint, NaN and
loss-spike rollback (the trainer-at-scale issue).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from kiln.core.errors import FatalError
from kiln.core.layout import CHECKPOINT, TOKENIZE, TRAIN, RunLayout
from kiln.core.manifest import Stage, read_manifest
from kiln.core.tokenshards import open_split
from kiln.evaluate.config import EvalConfig
from kiln.mix.config import MixConfig
from kiln.mix.sampler import Sampler
from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.model.init import build_model
from kiln.model.perplexity import validation_scorer
from kiln.model.transformer import lm_loss
from kiln.train.config import TrainConfig
from kiln.train.hooks import Checkpointer, Hook, StepState
from kiln.train.monitor import Monitor
from kiln.train.optim import build_optimizer
from kiln.train.schedule import lr_at

log = logging.getLogger("kiln.train")


def build_device(cfg: TrainConfig) -> tuple[torch.device, torch.dtype | None]:
    """The device and the autocast dtype (None = plain fp32)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise FatalError("train.device is cuda but no CUDA device is visible; use train.device=auto or cpu")
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    precision = cfg.precision if cfg.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    return device, (torch.bfloat16 if precision == "bf16" else None)


def build_sampler(tokenize_dir: Path, mix: MixConfig, cfg: TrainConfig) -> Sampler:
    # verify: a damaged .bin of the right length would otherwise train silently on garbage.
    return Sampler(open_split(tokenize_dir, "train", verify=True), mix.weights, cfg.seq_len, mix.seed)


def train(model_cfg: ModelConfig, cfg: TrainConfig, mix: MixConfig, eval_cfg: EvalConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    tokenize_dir = layout.token_shards
    tokenized = read_manifest(tokenize_dir)
    tok_path = layout.tokenizer_json
    inputs = [tok_path, *sorted(tokenize_dir.glob("*/*.bin")), *sorted(tokenize_dir.glob("*/*.idx"))]
    # eval settings only shape the monitoring evaluations, not the model: they are not hashed here.
    stage = Stage(run_dir, TRAIN, {"model": model_cfg, "train": cfg, "mix": mix}, inputs, upstream=[TOKENIZE])
    if not force and (done := stage.current_manifest()):
        log.info("train: up to date (%d steps, val loss %.3f); nothing to do. Use --force to redo.", done["counts"]["steps"], done["counts"]["val_after"]["all"]["loss"])
        return done
    stage.begin()

    device, amp_dtype = build_device(cfg)
    model_cfg = model_cfg.resolved(tokenized["counts"]["vocab_size"])
    model = build_model(model_cfg, cfg.seed, device)
    optimizer = build_optimizer(model, cfg)
    sampler = build_sampler(tokenize_dir, mix, cfg)
    fpt = flops_per_token(model_cfg, cfg.seq_len)
    evaluate = validation_scorer(run_dir, eval_cfg.seq_len or cfg.seq_len, eval_cfg.max_tokens_per_source, eval_cfg.batch_size)
    n_params = count_params(model_cfg)
    log.info("train: %s params (%s without embeddings) on %s, %d steps of %d tokens", f"{n_params:,}", f"{count_params(model_cfg, False):,}", device, cfg.steps, cfg.tokens_per_step)
    monitor = Monitor(stage.dir / layout.metrics.name, cfg.steps, fpt, device)
    checkpointer = Checkpointer(stage.dir / CHECKPOINT, cfg.checkpoint_every)
    hooks: list[Hook] = [monitor, checkpointer]

    val_before = None
    if cfg.eval_at_start:
        val_before = evaluate(model)
        monitor.write({"step": 0, "eval": val_before})
        log.info("train: step 0 validation loss %.3f (ln V = %.3f)", val_before["all"]["loss"], math.log(model_cfg.vocab_size))

    model.train()
    state = StepState(step=0, model=model, optimizer=optimizer, sampler=sampler, tokens=cfg.tokens_per_step)
    for hook in hooks:
        hook.on_start(state)
    n_sources = len(sampler.sources)
    for step in range(1, cfg.steps + 1):
        lr = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # Per-source sums of per-sequence mean losses and sequence counts, kept on device.
        source_loss = torch.zeros(n_sources, device=device)
        source_rows = torch.zeros(n_sources, device=device)
        for _ in range(cfg.grad_accum_steps):
            windows, which = sampler.batch(cfg.micro_batch_size)  # (B, T+1) int64 and (B,) on host
            batch_BT1 = torch.from_numpy(windows).to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                logits_BTV = model(batch_BT1[:, :-1])
            loss_BT = lm_loss(logits_BTV, batch_BT1[:, 1:], reduction="none").view_as(batch_BT1[:, 1:])
            # Every row has T targets, so the mean over rows of row means is the token mean.
            loss = loss_BT.mean() / cfg.grad_accum_steps
            loss.backward()
            which_B = torch.from_numpy(which).to(device)
            source_loss.index_add_(0, which_B, loss_BT.detach().mean(dim=1))
            source_rows.index_add_(0, which_B, torch.ones_like(which_B, dtype=source_rows.dtype))
        # clip_grad_norm_ returns the pre-clip norm; with grad_clip None we still measure it (max_norm=inf).
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # host sync: once per step, for the log line and the NaN check.
        per_source = (source_loss / source_rows.clamp(min=1)).tolist()
        rows = source_rows.tolist()
        state.step, state.lr, state.grad_norm = step, lr, grad_norm.item()
        state.loss = float(source_loss.sum().item() / max(sum(rows), 1))
        state.loss_by_source = {s: per_source[i] for i, s in enumerate(sampler.sources) if rows[i]}
        if not math.isfinite(state.loss):
            raise FatalError(f"train: loss became {state.loss} at step {step}; lower train.lr or raise warmup_steps")
        for hook in hooks:
            hook.after_step(state)

    for hook in hooks:  # the checkpoint is on disk before anything else can fail
        hook.on_end(state)
    val_after = evaluate(model)
    monitor.write({"step": cfg.steps, "eval": val_after})
    monitor.close()

    tokens_trained = cfg.steps * cfg.tokens_per_step
    counts = {
        "params": n_params,
        "params_non_embedding": count_params(model_cfg, include_embeddings=False),
        "steps": cfg.steps,
        "tokens_trained": tokens_trained,
        "tokens_by_source": sampler.tokens_by_source(),
        "flops_per_token": fpt,
        "train_flops": fpt * tokens_trained,
        "final_train_loss": round(state.loss, 5),
        "val_before": val_before,
        "val_after": val_after,
        "device": str(device),
    }
    lines = [f"{n_params:,} params, {cfg.steps} steps, {tokens_trained:,} tokens on {device}"]
    if val_before:
        lines.append(f"validation loss {val_before['all']['loss']:.3f} -> {val_after['all']['loss']:.3f} nats/token, bpb {val_before['all']['bpb']:.3f} -> {val_after['all']['bpb']:.3f}")
    else:
        lines.append(f"validation loss {val_after['all']['loss']:.3f} nats/token, bpb {val_after['all']['bpb']:.3f}")
    extra = {"model": model_cfg.model_dump(mode="json"), "monitoring_eval": eval_cfg.model_dump(mode="json")}
    return stage.finish(checkpointer.paths, counts, "\n".join(lines), extra=extra, logs=[stage.dir / layout.metrics.name])
