"""The training loop: one `train()` that reads top to bottom and names each thing a step does; what
it steps with is built once (kiln.train.parts).

Per optimizer step: the step's shape (kiln.train.geometry: sequence length, rows, RoPE base;
tokens per step = train.global_batch_tokens outside batch-size warmup) in micro-batches of
micro_batch_size * seq_len tokens, each a Batch from the BatchSource the caller hands in
(kiln.model.batch; the objective's collator over kiln.mix's sampler in a kiln run), with the
attention rule and positions the batch carries (`draw_step`); forward and backward for the layout
in use (`forward_backward`: through the pipeline schedule, or micro-batch by micro-batch inside
DDP's no_sync, tensor parallelism's loss_parallel and context parallelism's gathering); the loss
sums each batch's kept positions and divides by the kept positions of the whole step, so
gradients average per token; global-norm clipping and the optimizer step (`optimizer_step`); lr
from warmup + cosine. A NaN, Inf or loss spike (kiln.train.rollback's guard) rolls the run back to
its newest resumable state (`roll_back`, `restore`); the replayed stream skips the rows that
faulted. What follows a step is called by name: `monitor.log_step`, `log_mixture` (the realized
mixture per window of steps), `maybe_adapt` (an adaptive mixture's reweighting from per-source
validation losses), `maybe_checkpoint`, `maybe_eval` (validation before step 1, the untrained
baseline near ln(vocab), and after the last step; with an objective other than clm also that
objective's loss on fixed validation batches), `maybe_probe`, and the stop request (`stop_now`).
Stage bookkeeping (manifest, skip-or-redo, counts) is kiln.train.run's; the resumable states
kiln.train.resume's.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kiln.core.errors import FatalError
from kiln.core.layout import CHECKPOINT
from kiln.model.batch import Batch, BatchSource
from kiln.model.config import ModelConfig, flops_per_token
from kiln.train.checkpoint import maybe_checkpoint
from kiln.train.config import TrainConfig
from kiln.train.distributed import clip_grad_norm, model_state_bytes
from kiln.train.geometry import StepGeometry
from kiln.train.mesh import Ranks
from kiln.train.monitor import Monitor, StepLog, peak_rss_mb, reset_peak_rss, truncate_metrics
from kiln.train.parts import Placement, Scorer, TrainData, TrainParts, Validation, build_parts
from kiln.train.resume import States
from kiln.train.rollback import Guard

log = logging.getLogger("kiln.train")


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
    model_states_mb: list[dict[str, float]]  # per rank: weights, gradients, optimizer states held after its first step
    max_rss_mb: float | None  # this process's peak resident memory while training (None off Linux)


@dataclass(frozen=True)
class Cadence:
    """The steps at which what follows a step happens."""

    steps: int  # train.steps: the last step validates, probes and saves the checkpoint
    eval_every: int | None  # train.eval_every
    eval_at_start: bool  # train.eval_at_start: validate the untrained model before step 1
    probe_every: int | None  # train.probe_every
    adapt_every: int | None  # an adaptive mixture's reweightings (TrainData.adapt_every)


@dataclass
class Progress:
    """How far the run has come: the last step finished, what a resumable state records of the run
    (tokens_trained, train_flops, val_before), and this attempt's results so far."""

    step: int = 0
    tokens_trained: int = 0  # over all steps and ranks
    train_flops: int = 0
    val_before: dict[str, Any] | None = None
    val_after: dict[str, Any] | None = None  # None until the last step
    checkpoint: list[Path] = field(default_factory=list)  # the final checkpoint's files, on rank 0
    loss: float = float("nan")  # the last step's
    held: dict[str, float] = field(default_factory=dict)  # model states held after the attempt's first step (MiB)

    def count(self, step: int, loss: float, tokens: int, flops: int) -> None:
        """`step` is done (not rolled back): its loss, tokens and model FLOPs."""
        self.step, self.loss = step, loss
        self.tokens_trained, self.train_flops = self.tokens_trained + tokens, self.train_flops + flops

    def result(self, ranks: Ranks, mixture: list[dict[str, Any]], rollbacks: int) -> TrainResult:
        """The run's result once its last step is done (model states held gathered from every rank)."""
        return TrainResult(
            ranks.device,
            self.loss,
            self.val_before,
            self.val_after,
            self.checkpoint,
            self.tokens_trained,
            self.train_flops,
            mixture,
            rollbacks,
            ranks.gather(self.held),
            peak_rss_mb(),
        )


