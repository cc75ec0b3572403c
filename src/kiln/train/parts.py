"""What the training loop steps with, built once: `build_parts` makes every part and groups them in
one frozen `TrainParts`, each part by a named `build_*` function that reads only the settings it needs.

The model is built whole on every rank from the seed (or train.init_from's weights), then split
from outside, in torchtitan's order: pipeline stages (kiln.train.pipeline_parallel's StageModel),
tensor parallelism, context-parallel attention, fp8's float8 layers (kiln.train.float8), activation
checkpointing, compile, then FSDP2 or DDP (kiln.train.distributed). Around it: the optimizer, the
loss (chunked through the output layer, over vocabulary shards, or over whole logits; masked
attention by train.attention_kernel), the pipeline schedule, validation and the probe set's
scorers, fp16's loss scaler, the realized-mixture windows, the resumable states, the fault guard
and the monitor. The caller's inputs are three records: `TrainData` (the batches),
`Validation` (what is scored) and `Placement` (the ranks, the parallel section, the state to
resume from).
Not handled here: the steps (kiln.train.loop), what a layout cannot split (kiln.train.mesh).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kiln.core.errors import FatalError
from kiln.core.hardware import available_memory, check_memory
from kiln.core.layout import RunLayout
from kiln.core.mirror import local_folder
from kiln.model.attention import Kernel
from kiln.model.batch import Batch, BatchSource
from kiln.model.config import ModelConfig, ScoringConfig, build_bytes, count_params, flops_per_token, matmul_params
from kiln.model.init import build_model
from kiln.model.perplexity import validation_scorer
from kiln.model.precision import Precision, resolve_precision
from kiln.model.weights import load_weights_into
from kiln.train.config import CheckpointConfig, TrainConfig
from kiln.train.context_parallel import ContextSplit, apply_context_parallel
from kiln.train.distributed import apply_activation_checkpointing, apply_compile, parallelize
from kiln.train.float8 import apply_float8
from kiln.train.loss import Loss, LossOptions, fused_lm_loss, lm_loss, logits_loss
from kiln.train.mesh import Ranks, one_process
from kiln.train.monitor import MixtureWindows, Monitor
from kiln.train.optim import build_optimizer
from kiln.train.parallel import ParallelConfig
from kiln.train.resume import STATES, States
from kiln.train.rollback import Guard
from kiln.train.tensor_parallel import WholeWindows, apply_tensor_parallel, vocab_parallel_loss

if TYPE_CHECKING:  # imported where a pipeline is built: torch.distributed.pipelining takes a second to import
    from kiln.train.pipeline_parallel import PipelineSchedule

log = logging.getLogger("kiln.train")

Scorer = Callable[[nn.Module], dict[str, Any]]
MakeProbe = Callable[[torch.dtype | None], Scorer]
LossOf = Callable[[nn.Module, Batch, int], Loss]  # (model, batch on the device, kept positions of the step) -> its loss


@dataclass(frozen=True)
class TrainData:
    """What the loop trains on."""

    batches: BatchSource
    adapt_every: int | None = None  # steps between an adaptive mixture's reweightings; None: the mixture is fixed
    report_windows: int = 10  # windows of steps the realized mixture is reported over


@dataclass(frozen=True)
class Validation:
    """What validation scores: the run's validation split (and other runs'), the objective's rows, the probe set."""

    run_dir: Path  # the run whose validation split is scored
    scoring: ScoringConfig
    objective_batches: list[Batch] | None = None  # held-out rows of the training objective, scored at each validation
    reference_runs: Sequence[Path] = ()  # other runs whose validation splits are scored too (continued pretraining)
    make_probe: MakeProbe | None = None  # the probe set's scorer for an autocast dtype (kiln.stages: eval.probe)


@dataclass(frozen=True)
class Placement:
    """Where this process trains: its place among the ranks, the parallel section that laid them out,
    and the resumable state (kiln.train.resume) it goes on from (None: from the start)."""

    ranks: Ranks
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    resume_from: Path | None = None


