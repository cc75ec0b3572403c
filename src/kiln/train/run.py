"""The train stage: skip-or-redo, then kiln.train.loop.train, then counts, summary and manifest.

The caller wires in the data (`TrainInputs`): `make_rows(seq_len, split)` builds a RowSource
(kiln.mix's sampler in a kiln run) and `data_config` is the recipe section that configured it,
hashed with `model` and `train` so that different data redoes the stage. The objective's
collator (kiln.train.collate) turns its windows into batches; for any objective but plain clm,
fixed validation batches built the same way are scored at each validation. The scoring
settings shape only the monitoring evaluations, so they are not hashed. Before any compute the
stage plans the data mixture (kiln.train.data_plan; `dry_run` prints it and stops) and stops on
a source planned beyond mix.max_epochs when the recipe says so. An interrupted run with the
same config, inputs and upstream resumes from its newest complete state (kiln.train.resume).
Not handled here: the steps themselves (kiln.train.loop).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.core.config import Section
from kiln.core.errors import ConfigError, FatalError
from kiln.core.layout import MANIFEST, TOKENIZE, TOKENIZER, TOKENIZER_META, TRAIN, RunLayout
from kiln.core.manifest import IN_PROGRESS, Stage, read_manifest, recorded_outputs, sha256_file
from kiln.core.mirror import pull, refresh, url_of
from kiln.core.ranks import world_size
from kiln.core.storage import is_url
from kiln.core.store_lock import adopt, tokens
from kiln.model.batch import Batch, RowSource
from kiln.model.config import ModelConfig, ScoringConfig, count_params, flops_per_token
from kiln.model.precision import resolve_precision
from kiln.model.weights import CONFIG, WEIGHTS
from kiln.text.load import load_tokenizer
from kiln.train.collate import build_collator
from kiln.train.config import TrainConfig
from kiln.train.data_plan import format_plan, plan_data
from kiln.train.extend import EXTENDABLE, extension_state, old_config
from kiln.train.loop import TrainResult, train
from kiln.train.mesh import Ranks, check_layout, init_ranks
from kiln.train.monitor import TENSORBOARD
from kiln.train.objectives import TokenIds, check_objectives, fim_middles, token_ids
from kiln.train.parallel import ParallelConfig
from kiln.train.parts import MakeProbe, Placement, TrainData, Validation, build_precision
from kiln.train.resume import COMPLETE, STATES, complete_states, set_aside_after, state_step

# Validation rows for an objective's own loss: at most this many micro-batches.
MAX_OBJECTIVE_VAL_BATCHES = 32

log = logging.getLogger("kiln.train")


def objective_val_batches(
    make_rows: Callable[[int, str], RowSource], cfg: TrainConfig, scoring: ScoringConfig, ids: TokenIds
) -> list[Batch] | None:
    """Fixed held-out batches built by the objective (the same rows at every validation), or None for plain clm.

    fim alone is validated on the middles of rearranged validation documents (the val_fim split
    the tokenize stage writes), the tokens infilling has to produce.
    """
    if cfg.objectives.keys() == {"clm"} and not cfg.masks_documents("clm"):
        return None  # the perplexity scorer already measures exactly this
    fim_only = cfg.objectives.keys() == {"fim"}
    val = build_collator(make_rows(cfg.seq_len, "val_fim" if fim_only else "val"), cfg, ids)
    # fim: only middles whose <|fim_middle|> lies inside the row count (a row that starts inside a
    # middle has lost its context), a small share of each row, so every batch allowed is used.
    n = (
        MAX_OBJECTIVE_VAL_BATCHES
        if fim_only
        else min(
            MAX_OBJECTIVE_VAL_BATCHES,
            max(1, scoring.max_tokens_per_source * len(val.sources) // (cfg.micro_batch_size * cfg.seq_len)),
        )
    )
    batches = [val.next_batch(cfg.micro_batch_size, cfg.seq_len, 0.0) for _ in range(n)]
    if fim_only:
        batches = [
            replace(b, loss_mask_BT=torch.from_numpy(fim_middles(b.input_ids_BT.numpy(), b.targets_BT.numpy(), ids)))
            for b in batches
        ]
    return batches


def prepare_data(
    cfg: TrainConfig, make_rows: Callable[[int, str], RowSource], layout: RunLayout, tokenized: dict[str, Any]
) -> tuple[RowSource, TokenIds, dict[str, Any]]:
    """The row source, the tokenizer's special ids and the planned mixture, after every check that needs no compute."""
    ids = token_ids(load_tokenizer(layout.tokenizer_json))
    check_objectives(cfg.objectives, cfg.seq_len, cfg.span_corruption, ids, tokenized["config"]["tokenize"].get("fim"))
    rows = make_rows(cfg.seq_len, "train")  # a window longer than every source's tokens stops here
    if "fim" in cfg.objectives:
        rearranged = {s: tokenized["counts"]["per_source"][s]["train"].get("fim_docs", 0) for s in rows.sources}
        if not any(rearranged.values()):
            raise ConfigError(
                f"train.objective fim: none of the mixed sources {list(rows.sources)} has rearranged documents; "
                "tokenize.fim.sources must include one of them"
            )
    return rows, ids, plan_data(cfg, rows)


