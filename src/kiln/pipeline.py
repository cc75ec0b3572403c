"""Running stages by name, and the end-to-end demo with its summary.

Each stage function receives only its own recipe sections; where one stage needs another's
code (train draws its batches through mix's sampler), the wiring is here, so stage packages
never import each other. The demo runs every stage in order (each skipped when already
current) and writes `<run>/summary.json`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from kiln.core.errors import FatalError, KilnError
from kiln.core.layout import CURATE, RunLayout
from kiln.core.ranks import is_main_process
from kiln.recipe import Recipe, load_recipe, recipe_to_yaml

log = logging.getLogger("kiln")

STAGES = ("curate", "tokenizer", "tokenize", "train", "eval", "generate", "export")
# The model must visibly learn: final validation loss at least this fraction below step 0's.
MIN_LOSS_DROP = 0.30


def _runner(stage: str) -> Callable[..., dict[str, Any]]:
    # Imports are deferred so `kiln curate` never pays for importing torch.
    if stage == "curate":
        from kiln.curate.run import run as curate
        return lambda r, force: curate(r.curate, r.run_dir, force)
    if stage == "tokenizer":
        from kiln.tokenize.train import run as train_tokenizer
        return lambda r, force: train_tokenizer(r.tokenizer, r.run_dir, embedding_shape(r), force)
    if stage == "tokenize":
        from kiln.tokenize.encode import run as tokenize
        return lambda r, force: tokenize(r.tokenize, r.run_dir, force)
    if stage == "train":
        from kiln.evaluate.probe import build_probe
        from kiln.mix.sampler import build_sampler
        from kiln.train.run import run as train

        # The train stage knows its data only as a RowSource: mix's sampler over this run's
        # token shards, built once train knows its seq_len; the mix section is hashed with it.
        def train_stage(r: Recipe, force: bool, from_step: int | None = None) -> dict[str, Any]:
            make_rows = partial(build_sampler, RunLayout(r.run_dir).token_shards, r.mix)
            replay = [Path(r.mix.replay.run)] if r.mix.replay else []
            # The probe set is evaluate's; the trainer only knows when to call it (train.probe_every).
            make_probe = partial(build_probe, r.run_dir, r.eval.probe)
            return train(r.model, r.train, r.mix, make_rows, r.eval.scoring(), r.run_dir, force, r.parallel, from_step, replay, make_probe)

        return train_stage
    if stage == "eval":
        from kiln.evaluate.run import run as evaluate
        return lambda r, force: evaluate(r.eval, r.run_dir, force, read_for_eval)
    if stage == "generate":
        from kiln.evaluate.generate import run as generate
        return lambda r, force: generate(r.generate, r.run_dir, force)
    if stage == "export":
        from kiln.evaluate.export import run as export
        return lambda r, force: export(r.export, r.generate, r.run_dir, force)
    raise ValueError(f"unknown stage {stage!r}")


def read_for_eval(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """`kiln eval --data`: a file's documents as curate reads them, (source, text) each, and a line
    per record that could not be read (kiln.evaluate.run.ReadFile)."""
    from kiln.curate.audit import Ledger
    from kiln.curate.readers import InputConfig, ReadLimits, plan_reads, read_task

    ledger = Ledger()
    tasks = plan_reads((InputConfig(path=str(path)),), None, 1 << 40)  # one task: the file whole
    docs = [(d.source, d.text) for task in tasks for d in read_task(task, ReadLimits(), ledger)]
    return docs, [f"{q.get('file') or path}:{q.get('position') or '?'}: {q.get('error') or 'unreadable'}" for q in ledger.quarantined]


def dry_run_train(recipe: Recipe) -> str:
    """`kiln train --dry-run`: size, FLOPs, batch, the planner's memory per device, the time to
    finish at a measured throughput, and the planned data mixture phase by phase. Trains nothing."""
    import torch

    from kiln.core.ranks import world_size
    from kiln.mix.sampler import build_sampler
    from kiln.model.precision import resolve_precision
    from kiln.plan.memory import format_memory
    from kiln.train.run import dry_run, format_dry_run

    t = recipe.train
    d = dry_run(recipe.model, t, partial(build_sampler, RunLayout(recipe.run_dir).token_shards, recipe.mix), recipe.run_dir)
    amp = resolve_precision(t.precision, "train").amp_dtype
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp]
    degrees = recipe.parallel.degrees(world_size()) if world_size() > 1 else None
    memory = layout_memory(d["model"], degrees, recipe.parallel.reshard_after_forward, recipe.parallel.sequence_parallel, t.micro_batch_size, t.seq_len, precision, t.activation_checkpointing)
    layout = ", ".join(f"{k} {v}" for k, v in degrees.items()) if degrees else "one process"
    return format_dry_run(d) + f"\n\nmemory per rank ({layout}; kiln plan memory):\n" + format_memory(memory)


def layout_memory(model: Any, degrees: dict[str, int] | None, reshard_after_forward: bool, sequence_parallel: bool, micro_batch: int, seq_len: int, precision: str, checkpointing: str) -> dict[str, Any]:
    """The planner's memory per rank (kiln plan memory) for a kiln layout (kiln.train.mesh's degrees;
    None: one process), in the planner's terms by kiln.plan.layout.planner_layout."""
    from kiln.plan.layout import planner_layout
    from kiln.plan.memory import Shape, plan_memory

    layout = planner_layout(degrees or {"dp_replicate": 1, "dp_shard": 1}, reshard_after_forward)
    return plan_memory(Shape.from_config(model), **layout, micro_batch=micro_batch, seq_len=seq_len, precision=precision, checkpointing=checkpointing, sequence_parallel=sequence_parallel)


