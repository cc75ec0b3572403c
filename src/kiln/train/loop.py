"""The training loop: one `train()` that reads top to bottom, its setup in `build_*` functions.

Per optimizer step: the step's shape (kiln.train.geometry: sequence length, rows, RoPE base;
tokens per step = train.global_batch_tokens outside batch-size warmup) in micro-batches of
micro_batch_size * seq_len tokens, each a Batch from the BatchSource the
caller hands in (kiln.model.batch; the objective's collator over kiln.mix's sampler in a kiln
run), with the attention rule and positions the batch carries; the loss sums each batch's kept
positions and divides by the kept positions of the whole step, so gradients average per token;
global-norm clipping; AdamW; lr from warmup + cosine. What follows a step is called by name in
the loop: `monitor.log_step`, `maybe_checkpoint`, `maybe_eval` (validation before step 1, the
untrained baseline near ln(vocab), and after the last step; with an objective other than clm
also that objective's loss on fixed validation batches), `maybe_adapt` (an adaptive mixture's
reweighting from per-source validation losses), and the realized mixture per window of steps.
Stage bookkeeping (manifest, skip-or-redo, counts) is kiln.train.run's; wrapping the model for
data and tensor parallelism is kiln.train.distributed's and kiln.train.tensor_parallel's over the
mesh of kiln.train.mesh, the resumable states kiln.train.resume's. A NaN,
Inf or loss spike (kiln.train.rollback's guard) rolls the run back to its newest resumable state;
the replayed stream skips the rows that faulted.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kiln.core.errors import FatalError
from kiln.core.hardware import available_memory, check_memory
from kiln.core.layout import CHECKPOINT, RunLayout
from kiln.model.batch import Batch, BatchSource
from kiln.model.config import ModelConfig, build_bytes, count_params, flops_per_token, matmul_params
from kiln.model.init import build_model
from kiln.model.perplexity import ScoringConfig, validation_scorer
from kiln.model.precision import Precision, resolve_precision
from kiln.model.transformer import Transformer
from kiln.model.weights import load_weights_into
from kiln.train.checkpoint import maybe_checkpoint
from kiln.train.config import TrainConfig
from kiln.train.context_parallel import ContextSplit
from kiln.train.distributed import apply_activation_checkpointing, apply_compile, clip_grad_norm, model_state_bytes, parallelize, unwrap
from kiln.train.loss import Loss, fused_lm_loss, lm_loss, logits_loss
from kiln.train.mesh import ParallelConfig, Ranks, one_process
from kiln.train.monitor import MixtureWindows, Monitor, truncate_metrics
from kiln.train.optim import build_optimizer
from kiln.train.pipeline_parallel import Pipeline, StagesInTurn, keep_stage, last_stage_results, rank_stages, stage_layers
from kiln.train.resume import STATES, States
from kiln.train.rollback import Guard
from kiln.train.tensor_parallel import WholeWindows, apply_tensor_parallel, vocab_parallel_loss

log = logging.getLogger("kiln.train")

Scorer = Callable[[Transformer], dict[str, Any]]
MakeProbe = Callable[[torch.dtype | None], Scorer]


@dataclass(frozen=True)
class TrainResult:
    device: torch.device
    final_loss: float  # the last step's training loss (nats/token)
    val_before: dict[str, Any] | None  # None when train.eval_at_start is off
    val_after: dict[str, Any]
    checkpoint: list[Path]  # the files of the final checkpoint
    tokens_trained: int  # over all steps and ranks
    train_flops: int  # model FLOPs over all steps (each step at its own sequence length)
    mixture: list[dict[str, Any]]  # realized mixture per window of steps (MixtureWindows)
    rollbacks: int  # rollbacks after a NaN, Inf or loss spike (kiln.train.rollback)
    model_states_mb: list[dict[str, float]]  # per rank: weights, gradients and optimizer states it held after its first step


def build_precision(cfg: TrainConfig) -> Precision:
    """The device and autocast dtype; also sets torch's CPU threads (train.threads)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return resolve_precision(cfg.precision, "train")