@dataclass(frozen=True)
class TrainParts:
    """Everything the loop steps with (build_parts). The objects inside change as the run goes."""

    precision: Precision
    ranks: Ranks
    model: nn.Module  # what is stepped: wrapped for data parallelism (DDP), or sharded in place (FSDP2)
    core: nn.Module  # the Transformer inside it (a pipeline rank's StageModel)
    scored: nn.Module  # what validation and the probe run: core, its stages in turn, or windows padded for tp
    optimizer: torch.optim.Optimizer
    parameters: list[nn.Parameter]
    loss_of: LossOf
    schedule: PipelineSchedule | None  # pp: runs a step's micro-batches through the stages
    context: ContextSplit | None  # cp: this rank's share of each window
    scaler: torch.amp.GradScaler  # fp16's dynamic loss scaling (bf16 has fp32's exponent range: disabled)
    evaluate: Scorer
    probe: Scorer | None  # the probe set, with train.probe_every
    mixture: MixtureWindows
    states: States
    guard: Guard
    monitor: Monitor


def build_parts(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: TrainData,
    validation: Validation,
    out_dir: Path,
    place: Placement | None,
) -> TrainParts:
    """Every part of a run of `cfg` on model_cfg (its vocab_size resolved); metrics and states go to out_dir."""
    precision = build_precision(cfg)
    place = place or Placement(one_process(precision.device))
    ranks, parallel = place.ranks, place.parallel
    layers = build_layers(model_cfg, ranks, parallel)
    # Each rank of a context-parallel group trains on its share of every window.
    context = ContextSplit(ranks.cp_group, ranks.cp, ranks.mesh.get_local_rank("cp")) if ranks.cp > 1 else None
    core = build_core(model_cfg, cfg.seed, cfg.init_from, cfg.optim.name, ranks)
    core = split_core(core, ranks, parallel, layers, context)
    if precision.float8:  # before checkpointing, compile and FSDP2 wrap the layers (kiln.train.float8)
        apply_float8(core, precision.float8)
    apply_activation_checkpointing(core, cfg.activation_checkpointing, cfg.checkpoint_every_k_blocks)
    if compiling(cfg.compile, ranks.device):
        apply_compile(core)
    model = parallelize(core, ranks, parallel, precision.amp_dtype)
    options, fused = loss_options(model_cfg, cfg, precision), fuses_loss(cfg.fused_loss, precision)
    kernel = attention_kernel(cfg.attention_kernel, precision.device, compiling(cfg.compile, precision.device))
    loss_of = build_loss(options, fused, precision, ranks.tp, kernel)
    optimizer = build_optimizer(model, cfg.optim)
    schedule = None
    if ranks.pp > 1:  # the schedule runs each step's micro-batches through the stages
        schedule = build_schedule(core, ranks, parallel, layers, build_head(options, fused, ranks.tp), precision)
    scored = build_scored(core, ranks, parallel, layers)
    evaluate = build_scorer(validation, cfg.seq_len, precision, kernel)
    make_probe = validation.make_probe
    probe = make_probe(precision.amp_dtype) if make_probe is not None and cfg.probe_every else None
    if schedule:  # the last stage scores; every rank gets its results
        from kiln.train.pipeline_parallel import last_stage_results

        evaluate = last_stage_results(evaluate, ranks)
        probe = probe and last_stage_results(probe, ranks)
    scaler = torch.amp.GradScaler(ranks.device.type, enabled=precision.amp_dtype == torch.float16)
    mixture = MixtureWindows(data.batches.sources, cfg.steps, data.report_windows)
    states = build_states(out_dir, ranks, cfg.checkpoint, cfg.stable_until, cfg.steps)
    # With fp16 an overflowing gradient is the loss scaler's to handle (it skips the step), not a fault.
    guard = Guard(cfg.rollback, check_grad_norm=not scaler.is_enabled())
    monitor = build_monitor(out_dir / RunLayout(validation.run_dir).metrics.name, model_cfg, cfg, ranks)
    return TrainParts(
        precision,
        ranks,
        model,
        core,
        scored,
        optimizer,
        list(model.parameters()),
        loss_of,
        schedule,
        context,
        scaler,
        evaluate,
        probe,
        mixture,
        states,
        guard,
        monitor,
    )