def report_hooks(run_dir: Path) -> Any:
    """What `kiln report` borrows from other stages: the run's PII redaction for removed examples,
    `kiln curate --explain` for every id shown, and the planner's figures for the trained model."""
    from kiln.curate.explain import explain_many
    from kiln.curate.steps.pii import PIIConfig, RedactPII
    from kiln.report.run_files import Hooks
    from kiln.train.mesh import ParallelConfig

    layout = RunLayout(run_dir)
    try:  # the run's own recipe; a recipe kiln can no longer read leaves the defaults
        recipe = load_recipe(str(layout.recipe_yaml)) if layout.recipe_yaml.is_file() else None
    except KilnError as e:
        log.warning("report: %s: %s; PII redaction and the layout use their defaults", layout.recipe_yaml, e)
        recipe = None
    pii = RedactPII(recipe.curate.pii if recipe else PIIConfig())
    parallel = recipe.parallel if recipe else ParallelConfig()
    return Hooks(redact=lambda text: pii.redact(text)[0], explain=partial(explain_many, layout.stage("curate")), estimate=partial(plan_estimate, parallel))


def plan_estimate(parallel: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    """The planner's memory per device and training FLOPs for a finished train stage (its manifest),
    and its time at the default MFU where the device's dense peak is known."""
    from kiln.core.hardware import peak_flops_of
    from kiln.model.config import ModelConfig
    from kiln.model.precision import dtype_on
    from kiln.plan.hardware import DEFAULT_MFU

    t, counts = manifest["config"]["train"], manifest["counts"]
    world = counts.get("processes", 1)
    degrees = counts.get("parallel")  # recorded since tensor parallelism; before, the recipe's section laid out data ranks alone
    if degrees is None:
        try:
            degrees = {**dict(zip(("dp_replicate", "dp_shard"), parallel.layout(world), strict=True)), "tp": 1}
        except KilnError:  # the recipe now asks for another layout than the run had
            degrees = {"dp_replicate": world, "dp_shard": 1, "tp": 1}
    device = str(counts.get("device", "cpu"))
    precision = dtype_on(t["precision"]["dtype"], device.split(":")[0])  # the run's device ("cuda:0"), not this machine's
    memory = layout_memory(ModelConfig.model_validate(manifest["model"]), degrees, parallel.reshard_after_forward, parallel.sequence_parallel, t["micro_batch_size"], t["seq_len"], precision, t["activation_checkpointing"])
    flops = counts["flops_per_token"] * counts["tokens_trained"]
    peak = peak_flops_of(str(counts.get("device_name", ""))) if device.startswith("cuda") else None
    time_note = f"{flops / (peak * world * DEFAULT_MFU):,.0f} s at {DEFAULT_MFU:.0%} MFU (kiln plan's default)" if peak else "needs a GPU's dense peak (a CPU has none in the planner's table)"
    return {"memory_gb": memory["total_gb"], "layout": f"dp={memory['dp']} tp={memory['tp']} pp={memory['pp']}, ZeRO {memory['zero']}, {precision}, micro-batch {t['micro_batch_size']} x {t['seq_len']}", "train_flops": flops, "flops_per_token": counts["flops_per_token"], "time_note": time_note}


def build_report(run_dir: Path, watch_s: float | None = None) -> Path:
    """`kiln report`: write <run>/report/index.html; with watch_s, rebuild it every watch_s seconds until interrupted."""
    from kiln.report.build import build_report as build
    from kiln.report.build import watch

    if not Path(run_dir).is_dir():
        raise FatalError(f"{run_dir}: no such run directory; give the run's name with --run NAME (and runs_dir with --set runs_dir=DIR)")
    hooks = report_hooks(run_dir)
    return watch(run_dir, hooks, watch_s) if watch_s else build(run_dir, hooks)


def embedding_shape(recipe: Recipe) -> Any:
    """The model width the tokenizer report prices its embedding table at."""
    from kiln.tokenize.train import EmbeddingShape

    return EmbeddingShape(d_model=recipe.model.d_model, tied_embeddings=recipe.model.tie_embeddings)


def save_resolved(recipe: Recipe) -> None:
    recipe.run_dir.mkdir(parents=True, exist_ok=True)
    RunLayout(recipe.run_dir).recipe_yaml.write_text(recipe_to_yaml(recipe), encoding="utf-8")


def run_stage(stage: str, recipe: Recipe, force: bool = False, **options: Any) -> dict[str, Any]:
    """Run one stage of the recipe; options go to that stage's runner (train: from_step)."""
    manifest = _runner(stage)(recipe, force, **options)
    if is_main_process():  # under torchrun every rank runs the stage; one writes the run's files
        save_resolved(recipe)  # after success: the run's recipe.yaml describes what its stages did
    return manifest


def corpus_files(curate_dir: Path) -> dict[str, dict[str, Any]]:
    """The files a finished curate stage read, path -> {bytes, sha256} (its manifest's inputs); {} before any."""
    path = Path(curate_dir) / "manifest.json"
    return {i["path"]: i for i in json.loads(path.read_text())["inputs"]} if path.is_file() else {}


def corpus_changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the demo read this time against the last time: the files and bytes, and which changed, came or went."""
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    since = {"changed": len(changed), "added": len(added), "removed": len(removed), "examples": (changed + added + removed)[:5]} if before else None
    return {"files": len(after), "bytes": sum(i["bytes"] for i in after.values()), "since_last_demo": since}


def run_demo(recipe: Recipe, force: bool = False) -> dict[str, Any]:
    """Every stage in order, each skipped when current; a stage whose inputs changed is redone, and
    so are the stages after it (a finished training run of other data is moved aside, kept)."""
    layout = RunLayout(recipe.run_dir)
    read_before = corpus_files(layout.stage(CURATE))  # what the last demo read, to say what changed since
    manifests = {}
    for stage in STAGES:
        try:
            manifests[stage] = run_stage(stage, recipe, force)
        except FatalError as e:
            if stage != "export":
                raise
            log.warning("demo: not exported: %s", e)  # a model option transformers' Llama and Qwen3 lack
    summary = build_summary(manifests)
    summary["corpus"] = corpus_changes(read_before, corpus_files(layout.stage(CURATE)))  # files, sizes and sha256: curate/manifest.json
    try:  # the page reads the stages' files, not summary.json; a page that fails costs no finished stage
        summary["report"] = str(build_report(recipe.run_dir))
    except Exception as e:  # noqa: BLE001 - reported, and `kiln report` can be run again
        log.warning("demo: the report was not written: %s; run `kiln report --run %s` for the error in full", e, recipe.run_dir.name)
        summary["report"] = None
    path = RunLayout(recipe.run_dir).summary_json
    path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("demo: summary written to %s", path)
    return summary


def build_summary(m: dict[str, dict[str, Any]]) -> dict[str, Any]:
    curated, train = m["curate"]["counts"], m["train"]["counts"]
    before, after = m["eval"]["counts"]["before"], m["eval"]["counts"]["after"]
    summary = {
        "docs_in": curated["docs_in"],
        "docs_out": curated["docs_out"],
        "removed": curated["removed"],
        "quarantined": curated["quarantined"],
        "per_source": {
            s: {"docs_in": t["docs_in"], "docs_out": t["docs_out"], "removed": t["removed"], "quarantined": t["quarantined"]}
            for s, t in curated["per_source"].items()
        },
        "tokenizer_bytes_per_token": m["tokenizer"]["counts"].get("heldout_bytes_per_token"),  # None: not measured (a tokenizer imported with a model)
        "train_tokens_available": m["tokenize"]["counts"]["train_tokens"],
        "params": train["params"],
        "tokens_trained": train["tokens_trained"],
        "val_loss_before": before["all"]["loss"],
        "val_loss_after": after["all"]["loss"],
        "val_bpb_before": {**{s: r["bpb"] for s, r in before["sources"].items()}, "all": before["all"]["bpb"]},
        "val_bpb_after": {**{s: r["bpb"] for s, r in after["sources"].items()}, "all": after["all"]["bpb"]},
        "sample": m["generate"]["counts"]["sample"],
        "hf_folder": m["export"]["counts"]["folder"] if "export" in m else None,
        "previous_train_run": train.get("previous_run"),  # a finished run of other inputs or settings, moved aside
    }
    drop = 1 - after["all"]["loss"] / before["all"]["loss"]
    summary["val_loss_drop"] = round(drop, 4)
    objective = train["val_after"].get("objective")
    if objective is not None and train["val_before"]:
        # Not next-token prediction alone: the objective's own held-out loss says whether it learned.
        first = train["val_before"]["objective"]["loss"]
        summary["objective"] = {"name": m["train"]["config"]["train"]["objective"], "loss_before": round(first, 5), "loss_after": round(objective["loss"], 5)}
        drop = 1 - objective["loss"] / first
    summary["learned"] = drop >= MIN_LOSS_DROP
    if "val_change" in train:  # continued pretraining: it learned if this run's own sources gained
        summary["val_change"] = train["val_change"]
        summary["learned"] = all(c["change"] < 0 for s, c in train["val_change"].items() if "/" not in s)
    return summary


def format_summary(s: dict[str, Any]) -> str:
    corpus, since = s["corpus"], s["corpus"]["since_last_demo"]
    lines = [
        f"corpus: {corpus['files']:,} files, {corpus['bytes'] / 1e6:.1f} MB read (each with its size and sha256 in curate/manifest.json); "
        + ("first demo of this run" if since is None else "unchanged since the last demo" if not any(since[k] for k in ("changed", "added", "removed"))
           else f"since the last demo {since['changed']} changed, {since['added']} added, {since['removed']} gone (e.g. {', '.join(since['examples'][:3])})"),
        f"documents: {s['docs_in']:,} in, {s['docs_out']:,} kept, {s['quarantined']} quarantined",
        "removed: " + (", ".join(f"{r}={n}" for r, n in s["removed"].items()) or "none"),
        f"tokenizer: {s['tokenizer_bytes_per_token']} bytes/token on held-out text" if s["tokenizer_bytes_per_token"] else "tokenizer: bytes/token not measured (no held-out documents)",
        f"model: {s['params']:,} params trained on {s['tokens_trained']:,} tokens",
    ]
    if s.get("previous_train_run"):
        lines.append(f"  the training run before it, of other data or settings, is kept in {s['previous_train_run']}")
    lines.append(f"validation loss: {s['val_loss_before']:.3f} -> {s['val_loss_after']:.3f} nats/token ({100 * s['val_loss_drop']:.1f}% lower)")
    for source, after in s["val_bpb_after"].items():
        lines.append(f"  bits/byte {source:<6} {s['val_bpb_before'][source]:.3f} -> {after:.3f}")
    if objective := s.get("objective"):
        lines.append(f"objective {objective['name']}: held-out loss {objective['loss_before']:.3f} -> {objective['loss_after']:.3f} nats per target token ({1 - objective['loss_after'] / objective['loss_before']:.1%} lower)")
    if change := s.get("val_change"):
        lines.append("validation loss per source, from the starting model (negative: gained; positive: forgotten):")
        lines += [f"  {source:<12} {c['before']:.3f} -> {c['after']:.3f} ({c['change']:+.3f})" for source, c in change.items()]
    lines.append(f"sample: {s['sample']!r}")
    if s.get("report"):
        lines.append(f"report: {s['report']} (open it in a browser)")
    if s["hf_folder"]:
        lines.append(f"Hugging Face folder: {s['hf_folder']} (AutoModelForCausalLM.from_pretrained loads it)")
    if not s["learned"] and change:
        lines.append("WARNING: this run's own sources did not all gain; train longer or raise train.optim.lr")
    elif not s["learned"]:
        lines.append(f"WARNING: the {'objective' if objective else 'validation'} loss fell less than {MIN_LOSS_DROP:.0%}; train longer or raise train.optim.lr")
    return "\n".join(lines)