def build_scorer(run_dir: Path, scoring: ScoringConfig, cfg: TrainConfig, precision: Precision, objective_batches: list[Batch] | None, reference_runs: Sequence[Path] = ()) -> Scorer:
    """Validation in the training precision, on windows of the training length unless scoring.seq_len says otherwise.

    With objective_batches (held-out rows built by the training objective), the results also
    carry that objective's loss on them under "objective". reference_runs: runs whose validation
    splits are scored too (sources `<run>/<source>`).
    """
    perplexity = validation_scorer(run_dir, scoring.model_copy(update={"seq_len": scoring.seq_len or cfg.seq_len}), precision.amp_dtype, reference_runs)
    if not objective_batches:
        return perplexity
    return lambda model: {**perplexity(model), "objective": objective_loss(model, objective_batches, precision)}


def build_monitor(path: Path, cfg: TrainConfig, device: torch.device, model_cfg: ModelConfig, world: int) -> Monitor:
    monitor = Monitor(path, cfg.steps, device, world)
    # Printed so that MFU can be compared with other tools' accounting.
    peak = f"{monitor.peak:.3g} FLOP/s ({world} x the device's dense bf16 peak)" if monitor.peak else "unknown for this device (MFU not reported)"
    log.info("train: MFU = tokens/s x FLOPs per token / peak; FLOPs per token = 6 x %s matmul weights + 12 x layers x seq_len x d_attn = %s at seq_len %d (PaLM appendix B, kiln.model.config); peak %s", f"{matmul_params(model_cfg):,}", f"{flops_per_token(model_cfg, cfg.seq_len):,}", cfg.seq_len, peak)
    return monitor


def maybe_adapt(evaluate: Scorer, model: Transformer, batches: BatchSource, monitor: Monitor, step: int, progress: float, every: int | None, cfg: TrainConfig) -> None:
    """Every `every` steps but the last (an adaptive mixture), score each source's validation loss and hand it to the mixture."""
    if not every or step % every or step == cfg.steps:
        return
    results = evaluate(model)
    monitor.log_eval(step, results, "adaptive")
    record = batches.observe(step, progress, {s: r["loss"] for s, r in results["sources"].items()})
    if record is not None:
        monitor.write({"step": step, **record})


def objective_loss(model: Transformer, batches: list[Batch], precision: Precision) -> dict[str, Any]:
    """Mean loss per kept position of the objective over fixed batches (nats), and the positions counted."""
    was_training = model.training
    model.eval()
    nats, kept = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(precision.device)
            with precision.autocast():
                logits_BTV = model(batch.input_ids_BT, rule=batch.rule(), positions_BT=batch.positions_BT)
            loss = lm_loss(logits_BTV, batch)
            nats += float((loss.row_mean_B * loss.row_tokens_B).sum())  # host sync per batch
            kept += int(loss.row_tokens_B.sum())
    model.train(was_training)
    return {"loss": nats / max(kept, 1), "tokens": kept}


def maybe_eval(evaluate: Scorer, model: Transformer, monitor: Monitor, step: int, cfg: TrainConfig) -> dict[str, Any] | None:
    """Validate before step 1 (if train.eval_at_start), every train.eval_every steps, and after the
    last step; the results of the first and the last (the manifest's before and after), else None."""
    periodic = bool(cfg.eval_every) and 0 < step < cfg.steps and step % cfg.eval_every == 0  # type: ignore[operator]
    kind = "final" if step == cfg.steps else "start" if step == 0 and cfg.eval_at_start else "periodic" if periodic else None
    if kind is None:
        return None
    results = evaluate(model)  # switches to eval mode and back; one host sync per validation batch
    monitor.log_eval(step, results, kind)
    if step == 0:
        log.info("train: step 0 validation loss %.3f (ln V = %.3f)", results["all"]["loss"], math.log(model.cfg.vocab_size or 1))
    return None if kind == "periodic" else results