def build_precision(cfg: TrainConfig) -> Precision:
    """The device and autocast dtype; also sets torch's CPU threads (train.threads)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return resolve_precision(cfg.precision, "train")


def build_layers(model_cfg: ModelConfig, ranks: Ranks, parallel: ParallelConfig) -> list[range]:
    """Every pipeline stage's layers (with pp > 1; else none)."""
    if ranks.pp == 1:
        return []
    from kiln.train.pipeline_parallel import stage_layers

    return stage_layers(model_cfg, ranks.pp * parallel.pp_stages_per_rank, parallel.pp_layers)


# Bytes per parameter of the model states a rank keeps, all fp32 (kiln's master weights): weights 4,
# gradients 4, AdamW's two moments 8 (kiln.plan.memory's fp32 figure); Muon keeps one momentum for
# the blocks' matrices (AdamW's two for the rest), so at least 12.
STATE_BYTES = {"adamw": 16, "muon": 12}


def check_model_fits(model_cfg: ModelConfig, optimizer: str, ranks: Ranks) -> None:
    """Stop before building a model this process cannot hold. Every process on this host builds the
    whole fp32 model on the CPU (kiln.model.init) before any sharding; on the CPU its share of the
    model states then stays there, on a GPU it must fit in the device's free memory."""
    params = count_params(model_cfg)
    states = STATE_BYTES[optimizer] * params / (ranks.tp * ranks.pp * ranks.shard * ranks.cp)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # torchrun's processes on this host
    host = local * max(build_bytes(model_cfg), states if ranks.device.type == "cpu" else 0)
    fix = "choose a smaller model section (`kiln plan memory` sizes one), or train on a machine with more memory"
    what = f"train: a {params:,}-parameter model ({local} process(es) on this host, fp32)"
    check_memory(what, host, available_memory(), "this machine", fix)
    if ranks.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(ranks.device)  # host-device sync, once
        what = (
            f"train: the model states of {params:,} parameters (fp32 weights, gradients and {optimizer} state over "
            f"{ranks.describe()})"
        )
        check_memory(
            what,
            states,
            free,
            str(ranks.device),
            "shard them over more GPUs (parallel.dp_shard, tp, pp; "
            "`kiln plan memory` gives a layout) or choose a smaller model section",
        )


def build_core(model_cfg: ModelConfig, seed: int, init_from: str | None, optimizer: str, ranks: Ranks) -> nn.Module:
    """The whole model on this rank's device, once it is known to fit with `optimizer`'s states: the
    seed's initial weights (the same on every rank), or init_from's (continued pretraining; every
    rank reads them)."""
    check_model_fits(model_cfg, optimizer, ranks)
    core = build_model(model_cfg, seed, ranks.device)
    if init_from:
        load_weights_into(core, local_folder(init_from))  # a checkpoint in a store: a local copy
    return core


def split_core(
    core: nn.Module, ranks: Ranks, parallel: ParallelConfig, layers: list[range], context: ContextSplit | None
) -> nn.Module:
    """The whole model split over the ranks that hold parts of it, from outside: this rank's pipeline
    stages (pp), its slices of each matrix (tp), attention over its group's keys and values (cp)."""
    if ranks.pp > 1:  # each rank keeps its stages' modules of the whole model it built
        from kiln.train.pipeline_parallel import StageModel, rank_stages

        held = {i for s in rank_stages(len(layers), ranks.pp, ranks.stage) for i in layers[s]}
        core = StageModel(core, held, ranks.stage == 0, ranks.stage == ranks.pp - 1)  # type: ignore[arg-type]
    if ranks.tp > 1:  # each rank keeps its slices of the whole matrices it built
        apply_tensor_parallel(core, ranks.mesh["tp"], parallel.sequence_parallel)
    if context is not None:
        apply_context_parallel(core, context)
    return core


# Flex attention's Triton kernels need Ampere (compute capability 8.0) or newer.
FLEX_CAPABILITY = (8, 0)