def train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: TrainData,
    validation: Validation,
    out_dir: Path,
    place: Placement | None = None,
) -> TrainResult:
    """Train a model (model_cfg with its vocab_size resolved; fresh, or train.init_from's weights) on
    data.batches; metrics, resumable states and the checkpoint go to out_dir. place: this process's
    ranks, the parallel section and the state to resume from (None: one process, from the start)."""
    reset_peak_rss()  # what training alone needs, not what stages before it in the same process touched
    parts = build_parts(model_cfg, cfg, data, validation, out_dir, place)
    batches, ranks, guard, monitor = data.batches, parts.ranks, parts.guard, parts.monitor
    cadence = Cadence(cfg.steps, cfg.eval_every, cfg.eval_at_start, cfg.probe_every, data.adapt_every)
    progress = begin(parts, batches, place.resume_from if place else None, cfg, cadence)
    sources = list(batches.sources)
    state = partial(resumable, parts, batches, progress)  # a resumable state's JSON part, as of now
    try:
        with StopRequest() as stop:  # SIGTERM / SIGINT: finish the step, save a resumable state, stop
            while progress.step < cfg.steps:
                step = progress.step + 1
                shape = cfg.geometry(step)  # seq_len, rows and RoPE base (phases, batch-size warmup)
                enter_phase(parts.core, shape, model_cfg.rope_theta, step)
                lr = set_lr(parts.optimizer, cfg.lr(step) * guard.lr_scale(step))
                micro_batches, wait_s = draw_step(batches, shape, step, guard.skips.get(step, 0), ranks)
                step_tokens = kept_positions(micro_batches, ranks)
                losses, bubble = forward_backward(parts, micro_batches, step_tokens, len(sources))
                grad_norm = optimizer_step(parts, cfg.optim.grad_clip, progress)
                loss, by_source = losses.reduce(ranks, sources)
                # Every rank has the same loss and norm, so every rank takes the same decision.
                if (reason := guard.check(loss, grad_norm)) is not None:
                    fault = Fault(step, reason, step_rows(micro_batches, sources, ranks))  # a collective, on every rank
                    if (back_to := roll_back(fault, guard, parts.states, ranks)) is not None:
                        rewind(progress, restore(parts, batches, back_to, cfg, fault))
                        continue
                tokens, fpt = shape.tokens(ranks.data_world), flops_per_token(parts.core.cfg, shape.seq_len)
                progress.count(step, loss, tokens, tokens * fpt)
                done = StepLog(
                    step, loss, by_source, lr, grad_norm, tokens, shape.seq_len, fpt, wait_s, guard.rollbacks, bubble
                )
                monitor.log_step(done)
                log_mixture(parts, batches, step, shape.progress, tokens)
                maybe_adapt(parts, batches, step, cfg.geometry(step + 1).progress, cadence)  # for the rows drawn next
                # The checkpoint is on disk before the final validation, which could still fail.
                saved = maybe_checkpoint(parts, step, cfg.steps, out_dir / CHECKPOINT, batches, state)
                progress.checkpoint = saved or progress.checkpoint
                validated = maybe_eval(parts.evaluate, parts.scored, monitor, step, cadence)  # None until the last step
                progress.val_after = validated or progress.val_after
                maybe_probe(parts.probe, parts.scored, monitor, step, cadence)
                if step < cfg.steps and stop.agreed(ranks):  # sync point with several ranks: all stop at the same step
                    # subtle: Slurm's warning may reach rank 0 only after the step; any rank's SIGUSR1 requeues.
                    requeue = ranks.any(stop.requeue)  # a collective: every rank is here
                    stop_now(parts, step, state(), requeue=requeue and ranks.is_main)
    except BaseException:
        parts.states.settle()  # a state still being written when the run failed is worth completing
        raise
    monitor.close()
    saved = progress.checkpoint or not ranks.is_main
    assert progress.val_after is not None and saved, "the last step validates and saves"
    return progress.result(ranks, parts.mixture.records, guard.rollbacks)