def maybe_probe(probe: Scorer | None, model: Transformer, monitor: Monitor, step: int, cfg: TrainConfig) -> None:
    """Every train.probe_every steps and after the last: the probe set's document losses and greedy
    continuations. Every rank runs it (FSDP2 gathers shards), rank 0 logs it."""
    if probe is None or (step % cfg.probe_every and step != cfg.steps):  # type: ignore[operator]
        return
    monitor.log_probe(step, probe(model))


class StopRequest:
    """Turns SIGTERM and SIGINT into a request the loop honours between steps (a schedulers' preemption
    notice, Ctrl-C): the step finishes, a resumable state is written, and the run stops."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self.request)

    def request(self, signum: int, frame: Any) -> None:
        log.warning("train: %s received; saving a resumable state after this step", signal.Signals(signum).name)
        self.requested = True

    def agreed(self, ranks: Ranks) -> bool:
        """Whether any rank was asked to stop (a collective with several ranks: every rank stops together)."""
        return ranks.any(self.requested)

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():  # the caller's handlers again, however the loop ended
            signal.signal(sig, handler)


def compiling(cfg: TrainConfig, device: torch.device) -> bool:
    """train.compile, where None means on for cuda and off on the CPU."""
    return cfg.compile if cfg.compile is not None else device.type == "cuda"


def fuses_loss(cfg: TrainConfig, precision: Precision) -> bool:
    return cfg.fused_loss and precision.amp_dtype != torch.float16


def build_head(model_cfg: ModelConfig, cfg: TrainConfig, precision: Precision, tp: int = 1) -> Callable[..., Loss]:
    """The training loss as the model's head, head(hidden, output matrix, soft-cap, batch=, step_tokens=):
    over the vocabulary shards with tp (inside Ranks.loss_context), chunked through the output layer
    with train.fused_loss (not for fp16), else over the logits made whole."""
    if tp > 1:
        return partial(vocab_parallel_loss, late_position_weight=cfg.late_position_weight)
    if fuses_loss(cfg, precision):
        chunk = cfg.loss_chunk_tokens or max(1, (2**28 if precision.device.type == "cuda" else 2**23) // (model_cfg.vocab_size or 1))
        return partial(fused_lm_loss, z_loss=model_cfg.z_loss, late_position_weight=cfg.late_position_weight, chunk=chunk, compiled=compiling(cfg, precision.device))
    return partial(logits_loss, z_loss=model_cfg.z_loss, late_position_weight=cfg.late_position_weight)


def build_loss(model_cfg: ModelConfig, cfg: TrainConfig, precision: Precision, tp: int = 1) -> Callable[[nn.Module, Batch, int], Loss]:
    """loss_of(model, batch on the device, kept positions of the step): the forward pass and the training loss."""
    if tp > 1 or fuses_loss(cfg, precision):
        head = build_head(model_cfg, cfg, precision, tp)

        def headed(model: nn.Module, batch: Batch, step_tokens: int) -> Loss:
            with precision.autocast():  # the output layer's matmuls in the autocast dtype, the cross-entropy in fp32
                return model(batch.input_ids_BT, rule=batch.rule(), positions_BT=batch.positions_BT, head=partial(head, batch=batch, step_tokens=step_tokens))

        return headed
    # Compiled along with the blocks: one fused pass over the (B, T, V) logits for the log-softmax,
    # the target gather and the mask, and one back (eager reads and writes them several times).
    plain_loss = torch.compile(lm_loss) if compiling(cfg, precision.device) else lm_loss

    def plain(model: nn.Module, batch: Batch, step_tokens: int) -> Loss:
        # Plain causal rows without document ids take SDPA's is_causal fast path.
        with precision.autocast():
            logits_BTV = model(batch.input_ids_BT, rule=batch.rule(), positions_BT=batch.positions_BT)  # (B, T, V) fp32
        return plain_loss(logits_BTV, batch, step_tokens, model_cfg.z_loss, cfg.late_position_weight)  # outside autocast: fp32

    return plain


# Bytes per parameter of the model states a rank keeps, all fp32 (kiln's master weights): weights 4,
# gradients 4, AdamW's two moments 8 (kiln.plan.memory's fp32 figure); Muon keeps one momentum for
# the blocks' matrices (AdamW's two for the rest), so at least 12.
STATE_BYTES = {"adamw": 16, "muon": 12}


def check_model_fits(model_cfg: ModelConfig, cfg: TrainConfig, ranks: Ranks) -> None:
    """Stop before building a model this process cannot hold. Every process on this host builds the
    whole fp32 model on the CPU (kiln.model.init) before any sharding; on the CPU its share of the
    model states then stays there, on a GPU it must fit in the device's free memory."""
    params = count_params(model_cfg)
    states = STATE_BYTES[cfg.optim.name] * params / (ranks.tp * ranks.pp * ranks.shard * ranks.cp)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's processes on this host
    host = local * max(build_bytes(model_cfg), states if ranks.device.type == "cpu" else 0)
    fix = "choose a smaller model section (`kiln plan memory` sizes one), or train on a machine with more memory"
    check_memory(f"train: a {params:,}-parameter model ({local} process(es) on this host, fp32)", host, available_memory(), "this machine", fix)
    if ranks.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ranks.device)  # host-device sync, once
        check_memory(f"train: the model states of {params:,} parameters (fp32 weights, gradients and {cfg.optim.name} state over {ranks.describe()})", states, free, str(ranks.device),
                     "shard them over more GPUs (parallel.dp_shard, tp, pp; `kiln plan memory` gives a layout) or choose a smaller model section")