def attention_kernel(kernel: Kernel | None, device: torch.device, compiled: bool) -> Kernel:
    """train.attention_kernel on `device`: None is flex attention inside compiled blocks on an Ampere
    or newer GPU (uncompiled it would compute every score), SDPA's dense mask elsewhere."""
    if kernel == "flex" and device.type != "cuda":
        raise FatalError(
            f"train.attention_kernel=flex trains on CUDA only (PyTorch computes no flex attention backward on "
            f"a CPU) and this run's device is {device.type}; use train.attention_kernel=sdpa, or leave it unset"
        )
    if kernel is not None:
        return kernel
    flex = device.type == "cuda" and compiled and torch.cuda.get_device_capability(device) >= FLEX_CAPABILITY
    return "flex" if flex else "sdpa"


def compiling(compile: bool | None, device: torch.device) -> bool:
    """train.compile, where None means on for cuda and off on the CPU."""
    return compile if compile is not None else device.type == "cuda"


def fuses_loss(fused_loss: bool, precision: Precision) -> bool:
    """train.fused_loss, which fp16 does without (its unscaled per-position gradients would underflow)."""
    return fused_loss and precision.amp_dtype != torch.float16


def loss_options(model_cfg: ModelConfig, cfg: TrainConfig, precision: Precision) -> LossOptions:
    """The loss's settings: model.z_loss, train.late_position_weight, and the fused loss's chunk
    (train.loss_chunk_tokens, or about 2^23 logits on a CPU, 2^28 on a GPU) and compilation."""
    logits = 2**28 if precision.device.type == "cuda" else 2**23
    chunk = cfg.loss_chunk_tokens or max(1, logits // (model_cfg.vocab_size or 1))
    return LossOptions(model_cfg.z_loss, cfg.late_position_weight, chunk, compiling(cfg.compile, precision.device))


def build_head(options: LossOptions, fused: bool, tp: int) -> Callable[..., Loss]:
    """The training loss as the model's head, head(hidden, output matrix, soft-cap, batch=, step_tokens=):
    over the vocabulary shards with tp (inside Ranks.loss_context), chunked through the output layer
    when `fused` (fuses_loss), else over the logits made whole."""
    if tp > 1:
        return partial(vocab_parallel_loss, options=options)
    return partial(fused_lm_loss if fused else logits_loss, options=options)


def build_loss(options: LossOptions, fused: bool, precision: Precision, tp: int, kernel: Kernel) -> LossOf:
    """loss_of(model, batch on the device, kept positions of the step): the forward pass and the training loss,
    masked attention computed by `kernel` (its block mask, or dense mask, built once per batch)."""
    if tp > 1 or fused:
        head = build_head(options, fused, tp)

        def headed(model: nn.Module, batch: Batch, step_tokens: int) -> Loss:
            with precision.autocast():  # the output layer's matmuls in the autocast dtype, the cross-entropy in fp32
                loss_head = partial(head, batch=batch, step_tokens=step_tokens)
                rule = batch.rule(kernel)
                return model(batch.input_ids_BT, rule=rule, positions_BT=batch.positions_BT, head=loss_head)

        return headed
    # Compiled along with the blocks: one fused pass over the (B, T, V) logits for the log-softmax,
    # the target gather and the mask, and one back (eager reads and writes them several times).
    plain_loss = torch.compile(lm_loss) if options.compiled else lm_loss

    def plain(model: nn.Module, batch: Batch, step_tokens: int) -> Loss:
        # Plain causal rows without document ids take SDPA's is_causal fast path.
        with precision.autocast():
            logits_BTV = model(batch.input_ids_BT, rule=batch.rule(kernel), positions_BT=batch.positions_BT)  # fp32
        # Outside autocast: fp32.
        return plain_loss(logits_BTV, batch, step_tokens, options.z_loss, options.late_position_weight)

    return plain


def build_schedule(
    core: nn.Module,
    ranks: Ranks,
    parallel: ParallelConfig,
    layers: list[range],
    head: Callable[..., Loss],
    precision: Precision,
) -> PipelineSchedule:
    """The pipeline schedule of parallel.pp_schedule over this rank's stages."""
    from kiln.train.pipeline_parallel import PipelineSchedule

    return PipelineSchedule(core, ranks, parallel.pp_schedule, layers, head, precision)  # type: ignore[arg-type]


def build_scored(core: nn.Module, ranks: Ranks, parallel: ParallelConfig, layers: list[range]) -> nn.Module:
    """What validation and the probe call as the whole model: the pipeline's stages in turn, the
    sequence-parallel model on windows of any length, or the model itself."""
    if ranks.pp > 1:
        from kiln.train.pipeline_parallel import StagesInTurn

        return StagesInTurn(core, ranks, layers)  # type: ignore[arg-type]
    return WholeWindows(core, ranks.tp) if ranks.tp > 1 and parallel.sequence_parallel else core


def build_scorer(validation: Validation, seq_len: int, precision: Precision, kernel: Kernel) -> Scorer:
    """Validation in the training precision, on windows of seq_len (train.seq_len) unless the
    scoring section says otherwise. With objective batches (held-out rows built by the training
    objective), the results also carry that objective's loss on them under "objective"."""
    scoring = validation.scoring.model_copy(update={"seq_len": validation.scoring.seq_len or seq_len})
    perplexity = validation_scorer(validation.run_dir, scoring, precision.amp_dtype, validation.reference_runs)
    if not validation.objective_batches:
        return perplexity
    batches = validation.objective_batches
    return lambda model: {**perplexity(model), "objective": objective_loss(model, batches, precision, kernel)}


def objective_loss(model: nn.Module, batches: list[Batch], precision: Precision, kernel: Kernel) -> dict[str, Any]:
    """Mean loss per kept position of the objective over fixed batches (nats), and the positions counted."""
    was_training = model.training
    model.eval()
    nats, kept = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(precision.device)
            with precision.autocast():
                logits_BTV = model(batch.input_ids_BT, rule=batch.rule(kernel), positions_BT=batch.positions_BT)
            loss = lm_loss(logits_BTV, batch)
            nats += float((loss.row_mean_B * loss.row_tokens_B).sum())  # host sync per batch
            kept += int(loss.row_tokens_B.sum())
    model.train(was_training)
    return {"loss": nats / max(kept, 1), "tokens": kept}


def build_states(
    out_dir: Path, ranks: Ranks, checkpoint: CheckpointConfig, stable_until: int | None, steps: int
) -> States:
    """The resumable states train.checkpoint asks for; a wsd run also keeps one at its last stable
    step (stable_until): a longer run goes on from there (kiln.train.extend)."""
    keep = frozenset({stable_until}) if stable_until is not None and stable_until < steps else frozenset()
    return States(out_dir / STATES, ranks, checkpoint, keep)


def build_monitor(path: Path, model_cfg: ModelConfig, cfg: TrainConfig, ranks: Ranks) -> Monitor:
    """The metrics writer of train.steps steps (rank 0 writes), and the run described in the log."""
    monitor = Monitor(path, cfg.steps, ranks.device, ranks.world)
    # Printed so that MFU can be compared with other tools' accounting.
    peak = "unknown for this device (MFU not reported)"
    if monitor.peak:
        peak = f"{monitor.peak:.3g} FLOP/s ({ranks.world} x the device's dense bf16 peak)"
    log.info(
        "train: MFU = tokens/s x FLOPs per token / peak; FLOPs per token = 6 x %s matmul weights + 12 x layers x "
        "seq_len x d_attn = %s at seq_len %d (PaLM appendix B, kiln.model.config); peak %s",
        f"{matmul_params(model_cfg):,}",
        f"{flops_per_token(model_cfg, cfg.seq_len):,}",
        cfg.seq_len,
        peak,
    )
    log.info(
        "train: %s params (%s without embeddings) on %s x %d (%s), %d steps of %d tokens (%d micro-batches of "
        "%d x %d per data rank)",
        f"{count_params(model_cfg):,}",
        f"{count_params(model_cfg, False):,}",
        ranks.device.type,
        ranks.world,
        ranks.describe(),
        cfg.steps,
        cfg.tokens_per_step,
        cfg.grad_accum_steps,
        cfg.micro_batch_size,
        cfg.seq_len,
    )
    return monitor