# Optimizer steps the dry run times to estimate the run's duration (the first is left out: warm-up).
PROBE_STEPS = 4


def measure_tokens_per_s(
    model_cfg: ModelConfig, cfg: TrainConfig, make_rows: Callable[[int, str], RowSource], ids: TokenIds, run_dir: Path
) -> float:
    """Tokens per second of a few real optimizer steps of this model and batch, in a throwaway folder."""
    probe = cfg.model_copy(
        update={
            "steps": PROBE_STEPS,
            "eval_at_start": False,
            "schedule": cfg.schedule.model_copy(update={"warmup_steps": 1, "warmup_fraction": None}),
            "checkpoint": cfg.checkpoint.model_copy(update={"every": None}),
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = TrainData(build_collator(make_rows(cfg.seq_len, "train"), probe, ids))
        train(
            model_cfg,
            probe,
            data,
            Validation(run_dir, ScoringConfig(max_tokens_per_source=cfg.seq_len + 1, batch_size=1)),
            Path(tmp),
        )
        records = [json.loads(line) for line in (Path(tmp) / RunLayout(run_dir).metrics.name).read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    return float(np.median([r["tokens_per_s"] for r in steps[1:]]))


def dry_run(
    model_cfg: ModelConfig, cfg: TrainConfig, make_rows: Callable[[int, str], RowSource], run_dir: Path
) -> dict[str, Any]:
    """What `kiln train --dry-run` prints, as data: the model's size and FLOPs, the batch, the planned
    mixture (text), and the time to finish at the throughput of a few real steps. Nothing is kept."""
    layout = RunLayout(Path(run_dir))
    tokenized = read_manifest(layout.token_shards)
    model_cfg = model_cfg.resolved(tokenized["counts"]["vocab_size"])
    rows, ids, planned = prepare_data(cfg, make_rows, layout, tokenized)
    tokens = sum(cfg.geometry(step).tokens(cfg.data_ranks) for step in range(1, cfg.steps + 1))
    tokens_per_s = measure_tokens_per_s(model_cfg, cfg, make_rows, ids, Path(run_dir))
    return {
        "params": count_params(model_cfg),
        "flops_per_token": flops_per_token(model_cfg, cfg.seq_len),
        "tokens_per_step": cfg.tokens_per_step,
        "micro_batches_per_rank": cfg.grad_accum_steps,
        "processes": world_size(),
        "data_ranks": cfg.data_ranks,
        "tokens": tokens,
        "measured_tokens_per_s": round(tokens_per_s, 1),
        "estimated_seconds": round(tokens / tokens_per_s, 1),
        "mixture": format_plan(planned),
        "model": model_cfg,
    }


def format_dry_run(d: dict[str, Any]) -> str:
    hours = d["estimated_seconds"] / 3600
    return "\n".join(
        [
            f"model: {d['params']:,} params, {d['flops_per_token']:,} FLOPs per token (training, with attention)",
            (
                f"batch: {d['tokens_per_step']:,} tokens per step on {d['processes']} process(es) ({d['data_ranks']} "
                f"reading data), {d['micro_batches_per_rank']} micro-batch(es) per data rank; {d['tokens']:,} tokens "
                "in all"
            ),
            (
                f"time: {d['measured_tokens_per_s']:,.0f} tokens/s over {PROBE_STEPS - 1} measured steps here, so "
                f"about {d['estimated_seconds']:,.0f} s ({hours:.2f} h) to finish"
            ),
            "",
            d["mixture"],
        ]
    )


@dataclass(frozen=True)
class TrainInputs:
    """What the caller wires the train stage to besides its model and train sections."""

    data_config: Section  # the recipe section that configured make_rows (kiln's `mix`), hashed with model and train
    make_rows: Callable[[int, str], RowSource]  # (seq_len, split) -> the rows of that split
    scoring: ScoringConfig  # the monitoring evaluations' settings (not hashed: they change no weight)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # the layout over torchrun's processes
    # Runs whose train shards the rows also come from (replay) and whose validation splits are scored.
    reference_runs: Sequence[Path] = ()
    make_probe: MakeProbe | None = None  # the probe set's scorer per autocast dtype (train.probe_every)


@dataclass(frozen=True)
class Request:
    """What the command asked of earlier attempts: --force starts over, --from resumes the state
    after that step of the interrupted run instead of its newest."""

    force: bool = False
    from_step: int | None = None


def run(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    inputs: TrainInputs,
    run_dir: Path,
    force: bool = False,
    from_step: int | None = None,
) -> dict[str, Any]:
    """The train stage; under torchrun every rank calls it, rank 0 keeps the books (lock, partial
    folder, manifest) and the others train and return rank 0's manifest. from_step: resume an
    interrupted run from the state after that step instead of its newest."""
    ranks = init_ranks(inputs.parallel, build_precision(cfg).device)
    # Not in a `finally`: after a failure the other ranks may be inside a collective, and
    # torchrun stops them when this process exits with the error.
    manifest = train_stage(model_cfg, cfg, inputs, Path(run_dir), ranks, Request(force, from_step))
    # subtle: free the wrapped model (FSDP2 keeps reference cycles) while its process groups still
    # exist; left to interpreter shutdown, gloo's threads sometimes abort the process (exit -6).
    gc.collect()
    ranks.close()
    return manifest


def format_change(change: dict[str, dict[str, float]], init_from: str) -> str:
    """Per-source validation loss of the starting model and of the trained one: what was gained, what was forgotten."""
    width = max(len(s) for s in change)
    lines = [
        (
            f"validation loss per source, starting from {init_from} (nats/token; a negative change was gained, a "
            "positive one forgotten):"
        ),
        f"  {'source':<{width}}  {'before':>7}  {'after':>7}  {'change':>7}",
    ]
    lines += [
        f"  {s:<{width}}  {c['before']:>7.3f}  {c['after']:>7.3f}  {c['change']:>+7.3f}" for s, c in change.items()
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Start:
    """Where this attempt starts: `resume`, a state of this run's interrupted attempt; `extend`, a
    state of the finished run it goes on from (copied into the new attempt once it has begun);
    neither, from the start. `previous`: where the finished run was moved to, if it was."""

    resume: Path | None = None
    extend: Path | None = None
    previous: Path | None = None


def holds_states(folder: Path) -> bool:
    """Whether a train folder holds any complete resumable state (set aside by --from ones too)."""
    return any((folder / STATES).glob(f"**/{COMPLETE}"))


def pick_state(stage: Stage, cfg: TrainConfig, force: bool, from_step: int | None) -> Start:
    """Where to start (see Start), moving a finished run of other inputs or settings aside (kept,
    never deleted). Stops when an interrupted run with complete states has other settings (naming
    them), and when from_step names no state to go on from. --force moves both folders aside.

    Everything here happens under the stage's lock: a live run's folders are never moved."""
    stage.lock()
    if stage.store is not None:  # a run on a store: its interrupted attempt and saved states, whichever machine ran it
        refresh(stage.partial_dir / IN_PROGRESS)
        pull(stage.partial_dir, [f"{STATES}/*"])
    if from_step is not None and force:
        raise FatalError(
            f"train: --from {from_step} resumes the interrupted run and --force starts over; give one of them"
        )
    states = complete_states(stage.partial_dir / STATES)
    changes = stage.partial_changes()
    if states and changes and not force:
        raise FatalError(
            f"train: {stage.partial_dir} holds an interrupted run whose settings differ from these: "
            f"{'; '.join(changes)}. Resuming would not continue the same run: restore them, or pass --force to "
            "move it aside and start over"
        )
    finished = (stage.final_dir / MANIFEST).is_file()
    if force:
        for folder in (stage.final_dir, stage.partial_dir):
            if (folder / MANIFEST).is_file() or holds_states(folder):
                stage.set_aside(folder, "--force: starting over")
        return Start()
    if states and stage.partial_matches():
        previous = stage.set_aside(stage.final_dir, "the interrupted run resumes in its place") if finished else None
        if from_step is None:
            return Start(resume=states[-1], previous=previous)
        chosen = [s for s in states if state_step(s) == from_step]
        if not chosen:
            raise FatalError(
                f"train: --from {from_step}: no complete state for that step under {stage.partial_dir / STATES}; "
                f"there are states after steps {', '.join(str(state_step(s)) for s in states)}"
            )
        return Start(resume=chosen[0], previous=previous)
    if holds_states(stage.partial_dir):  # only states set aside by --from: never deleted with the attempt
        stage.set_aside(stage.partial_dir, "an interrupted attempt with no state to resume")
    if not finished:  # a first save cut short leaves no complete state: that attempt is started again
        if from_step is not None:
            raise FatalError(
                f"train: --from {from_step} resumes a saved state, and {stage.partial_dir / STATES} holds no "
                "complete state (nor is there a finished run to extend)"
            )
        return Start()
    changes = stage.finished_changes()
    old = old_config(read_manifest(stage.final_dir)["config"].get("train", {}), cfg)
    state, why = (
        extension_state(changes, old, cfg, stage.final_dir / STATES, from_step)
        if old is not None
        else (None, "its train section no longer validates")
    )
    if state is None and from_step is not None:
        raise FatalError(f"train: --from {from_step}: the finished run in {stage.final_dir} cannot be extended: {why}")
    if state is None and changes and all(c.startswith(tuple(f"{k}:" for k in EXTENDABLE)) for c in changes):
        log.warning("train: the finished run is not extended but started over: %s", why)
    previous = stage.set_aside(stage.final_dir, "; ".join(changes[:3]) + (" ..." if len(changes) > 3 else ""))
    if state is None:
        return Start(previous=previous)
    log.info("train: extending the finished run (now %s): this run %s", previous, why)
    return Start(extend=previous / STATES / state.name, previous=previous)


def seed_attempt(out_dir: Path, state: Path) -> Path:
    """Copy a finished run's state and its metrics up to it into the new attempt (files hard-linked
    where the filesystem allows: states are never written in place); returns the copy."""
    copy = out_dir / STATES / state.name
    try:
        shutil.copytree(state, copy, copy_function=os.link)
    except OSError:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(state, copy)
    metrics = state.parent.parent / RunLayout(out_dir).metrics.name
    if metrics.is_file():
        shutil.copyfile(metrics, out_dir / metrics.name)  # the loop keeps the records up to the state's step
    return copy


def reference_inputs(layout: RunLayout, reference_runs: Sequence[Path], init_from: str | None) -> list[Path | str]:
    """The files of other runs this stage reads (hashed as inputs): a reference run's token shards
    (with its tokenizer, which must be this run's), the starting checkpoint's weights."""
    inputs = []
    for run in map(RunLayout, reference_runs):
        if not refresh(run.token_shards / MANIFEST):  # a run in a store: read fresh from it
            raise ConfigError(
                f"mix.replay.run {run.root}: no token shards there ({run.token_shards / MANIFEST} missing); run "
                "`kiln tokenize` for it first"
            )
        # kiln_tokenizer.json too: an imported tokenizer's boundaries (bos, eos, pad) live there.
        recorded_outputs(run.stage(TOKENIZER))  # a run in a store: its tokenizer's files, fetched and checked
        if any(
            sha256_file(run.tokenizer_json.with_name(n)) != sha256_file(layout.tokenizer_json.with_name(n))
            for n in (layout.tokenizer_json.name, TOKENIZER_META)
        ):
            raise ConfigError(
                f"mix.replay.run {run.root} has another tokenizer than this run, or other document boundaries; set "
                f"tokenizer.from_run to the run both take it from, with the same tokenizer.boundaries, so that ids "
                "mean the same tokens"
            )
        # Its shards, and its train manifest where it trained: the replayed shares are what that training read.
        trained = run.stage(TRAIN) / MANIFEST
        inputs += [
            *(p for p in recorded_outputs(run.token_shards) if p.suffix in (".bin", ".idx", ".npy")),
            *([trained] if refresh(trained) else []),
        ]
    if init_from and is_url(init_from):  # a checkpoint in a store: its objects, by URL and ETag
        inputs += [f"{init_from.rstrip('/')}/{WEIGHTS}", f"{init_from.rstrip('/')}/{CONFIG}"]
    elif init_from:
        inputs += [Path(init_from) / WEIGHTS, Path(init_from) / CONFIG]
    return inputs


def train_stage(
    model_cfg: ModelConfig, cfg: TrainConfig, inputs: TrainInputs, run_dir: Path, ranks: Ranks, request: Request
) -> dict[str, Any]:
    layout = RunLayout(run_dir)
    tokenized = read_manifest(layout.token_shards)
    check_layout(model_cfg, cfg, inputs.parallel, ranks.degrees, resolve_precision(cfg.precision, "train").amp_dtype)
    stage = None
    if ranks.is_main:  # inputs are hashed and checked once, here
        shards = (p for p in recorded_outputs(layout.token_shards) if p.suffix in (".bin", ".idx", ".npy"))
        files = [layout.tokenizer_json, *shards, *reference_inputs(layout, inputs.reference_runs, cfg.init_from)]
        # data_config is recorded under "mix", the recipe section a kiln run configures its data with.
        sections = {"model": model_cfg, "train": cfg, "mix": inputs.data_config}
        stage = Stage(run_dir, TRAIN, sections, files, upstream=[TOKENIZE])

    def finished(m: dict[str, Any]) -> str:
        return f"{m['counts']['steps']} steps, val loss {m['counts']['val_after']['all']['loss']:.3f}"

    if url_of(run_dir) is not None and stage is None and os.environ.get("LOCAL_RANK", "0") == "0":
        # A run on a store, another machine than rank 0's: its mirror gets the shards and tokenizer once, checked.
        for run in [layout, *map(RunLayout, inputs.reference_runs)]:
            recorded_outputs(run.token_shards)
        recorded_outputs(layout.stage(TOKENIZER))
    ranks.barrier()  # every machine's mirror holds them before any rank reads them
    done = ranks.broadcast(stage.up_to_date(request.force, finished) if stage else None)
    if done:
        return done
    model_cfg = resolved_vocab(model_cfg, tokenized["counts"]["vocab_size"])
    # Everything up to begin() stops before any output is touched: an objective the tokenizer or
    # shards cannot serve, a window longer than every source's tokens, an over-repeated source.
    rows, ids, planned = prepare_data(cfg, inputs.make_rows, layout, tokenized)
    batches = build_collator(rows, cfg, ids, ranks.data_rank, ranks.data_world)
    val_batches = objective_val_batches(inputs.make_rows, cfg, inputs.scoring, ids)
    start = Start()
    if stage is not None:  # after every check: a finished run is moved aside only for a run that starts
        start = pick_state(stage, cfg, request.force, request.from_step)
        stage.begin(resume=start.resume is not None)
        if start.resume is not None and request.from_step is not None:
            set_aside_after(start.resume.parent, request.from_step)  # the abandoned later states are kept aside
    resume_from = start.resume or (
        seed_attempt(stage.dir, start.extend) if stage is not None and start.extend else None
    )
    # Only rank 0 writes into out_dir; every rank stores its own state files under the lock rank 0 holds.
    out_dir, resume_from, fences = ranks.broadcast((str(stage.dir), resume_from, tokens()) if stage else None)
    adopt(fences)
    data = TrainData(batches, rows.adapt_every, rows.report_windows)
    validation = Validation(run_dir, inputs.scoring, val_batches, inputs.reference_runs, inputs.make_probe)
    result = train(model_cfg, cfg, data, validation, Path(out_dir), Placement(ranks, inputs.parallel, resume_from))
    if stage is None:
        return ranks.broadcast(None)  # rank 0's manifest, once it is written
    counts = stage_counts(model_cfg, cfg, result, batches.tokens_by_source(), planned, ranks)
    if start.previous is not None:  # a finished run of other inputs or settings, kept
        counts["previous_run"] = str(start.previous)
    if start.extend is not None:
        counts["extended_from"] = {"run": str(start.previous), "step": state_step(start.extend)}
    extra = {"model": model_cfg.model_dump(mode="json"), "monitoring_eval": inputs.scoring.model_dump(mode="json")}
    logs = [stage.dir / layout.metrics.name, *sorted((stage.dir / TENSORBOARD).glob("*"))]
    lines = summary(cfg, result, ranks, start, counts)
    return ranks.broadcast(stage.finish(result.checkpoint, counts, lines, extra=extra, logs=logs))


def resolved_vocab(model_cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    """model_cfg with the tokenizer's vocabulary, or a larger one it asks for."""
    if model_cfg.vocab_size is not None and model_cfg.vocab_size < vocab_size:
        raise ConfigError(
            f"model.vocab_size {model_cfg.vocab_size} is below the tokenizer's {vocab_size} ids; "
            "leave it unset to take the tokenizer's"
        )
    return model_cfg.resolved(vocab_size)


def stage_counts(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    result: TrainResult,
    tokens_by_source: dict[str, int],
    planned: dict[str, Any],
    ranks: Ranks,
) -> dict[str, Any]:
    """The manifest's counts of a finished run."""
    return {
        "params": count_params(model_cfg),
        "params_non_embedding": count_params(model_cfg, include_embeddings=False),
        "steps": cfg.steps,
        "tokens_trained": result.tokens_trained,
        "tokens_by_source": tokens_by_source,
        "flops_per_token": flops_per_token(model_cfg, cfg.seq_len),
        "train_flops": result.train_flops,
        "final_train_loss": round(result.final_loss, 5),
        "val_before": result.val_before,
        "val_after": result.val_after,
        "device": str(result.device),
        "device_name": torch.cuda.get_device_name(result.device)
        if result.device.type == "cuda"
        else "cpu",  # what the planner's peak table is matched on
        "max_rss_mb": result.max_rss_mb,  # rank 0's peak resident memory while training (None off Linux)
        "model_states_mb": result.model_states_mb,  # per rank: weights, gradients, optimizer states held (MiB)
        "processes": ranks.world,
        "parallel": ranks.degrees,  # kiln.train.mesh's dimensions and their degrees
        "rollbacks": result.rollbacks,
        "mixture": {
            "planned": planned["total"],
            "realized": result.mixture,
            **({"planned_languages": planned["languages"]} if "languages" in planned else {}),
        },
    }


def summary(cfg: TrainConfig, result: TrainResult, ranks: Ranks, start: Start, counts: dict[str, Any]) -> str:
    """The stage's summary lines; with train.init_from, also each source's change (added to counts as val_change)."""
    before, after = result.val_before, result.val_after
    processes = f" x {ranks.world} processes ({ranks.describe()})" if ranks.world > 1 else ""
    lines = [
        (
            f"{counts['params']:,} params, {cfg.steps} steps, {result.tokens_trained:,} tokens on "
            f"{result.device}{processes}"
        )
    ]
    if before:
        lines.append(
            f"validation loss {before['all']['loss']:.3f} -> {after['all']['loss']:.3f} nats/token, bpb "
            f"{before['all']['bpb']:.3f} -> {after['all']['bpb']:.3f}"
        )
    else:
        lines.append(f"validation loss {after['all']['loss']:.3f} nats/token, bpb {after['all']['bpb']:.3f}")
    if "objective" in after:
        lines.append(
            f"objective {cfg.objective}: validation loss "
            + (f"{before['objective']['loss']:.3f} -> " if before else "")
            + f"{after['objective']['loss']:.3f} nats per target token"
        )
    if cfg.init_from and before:
        counts["val_change"] = {
            s: {
                "before": before["sources"][s]["loss"],
                "after": r["loss"],
                "change": round(r["loss"] - before["sources"][s]["loss"], 5),
            }
            for s, r in after["sources"].items()
        }
        lines.append(format_change(counts["val_change"], cfg.init_from))
    if start.extend is not None:
        lines.append(
            f"extended the finished run (kept in {start.previous}) from its state after step {state_step(start.extend)}"
        )
    elif start.previous is not None:
        lines.append(f"the earlier run of this stage, of other inputs or settings, is kept in {start.previous}")
    seen, plan = counts["tokens_by_source"], counts["mixture"]["planned"]
    lines.append(
        "tokens read per source (share, planned share): "
        + ", ".join(
            (
                f"{s} {n:,} ({n / max(sum(seen.values()), 1):.1%}, "
                f"{plan[s]['tokens'] / max(sum(p['tokens'] for p in plan.values()), 1):.1%})"
            )
            for s, n in seen.items()
        )
    )
    return "\n".join(lines)