def begin(
    parts: TrainParts, batches: BatchSource, resume_from: Path | None, cfg: TrainConfig, cadence: Cadence
) -> Progress:
    """Where the run starts: after the resumable state resume_from (loaded into every part), or at
    step 0, after validating the untrained model (every rank scores, FSDP2 gathers shards; rank 0 logs)."""
    if resume_from:
        saved = restore(parts, batches, resume_from, cfg)
        log.info("train: resuming after step %d from %s", saved["step"], resume_from)
        progress = Progress(saved["step"], saved["tokens_trained"], saved["train_flops"], saved["val_before"])
    else:
        if parts.ranks.is_main:
            truncate_metrics(parts.monitor.path, 0)
        progress = Progress(val_before=maybe_eval(parts.evaluate, parts.scored, parts.monitor, 0, cadence))
    parts.model.train()
    parts.monitor.start(step=progress.step)
    return progress


def restore(
    parts: TrainParts, batches: BatchSource, folder: Path, cfg: TrainConfig, fault: Fault | None = None
) -> dict[str, Any]:
    """Load the resumable state `folder` (verified against `cfg`) into every part; its train_state.json.
    After a fault (a rollback) the guard keeps its rollbacks, skips and lowered-lr window as they are
    now, and the metrics record the rollback."""
    saved = parts.states.load(folder, parts.model, parts.optimizer, cfg)
    batches.load_state_dict(saved["batches"])
    parts.mixture.load_state_dict(saved["mixture"])
    if "guard" in saved:  # states written before rollbacks existed have none
        parts.guard.load_state_dict(saved["guard"], history_only=fault is not None)
    parts.scaler.load_state_dict(saved.get("scaler", {}))
    if parts.ranks.is_main:
        truncate_metrics(parts.monitor.path, saved["step"])
    if fault is not None:
        rows, sources = [i for i, _ in fault.rows], [s for _, s in fault.rows]
        rollback = {
            "at_step": fault.step,
            "to_step": saved["step"],
            "reason": fault.reason,
            "rows": rows,
            "sources": sources,
            "rollbacks": parts.guard.rollbacks,
        }
        parts.monitor.write({"step": saved["step"], "kind": "rollback", "rollback": rollback})
        parts.monitor.rewind(saved["step"])
    return saved


def rewind(progress: Progress, saved: dict[str, Any]) -> None:
    """Back to a state's step and counts after a rollback (this attempt's results stay)."""
    progress.step = saved["step"]
    progress.tokens_trained, progress.train_flops = saved["tokens_trained"], saved["train_flops"]


def resumable(parts: TrainParts, batches: BatchSource, progress: Progress) -> dict[str, Any]:
    """What a resumable state holds besides model, optimizer and RNGs (JSON)."""
    return {
        "batches": batches.state_dict(),
        "mixture": parts.mixture.state_dict(),
        "tokens_trained": progress.tokens_trained,
        "train_flops": progress.train_flops,
        "val_before": progress.val_before,
        "guard": parts.guard.state_dict(),
        "scaler": parts.scaler.state_dict(),
    }


def enter_phase(core: nn.Module, shape: StepGeometry, base_theta: float, step: int) -> None:
    """The step's RoPE base: its phase's, or the model's own (base_theta) before any phase sets one
    (also after a rollback to such a step)."""
    if (theta := shape.rope_theta if shape.rope_theta is not None else base_theta) != core.cfg.rope_theta:
        # A long-context phase begins (or, rolled back, has not yet).
        core.set_rope_theta(theta)  # type: ignore[operator]
        log.info("train: step %d: seq_len %d, RoPE base %g", step, shape.seq_len, theta)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]  # Muon's matrices have their own peak
    return lr


def draw_step(
    batches: BatchSource, shape: StepGeometry, step: int, skips: int, ranks: Ranks
) -> tuple[list[Batch], float]:
    """This rank's micro-batches of `step`, drawn on the host: ids, targets, loss mask (B, T),
    source per row (B,), the attention rule's tensors; first the draws a rollback skips (`skips`:
    rows that made this step fault before). Also the host seconds it took. Drawn before any compute
    because the loss divides by the kept positions of the whole step, which the masks give."""
    t_data = time.perf_counter()

    def draw() -> list[Batch]:
        return [batches.next_batch(rows, shape.seq_len, shape.progress) for rows in shape.micro_batches]

    for _ in range(skips):
        skipped = step_rows(draw(), list(batches.sources), ranks)
        if ranks.is_main:
            log.warning("train: step %d: skipping %s, which faulted before", step, describe_rows(skipped))
    micro_batches = draw()
    return micro_batches, time.perf_counter() - t_data