def build_parallel_model(model_cfg: ModelConfig, cfg: TrainConfig, precision: Precision, ranks: Ranks, parallel: ParallelConfig, layers: list[range]) -> tuple[nn.Module, Transformer]:
    """(the model the loop steps: wrapped for data parallelism, the Transformer inside it); layers:
    every pipeline stage's layers (with pp > 1)."""
    check_model_fits(model_cfg, cfg, ranks)
    core = build_model(model_cfg, cfg.seed, ranks.device)  # the same seed on every rank: the same initial weights
    if cfg.init_from:  # continued pretraining: every rank reads the same starting weights
        load_weights_into(core, Path(cfg.init_from))
    if ranks.pp > 1:  # each rank keeps its stages' blocks of the whole model it built
        keep_stage(core, {i for s in rank_stages(len(layers), ranks.pp, ranks.stage) for i in layers[s]}, ranks.stage == 0, ranks.stage == ranks.pp - 1)
    if ranks.tp > 1:  # each rank keeps its slices of the whole matrices it built
        apply_tensor_parallel(core, ranks.mesh["tp"], parallel.sequence_parallel)
    apply_activation_checkpointing(core, cfg.activation_checkpointing, cfg.checkpoint_every_k_blocks)
    if compiling(cfg, ranks.device):
        apply_compile(core)
    model = parallelize(core, ranks, parallel, precision.amp_dtype)
    return model, unwrap(model)  # type: ignore[return-value]


def step_rows(micro_batches: list[Batch], sources: list[str], ranks: Ranks) -> list[tuple[int, str]]:
    """(row index in the global stream, source) of every row of a step, over all data ranks (a
    collective); empty when the batches do not carry row indices."""
    if any(b.index_B is None for b in micro_batches):
        return []
    index = torch.cat([b.index_B for b in micro_batches])  # type: ignore[misc]
    source = torch.cat([b.source_B.cpu() for b in micro_batches])
    # The step's rows are one contiguous run of the stream; data rank 0 holds its first rows.
    first = int(ranks.all_sum(torch.tensor([int(index.min()) if ranks.data_rank == 0 else 0], device=ranks.device)).item())
    table = torch.zeros(len(index) * ranks.data_world, dtype=torch.long)
    table[index - first] = source + 1
    table = ranks.all_sum(table.to(ranks.device)).cpu()
    return [(first + i, sources[int(s) - 1]) for i, s in enumerate(table.tolist()) if s]