def kept_positions(micro_batches: list[Batch], ranks: Ranks) -> int:
    """The kept positions of the whole step over every data rank, which the loss divides by; the
    masks are on the host (no device sync), but with several ranks this is a sync point."""
    kept = torch.tensor([sum(int(b.loss_mask_BT.sum()) for b in micro_batches)], device=ranks.device)
    return int(ranks.all_sum(kept).item())


class SourceLosses:
    """Per-source sums of the step's per-row mean losses and row counts, kept on the device: no sync per micro-batch."""

    def __init__(self, n_sources: int, device: torch.device):
        self.loss = torch.zeros(n_sources, device=device)
        self.rows = torch.zeros(n_sources, device=device)

    def add(self, source_B: torch.Tensor, row_mean_B: torch.Tensor, row_tokens_B: torch.Tensor) -> None:
        self.loss.index_add_(0, source_B, row_mean_B)
        self.rows.index_add_(0, source_B, (row_tokens_B > 0).to(self.rows.dtype))

    def reduce(self, ranks: Ranks, sources: list[str]) -> tuple[float, dict[str, float]]:
        """The step's loss, every row alike (the token mean when every row keeps all T targets:
        next-token), and per source drawn, over every rank's rows. host sync: once per step, for the
        log line and the fault check; a collective with several ranks (the last stage's losses)."""
        ranks.all_sum(self.loss, stages=True), ranks.all_sum(self.rows, stages=True)
        per_source, rows = (self.loss / self.rows.clamp(min=1)).tolist(), self.rows.tolist()
        by_source = {s: per_source[i] for i, s in enumerate(sources) if rows[i]}
        return float(self.loss.sum().item() / max(sum(rows), 1)), by_source


def forward_backward(
    parts: TrainParts, micro_batches: list[Batch], step_tokens: int, n_sources: int
) -> tuple[SourceLosses, float | None]:
    """Forward and backward of the step's rows for the layout in use: through the pipeline schedule,
    or one micro-batch after another; each row's loss by source, and the pipeline's bubble (the
    slowest stage's idle share; the others also wait on it), None without stages."""
    losses = SourceLosses(n_sources, parts.ranks.device)
    if parts.schedule is not None:  # every micro-batch through the stages; per-row losses on the last
        rows_loss, idle = parts.schedule.step(micro_batches, step_tokens)
        parts.schedule.sum_tied_grads()  # a tied embedding: its copies on the first and last stage get both gradients
        if rows_loss is not None:
            source_B = torch.cat([b.source_B for b in micro_batches]).to(parts.ranks.device)
            losses.add(source_B, rows_loss.row_mean_B, rows_loss.row_tokens_B)
        return losses, min(idle)
    for i, batch in enumerate(micro_batches):
        micro_batch_forward_backward(parts, batch, step_tokens, i == len(micro_batches) - 1, losses)
    return losses, None


def micro_batch_forward_backward(
    parts: TrainParts, batch: Batch, step_tokens: int, last: bool, losses: SourceLosses
) -> None:
    """One micro-batch (this rank's positions of it with cp): its loss is summed over kept positions
    and divided by step_tokens, so the accumulated gradient is that of the step's token mean.
    Expected: about ln V at step 1 (9.01 nats for 8192 tokens)."""
    batch = batch.to(parts.ranks.device)
    batch = parts.context.share(batch) if parts.context else batch
    # DDP all-reduces gradients only after the step's last micro-batch.
    sync = parts.model.no_sync() if isinstance(parts.model, DistributedDataParallel) and not last else nullcontext()
    gather = parts.context.sharded() if parts.context else nullcontext()
    # Forward and backward both inside DDP's no_sync, tp's loss_parallel and cp's gathering.
    with sync, parts.ranks.loss_context(), gather:
        loss = parts.loss_of(parts.model, batch, step_tokens)
        # grad_scale: DDP and FSDP2 average over ranks; the step's gradient is the sum of the ranks' shares.
        parts.scaler.scale(loss.value * parts.ranks.grad_scale).backward()
    # sync point with cp: each row's loss over the positions of the whole group.
    row_mean_B, row_tokens_B = parts.context.whole_rows(loss) if parts.context else (loss.row_mean_B, loss.row_tokens_B)
    losses.add(batch.source_B, row_mean_B, row_tokens_B)