def describe_rows(rows: list[tuple[int, str]]) -> str:
    if not rows:
        return "rows unknown (the batch source gives no row indices)"
    by_source = {s: sum(1 for _, r in rows if r == s) for s in dict.fromkeys(r for _, r in rows)}
    return f"rows {rows[0][0]}..{rows[-1][0]} of the stream (" + ", ".join(f"{n} {s}" for s, n in by_source.items()) + ")"


def train(model_cfg: ModelConfig, cfg: TrainConfig, batches: BatchSource, scoring: ScoringConfig, run_dir: Path, out_dir: Path, objective_batches: list[Batch] | None = None, adapt_every: int | None = None, report_windows: int = 10, ranks: Ranks | None = None, parallel: ParallelConfig | None = None, resume_from: Path | None = None, reference_runs: Sequence[Path] = (), make_probe: MakeProbe | None = None) -> TrainResult:
    """Train a model (model_cfg with its vocab_size resolved; fresh, or train.init_from's weights) on `batches`; metrics and checkpoint go to out_dir.

    objective_batches: held-out batches built by the training objective, scored at each validation.
    adapt_every: steps between the adaptive mixture's reweightings (None: the mixture is fixed).
    report_windows: windows of steps the realized mixture is reported over.
    ranks, parallel: this process's place among the data-parallel ranks (None: one process).
    resume_from: a complete resumable state (kiln.train.resume) to continue from.
    reference_runs: other runs whose validation splits are scored too (continued pretraining's replay).
    make_probe: builds the probe set's scorer for the autocast dtype (kiln.pipeline wires eval.probe in); used with train.probe_every.
    """
    precision = build_precision(cfg)
    ranks = ranks or one_process(precision.device)
    parallel = parallel or ParallelConfig()
    device = ranks.device
    layers = stage_layers(model_cfg, ranks.pp * parallel.pp_stages_per_rank, parallel.pp_layers) if ranks.pp > 1 else []  # every pipeline stage's layers
    model, core = build_parallel_model(model_cfg, cfg, precision, ranks, parallel, layers)
    loss_of = build_loss(model_cfg, cfg, precision, ranks.tp)
    optimizer = build_optimizer(model, cfg.optim)
    parameters = list(model.parameters())
    # Pipeline stages: the schedule runs each step's micro-batches; evaluation runs the stages in turn.
    pipeline = Pipeline(core, ranks, parallel.pp_schedule, layers, build_head(model_cfg, cfg, precision, ranks.tp), precision.amp_dtype or torch.float32, precision.autocast) if ranks.pp > 1 else None
    stages = ranks.stage_group if pipeline else None
    context = ContextSplit(ranks.cp_group, ranks.cp, ranks.mesh.get_local_rank("cp")) if ranks.cp > 1 else None  # each rank trains on its share of every window
    scored = StagesInTurn(core, ranks, layers) if pipeline else WholeWindows(core, ranks.tp) if ranks.tp > 1 and parallel.sequence_parallel else core
    # fp16 autocast needs dynamic loss scaling (bf16 has fp32's exponent range and does not).
    scaler = torch.amp.GradScaler(device.type, enabled=precision.amp_dtype == torch.float16)
    evaluate = build_scorer(run_dir, scoring, cfg, precision, objective_batches, reference_runs)
    probe = make_probe(precision.amp_dtype) if make_probe is not None and cfg.probe_every else None
    if pipeline:  # the last stage scores; every rank gets its results
        evaluate = last_stage_results(evaluate, ranks)
        probe = probe and last_stage_results(probe, ranks)
    mixture = MixtureWindows(batches.sources, cfg.steps, report_windows)
    # A wsd run keeps a state at its last stable step: a longer run goes on from there (kiln.train.extend).
    keep = frozenset({cfg.stable_until}) if cfg.stable_until is not None and cfg.stable_until < cfg.steps else frozenset()
    states = States(out_dir / STATES, ranks, cfg.checkpoint.every, cfg.checkpoint.keep_last, cfg.checkpoint.keep_every, cfg.checkpoint.async_save, keep)
    # With fp16 an overflowing gradient is the loss scaler's to handle (it skips the step).
    guard = Guard(cfg.rollback, check_grad_norm=not scaler.is_enabled())
    metrics_path = out_dir / RunLayout(run_dir).metrics.name

    def restore(folder: Path, rollback: bool = False) -> dict[str, Any]:
        """Load a resumable state into everything the loop carries; a rollback keeps the guard's
        rollbacks, skips and lowered-lr window as they are now."""
        saved = states.load(folder, model, optimizer, cfg)
        batches.load_state_dict(saved["batches"])
        mixture.load_state_dict(saved["mixture"])
        if "guard" in saved:  # states written before rollbacks existed have none
            guard.load_state_dict(saved["guard"], history_only=rollback)
        scaler.load_state_dict(saved.get("scaler", {}))
        if ranks.is_main:
            truncate_metrics(metrics_path, saved["step"])
        return saved

    saved = restore(resume_from) if resume_from else None
    start = saved["step"] if saved else 0
    if saved:
        log.info("train: resuming after step %d from %s", start, resume_from)
    elif ranks.is_main:
        truncate_metrics(metrics_path, 0)
    monitor = build_monitor(metrics_path, cfg, device, model_cfg, ranks.world)
    log.info("train: %s params (%s without embeddings) on %s x %d (%s), %d steps of %d tokens (%d micro-batches of %d x %d per data rank)", f"{count_params(model_cfg):,}", f"{count_params(model_cfg, False):,}", device.type, ranks.world, ranks.describe(), cfg.steps, cfg.tokens_per_step, cfg.grad_accum_steps, cfg.micro_batch_size, cfg.seq_len)

    # every rank scores (FSDP2 gathers shards); rank 0 logs
    val_before = saved["val_before"] if saved else maybe_eval(evaluate, scored, monitor, 0, cfg)
    model.train()
    monitor.start(step=start)
    n_sources = len(batches.sources)
    checkpoint: list[Path] = []
    val_after = None
    step_loss = float("nan")
    tokens_trained, train_flops = (saved["tokens_trained"], saved["train_flops"]) if saved else (0, 0)

    def resumable() -> dict[str, Any]:
        """What a resumable state holds besides model, optimizer and RNGs (JSON)."""
        return {"batches": batches.state_dict(), "mixture": mixture.state_dict(), "tokens_trained": tokens_trained, "train_flops": train_flops, "val_before": val_before, "guard": guard.state_dict(), "scaler": scaler.state_dict()}

    step = start
    held: dict[str, float] = {}
    try:
        with StopRequest() as stop:  # SIGTERM / SIGINT: finish the step, save a resumable state, stop
            while step < cfg.steps:
                step += 1
                # This step's sequence length, rows and RoPE base (phases, batch-size warmup).
                shape = cfg.geometry(step)
                # The phase's RoPE base, or the model's own before any phase sets one (also after a rollback to such a step).
                if (theta := shape.rope_theta if shape.rope_theta is not None else model_cfg.rope_theta) != core.cfg.rope_theta:
                    core.set_rope_theta(theta)  # a long-context phase begins (or, rolled back, has not yet)
                    log.info("train: step %d: seq_len %d, RoPE base %g", step, shape.seq_len, theta)
                lr = cfg.lr(step) * guard.lr_scale(step)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group["lr_scale"]  # Muon's matrices have their own peak
                # Per-source sums of per-row mean losses and row counts, kept on the device: no sync per micro-batch.
                source_loss = torch.zeros(n_sources, device=device)
                source_rows = torch.zeros(n_sources, device=device)
                # The step's micro-batches, drawn on the host: ids, targets, loss mask (B, T), source per
                # row (B,), the attention rule's tensors. Drawn first because the loss divides by the
                # kept positions of the whole step, which the masks (on the host, no sync) give.
                t_data = time.perf_counter()
                for _ in range(guard.skips.get(step, 0)):  # rows that made this step fault before a rollback
                    skipped = step_rows([batches.next_batch(rows, shape.seq_len, shape.progress) for rows in shape.micro_batches], list(batches.sources), ranks)
                    if ranks.is_main:
                        log.warning("train: step %d: skipping %s, which faulted before", step, describe_rows(skipped))
                micro_batches = [batches.next_batch(rows, shape.seq_len, shape.progress) for rows in shape.micro_batches]
                data_wait_s = time.perf_counter() - t_data
                # sync point with several ranks: the kept positions of the step over all of them.
                step_tokens = int(ranks.all_sum(torch.tensor([sum(int(b.loss_mask_BT.sum()) for b in micro_batches)], device=device)).item())
                bubble = None
                if pipeline:  # forward and backward of every micro-batch through the stages; per-row losses on the last
                    rows_loss, idle = pipeline.step(micro_batches, step_tokens)
                    pipeline.sum_tied_grads()  # a tied embedding: its copies on the first and last stage each get both gradients
                    bubble = min(idle)  # the slowest stage's idle share; the others also wait on it
                    if rows_loss is not None:
                        source_B = torch.cat([b.source_B for b in micro_batches]).to(device)
                        source_loss.index_add_(0, source_B, rows_loss.row_mean_B)
                        source_rows.index_add_(0, source_B, (rows_loss.row_tokens_B > 0).to(source_rows.dtype))
                for i, batch in enumerate(micro_batches if not pipeline else []):
                    batch = batch.to(device) if context is None else context.share(batch.to(device))
                    last = i == len(micro_batches) - 1
                    # DDP all-reduces gradients only after the step's last micro-batch.
                    sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last else nullcontext()
                    with sync, ranks.loss_context():  # forward and backward both inside DDP's no_sync (and tp's loss_parallel)
                        # Summed over kept positions and divided by step_tokens, so the accumulated gradient is
                        # that of the step's token mean. Expected: about ln V at step 1 (9.01 nats for 8192 tokens).
                        loss = loss_of(model, batch, step_tokens)
                        # grad_scale: DDP and FSDP2 average over ranks; the step's gradient is the sum of the ranks' shares.
                        scaler.scale(loss.value * ranks.grad_scale).backward()
                    # sync point with cp: each row's loss over the positions of the whole group.
                    row_mean_B, row_tokens_B = (loss.row_mean_B, loss.row_tokens_B) if context is None else context.whole_rows(loss)
                    source_loss.index_add_(0, batch.source_B, row_mean_B)
                    source_rows.index_add_(0, batch.source_B, (row_tokens_B > 0).to(source_rows.dtype))
                scaler.unscale_(optimizer)  # fp16: gradients back to their true scale before the norm (no-op otherwise)
                # The pre-clip norm over every shard; with grad_clip None we still measure it (max_norm=inf).
                grad_norm = clip_grad_norm(parameters, cfg.optim.grad_clip or float("inf"), stages, pipeline.copies if pipeline else None)
                scaler.step(optimizer)  # fp16: skipped when a gradient overflowed, and the scale shrinks
                scaler.update()
                if not held:  # what the planner's memory model counts, measured where it can be (on a CPU too)
                    held = {k: round(v / 2**20, 3) for k, v in model_state_bytes(parameters, optimizer).items()}
                optimizer.zero_grad(set_to_none=True)

                # host sync: once per step, for the log line and the fault check. The step loss weights
                # every row alike: the token mean when every row keeps all T targets (next-token).
                ranks.all_sum(source_loss, stages=True), ranks.all_sum(source_rows, stages=True)  # every rank's rows (a collective; the last stage's losses)
                per_source, rows = (source_loss / source_rows.clamp(min=1)).tolist(), source_rows.tolist()
                step_loss = float(source_loss.sum().item() / max(sum(rows), 1))
                # Every rank sees the same reduced loss and norm, so every rank takes the same decision.
                fault = guard.check(step_loss, grad_norm.item())
                offending = step_rows(micro_batches, list(batches.sources), ranks) if fault else []  # a collective, on every rank alike
                if fault and (back_to := roll_back(step, fault, offending, guard, states, ranks, cfg)):
                    saved = restore(back_to, rollback=True)
                    tokens_trained, train_flops = saved["tokens_trained"], saved["train_flops"]
                    monitor.write({"step": saved["step"], "kind": "rollback", "rollback": {"at_step": step, "to_step": saved["step"], "reason": fault, "rows": [i for i, _ in offending], "sources": [s for _, s in offending], "rollbacks": guard.rollbacks}})
                    monitor.rewind(saved["step"])
                    step = saved["step"]
                    continue
                tokens, fpt = shape.tokens(ranks.data_world), flops_per_token(core.cfg, shape.seq_len)
                tokens_trained, train_flops = tokens_trained + tokens, train_flops + tokens * fpt
                monitor.log_step(step, step_loss, {s: per_source[i] for i, s in enumerate(batches.sources) if rows[i]}, lr, grad_norm.item(), tokens, shape.seq_len, fpt, data_wait_s, guard.rollbacks, bubble)
                if window := mixture.add(step, batches.tokens_by_source(), batches.weights_at(shape.progress), tokens):
                    monitor.write({"step": step, "mixture": window})
                maybe_adapt(evaluate, scored, batches, monitor, step, cfg.geometry(step + 1).progress, adapt_every, cfg)  # for the rows drawn next
                # The checkpoint is on disk before the final validation, which could still fail.
                checkpoint = maybe_checkpoint(out_dir / CHECKPOINT, states, step, cfg.steps, model, core, optimizer, batches, ranks, resumable) or checkpoint
                val_after = maybe_eval(evaluate, scored, monitor, step, cfg) or val_after  # None until the last step
                maybe_probe(probe, scored, monitor, step, cfg)
                if step < cfg.steps and stop.agreed(ranks):  # sync point with several ranks: all stop at the same step
                    states.save(step, model, optimizer, resumable(), wait=True)
                    monitor.close()
                    raise KeyboardInterrupt(f"stopped by signal after step {step}")

    except BaseException:
        states.settle()  # a state still being written when the run failed is worth completing
        raise
    monitor.close()
    assert val_after is not None and (checkpoint or not ranks.is_main), "the last step validates and saves"
    return TrainResult(device, step_loss, val_before, val_after, checkpoint, tokens_trained, train_flops, mixture.records, guard.rollbacks, ranks.gather(held))


def roll_back(step: int, fault: str, offending: list[tuple[int, str]], guard: Guard, states: States, ranks: Ranks, cfg: TrainConfig) -> Path | None:
    """The state to roll back to after `fault` at `step` (the rollback counted in the guard), None
    to go on (a spike with no state to go back to), or the FatalError that stops the run (a NaN or
    Inf with no state to go back to; rollbacks used up)."""
    states.wait()  # a state still being written may be the one to go back to
    found = ranks.broadcast(str(s[-1]) if ranks.is_main and (s := states.complete()) else None)
    where = f"train: step {step}: {fault} on {describe_rows(offending)}"
    if found is None and not Guard.fatal(fault):
        if ranks.is_main:
            log.warning("%s; no resumable state to roll back to (train.checkpoint.every), going on", where)
        return None
    if found is None:
        when = f"none is saved before step {cfg.checkpoint.every}" if cfg.checkpoint.every else "set train.checkpoint.every to save them"
        raise FatalError(f"{where}; there is no resumable state to roll back to ({when}); if it recurs, lower train.optim.lr or raise train.schedule.warmup_steps")
    if guard.rollbacks >= cfg.rollback.max_rollbacks:
        raise FatalError(f"{where}; {guard.rollbacks} rollback(s) already, train.rollback.max_rollbacks is {cfg.rollback.max_rollbacks}: stopping. Run the same command again to resume from the newest state, with a higher train.rollback.max_rollbacks, or train.rollback.lr_factor and lr_steps to go through this stretch at a lower lr")
    guard.rolled_back(step)
    if ranks.is_main:
        log.warning("%s; rolling back to %s (rollback %d of at most %d), and these rows will be skipped", where, found, guard.rollbacks, cfg.rollback.max_rollbacks)
    return Path(found)