def optimizer_step(parts: TrainParts, grad_clip: float | None, progress: Progress) -> float:
    """Unscale (fp16), clip, step, and clear the gradients; the pre-clip norm over every shard, which
    is measured with grad_clip None too (max_norm=inf). host sync: the norm, once per step."""
    parts.scaler.unscale_(parts.optimizer)  # fp16: gradients back to their true scale before the norm (no-op otherwise)
    stages, copies = (parts.ranks.stage_group, parts.schedule.copies) if parts.schedule else (None, None)
    grad_norm = clip_grad_norm(parts.parameters, grad_clip or float("inf"), stages, copies)
    parts.scaler.step(parts.optimizer)  # fp16: skipped when a gradient overflowed, and the scale shrinks
    parts.scaler.update()
    if not progress.held:  # what the planner's memory model counts, measured where it can be (on a CPU too)
        held = model_state_bytes(parts.parameters, parts.optimizer)
        progress.held = {k: round(v / 2**20, 3) for k, v in held.items()}
    parts.optimizer.zero_grad(set_to_none=True)
    return grad_norm.item()


@dataclass(frozen=True)
class Fault:
    """A step the guard stopped: why, and its rows ((index in the global stream, source) of each)."""

    step: int
    reason: str
    rows: list[tuple[int, str]]


def step_rows(micro_batches: list[Batch], sources: list[str], ranks: Ranks) -> list[tuple[int, str]]:
    """(row index in the global stream, source) of every row of a step, over all data ranks (a
    collective); empty when the batches do not carry row indices."""
    if any(b.index_B is None for b in micro_batches):
        return []
    index = torch.cat([b.index_B for b in micro_batches])  # type: ignore[misc]
    source = torch.cat([b.source_B.cpu() for b in micro_batches])
    # The step's rows are one contiguous run of the stream; data rank 0 holds its first rows.
    first_row = torch.tensor([int(index.min()) if ranks.data_rank == 0 else 0], device=ranks.device)
    first = int(ranks.all_sum(first_row).item())
    table = torch.zeros(len(index) * ranks.data_world, dtype=torch.long)
    table[index - first] = source + 1
    table = ranks.all_sum(table.to(ranks.device)).cpu()
    return [(first + i, sources[int(s) - 1]) for i, s in enumerate(table.tolist()) if s]


def describe_rows(rows: list[tuple[int, str]]) -> str:
    if not rows:
        return "rows unknown (the batch source gives no row indices)"
    by_source = {s: sum(1 for _, r in rows if r == s) for s in dict.fromkeys(r for _, r in rows)}
    counts = ", ".join(f"{n} {s}" for s, n in by_source.items())
    return f"rows {rows[0][0]}..{rows[-1][0]} of the stream ({counts})"


def roll_back(fault: Fault, guard: Guard, states: States, ranks: Ranks) -> Path | None:
    """The state to roll back to after `fault` (the rollback counted in the guard), None to go on (a
    spike with no state to go back to), or the FatalError that stops the run (a NaN or Inf with no
    state to go back to; rollbacks used up: the guard's rollback.max_rollbacks)."""
    states.wait()  # a state still being written may be the one to go back to
    found = ranks.broadcast(str(s[-1]) if ranks.is_main and (s := states.complete()) else None)
    where, most = f"train: step {fault.step}: {fault.reason} on {describe_rows(fault.rows)}", guard.cfg.max_rollbacks
    if found is None and not Guard.fatal(fault.reason):
        if ranks.is_main:
            log.warning("%s; no resumable state to roll back to (train.checkpoint.every), going on", where)
        return None
    if found is None:
        every = states.every
        when = f"none is saved before step {every}" if every else "set train.checkpoint.every to save them"
        raise FatalError(
            f"{where}; there is no resumable state to roll back to ({when}); "
            "if it recurs, lower train.optim.lr or raise train.schedule.warmup_steps"
        )
    if guard.rollbacks >= most:
        raise FatalError(
            f"{where}; {guard.rollbacks} rollback(s) already, train.rollback.max_rollbacks is {most}: "
            "stopping. Run the same command again to resume from the newest state, with a higher "
            "train.rollback.max_rollbacks, or train.rollback.lr_factor and lr_steps to go through this "
            "stretch at a lower lr"
        )
    guard.rolled_back(fault.step)
    if ranks.is_main:
        log.warning(
            "%s; rolling back to %s (rollback %d of at most %d), and these rows will be skipped",
            where,
            found,
            guard.rollbacks,
            most,
        )
    return Path(found)


def log_mixture(parts: TrainParts, batches: BatchSource, step: int, progress: float, tokens: int) -> None:
    """The realized mixture: at the last step of each window of steps, the tokens each source gave
    against the intended weights."""
    if window := parts.mixture.add(step, batches.tokens_by_source(), batches.weights_at(progress), tokens):
        parts.monitor.write({"step": step, "mixture": window})


def maybe_adapt(parts: TrainParts, batches: BatchSource, step: int, progress: float, cadence: Cadence) -> None:
    """Every adapt_every steps but the last (an adaptive mixture), score each source's validation loss
    and hand it to the mixture, for the rows it draws at `progress`."""
    if not cadence.adapt_every or step % cadence.adapt_every or step == cadence.steps:
        return
    results = parts.evaluate(parts.scored)
    parts.monitor.log_eval(step, results, "adaptive")
    record = batches.observe(step, progress, {s: r["loss"] for s, r in results["sources"].items()})
    if record is not None:
        parts.monitor.write({"step": step, **record})


def maybe_eval(
    evaluate: Scorer, model: nn.Module, monitor: Monitor, step: int, cadence: Cadence
) -> dict[str, Any] | None:
    """Validate before step 1 (if train.eval_at_start), every train.eval_every steps, and after the
    last step; the results of the first and the last (the manifest's before and after), else None."""
    every, last = cadence.eval_every, cadence.steps
    periodic = bool(every) and 0 < step < last and step % every == 0  # type: ignore[operator]
    start = step == 0 and cadence.eval_at_start
    kind = "final" if step == last else "start" if start else "periodic" if periodic else None
    if kind is None:
        return None
    results = evaluate(model)  # switches to eval mode and back; one host sync per validation batch
    monitor.log_eval(step, results, kind)
    if step == 0:
        ln_v = math.log(model.cfg.vocab_size or 1)  # type: ignore[union-attr]
        log.info("train: step 0 validation loss %.3f (ln V = %.3f)", results["all"]["loss"], ln_v)
    return None if kind == "periodic" else results


def maybe_probe(probe: Scorer | None, model: nn.Module, monitor: Monitor, step: int, cadence: Cadence) -> None:
    """Every train.probe_every steps and after the last: the probe set's document losses and greedy
    continuations. Every rank runs it (FSDP2 gathers shards), rank 0 logs it."""
    if probe is None or (step % cadence.probe_every and step != cadence.steps):  # type: ignore[operator]
        return
    monitor.log_probe(step, probe(model))


def stop_now(parts: TrainParts, step: int, state: dict[str, Any], requeue: bool = False) -> NoReturn:
    """The stop request honoured after `step`: a resumable state, written before the run stops; with
    `requeue`, the Slurm job is put back in the queue, to resume from that state when it starts again."""
    parts.states.save(step, parts.model, parts.optimizer, state, wait=True)
    parts.monitor.close()
    if requeue:
        job = os.environ["SLURM_JOB_ID"]
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if done.returncode == 0:
            log.warning("train: Slurm job %s requeued; it resumes after step %d when it starts again", job, step)
        else:  # a job submitted without --requeue, or a cluster that forbids it: the state is kept all the same
            log.warning("train: scontrol requeue %s refused (%s); run it again to resume", job, done.stderr.strip())
    raise KeyboardInterrupt(f"stopped by signal after step {step}")


class StopRequest:
    """Turns SIGTERM, SIGINT and SIGUSR1 into a request the loop honours between steps (a scheduler's
    preemption notice, Ctrl-C, Slurm's warning before a time limit with `sbatch --signal=USR1@120`): the step
    finishes, a resumable state is written, and the run stops; after SIGUSR1 under Slurm, rank 0 also asks
    Slurm to requeue the job, which resumes from that state."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self) -> None:
        self.requested = False
        self.signal: int | None = None
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self.request)

    def request(self, signum: int, frame: Any) -> None:
        log.warning("train: %s received; saving a resumable state after this step", signal.Signals(signum).name)
        self.requested, self.signal = True, signum

    @property
    def requeue(self) -> bool:
        """Whether the stop is Slurm's warning to a job that should run on: SIGUSR1 inside a Slurm job."""
        return self.signal == signal.SIGUSR1 and "SLURM_JOB_ID" in os.environ

    def agreed(self, ranks: Ranks) -> bool:
        """Whether any rank was asked to stop (a collective with several ranks: every rank stops together)."""
        return ranks.any(self.requested)

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():  # the caller's handlers again, however the loop ended
            signal.signal(sig, handler)
