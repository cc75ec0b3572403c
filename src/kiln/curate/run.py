"""The curate stage's driver: plan the read tasks, run the nine phases in order, check the accounting.

`run(cfg, run_dir)` decides whether the stage is up to date (its inputs: the input files, the
evaluation sets, the quality models), builds the executor, and runs each phase's tasks
(kiln.curate.phases) whose completion marker is missing, so an interrupted run, re-run with the
same config and inputs, skips finished tasks. Between phases it does the small global steps
(the boilerplate line list, the decontamination index). The run ends with the accounting check
(input = kept + removed + quarantined, per task and per source), the audit (`removed.parquet`,
`quarantine.jsonl`, `clusters.parquet`, `audit/`) and the funnel per source (kiln.curate.report).
The manifest's `phases` give each phase's time and peak memory per process.
Not handled here: what a phase does (kiln.curate.phases), the MinHash rule (kiln.curate.dedup.near).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from kiln.core.atomic import save_npy
from kiln.core.docshards import SUFFIX, read_shard
from kiln.core.errors import FatalError
from kiln.core.executors import Executor, build_executor
from kiln.core.layout import CURATE, SHARDS, SUMMARY
from kiln.core.manifest import Stage
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.minhash import memory_estimate
from kiln.curate.dedup.ngram_index import build_index
from kiln.curate.phases import MB, PHASES, Job, duplicate_ids, run_job, save_renames
from kiln.curate.quality.config import CLASSIFIER_DIR, LM_DIR
from kiln.curate.readers import ReadTask, plan_reads, task_paths
from kiln.curate.report import account, format_pii, format_summary, totals, write_audit, write_decontamination, write_pii_examples
from kiln.curate.steps.chain import funnel_rows
from kiln.curate.steps.decontaminate import format_report
from kiln.curate.steps.quality import CLASSIFIER_SCORES, LM_SCORES, ClassifierFilter, PerplexityFilter, model_files, model_folder, release_models

log = logging.getLogger("kiln.curate")


def partition_count(tasks: int) -> int:
    """Hash partitions for the global phases: a power of two near a quarter of the task count, at most 256."""
    target = max(1, min(256, tasks // 4))
    return 1 << (target.bit_length() - 1)


def run_phase(executor: Executor, jobs: list[Job], desc: str, weight: Callable[[Job], int] = lambda job: 1, unit: str = "task") -> dict[int, dict[str, Any]]:
    """Run the jobs whose marker is missing, with a progress bar; return every job's marker content by index."""
    results: dict[int, dict[str, Any]] = {}
    todo = []
    for job in jobs:
        job.folder.mkdir(parents=True, exist_ok=True)
        if job.marker.is_file():
            results[job.index] = json.loads(job.marker.read_text(encoding="utf-8"))
        else:
            todo.append(job)
    if jobs and len(todo) < len(jobs):
        log.info("curate: %s phase: %d of %d tasks already finished, skipped", jobs[0].phase, len(jobs) - len(todo), len(jobs))
    by_index = {job.index: job for job in jobs}
    started, docs = time.perf_counter(), 0
    with tqdm(total=sum(map(weight, jobs)), initial=sum(weight(by_index[i]) for i in results), desc=desc, unit=unit, unit_scale=unit == "B", dynamic_ncols=True, leave=False) as bar:
        for index, summary in executor.imap_unordered(run_job, todo):
            results[index] = summary
            docs += summary.get("docs", 0)
            bar.update(weight(by_index[index]))
            bar.set_postfix_str(f"{docs / max(time.perf_counter() - started, 1e-9):,.0f} docs/s", refresh=False)
    return results


def run(cfg: CurateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    """Curate `cfg.inputs` into `run_dir/curate/`; returns the stage's manifest (as it was, when up to date)."""
    tasks = plan_reads(cfg.inputs, None if cfg.max_total_mb is None else int(cfg.max_total_mb * MB), int(cfg.shard_mb * MB))
    if not tasks:
        raise FatalError("curate: no input documents found; check the --input paths or curate.inputs (paths and globs) in the recipe")
    refuse_own_outputs(tasks, run_dir / CURATE)
    inputs = {p for t in tasks for p in task_paths(t) if os.access(p, os.R_OK)}  # an unreadable file is quarantined by its task
    eval_sets = decontamination_sets(cfg)
    inputs |= eval_sets  # a changed evaluation set redoes the stage
    models, cfg_for_tasks = quality_models(cfg, run_dir)
    inputs |= models  # so does a retrained quality model
    stage = Stage(run_dir, CURATE, {"curate": cfg}, inputs=inputs)
    if done := stage.up_to_date(force, lambda m: f"{m['counts']['docs_out']} docs kept"):
        return done
    check_quality_models(cfg_for_tasks)
    stage.begin(resume=not force)
    (stage.dir / SHARDS).mkdir(exist_ok=True)
    stage_dir = stage.dir.resolve()  # tasks may run on other machines (ray): no path relative to this process's cwd
    partitions = partition_count(len(tasks))
    executor = build_executor(cfg.executor, "curate.executor")
    total_bytes = sum(t.size for t in tasks)
    log.info("curate: %d read tasks (%.1f MB) from %d inputs, %d partitions, %s executor with %d workers",
             len(tasks), total_bytes / MB, len(cfg.inputs), partitions, cfg.executor.kind, executor.workers)

    def jobs(phase: str, count: int | None = None, parts: int = partitions) -> list[Job]:
        if count is None:
            return [Job(phase, t.index, stage_dir, cfg_for_tasks, parts, t, len(tasks)) for t in tasks]
        return [Job(phase, p, stage_dir, cfg_for_tasks, parts, tasks=len(tasks)) for p in range(count)]

    timings: dict[str, dict[str, float]] = {}

    def phase(name: str, phase_jobs: list[Job], weight: Callable[[Job], int] = lambda job: 1, unit: str = "task") -> dict[int, dict[str, Any]]:
        started = time.perf_counter()
        results = run_phase(executor, phase_jobs, f"curate {PHASES.index(name) + 1}/{len(PHASES)} {name}", weight, unit)
        timings[name] = {"seconds": round(time.perf_counter() - started, 3), "max_rss_mb": round(max((r.get("rss_mb", 0) for r in results.values()), default=0), 1)}
        return results

    raw_bytes: Callable[[Job], int] = lambda job: job.task.size if job.task else 0
    near: dict[str, Any] = {}
    contamination_index = None
    try:
        # First: a malformed evaluation set stops the run before any document is read.
        contamination_index = build_contamination_index(cfg, stage.dir / "work" / "decontaminate") if eval_sets else None
        read = phase("read", jobs("read"), raw_bytes, "B")
        settle_duplicate_ids(cfg, stage.dir / "work" / "read", len(tasks))
        boilerplate_path = stage.dir / "work" / "lines" / "boilerplate.npy"
        if cfg.line_dedup.enabled and not boilerplate_path.is_file():
            phase("lines", jobs("lines", partitions))
            parts = [np.load(stage.dir / "work" / "lines" / f"{p:05d}.npy") for p in range(partitions)]
            save_npy(boilerplate_path, np.concatenate(parts))
        filtered = phase("filter", jobs("filter"), raw_bytes, "B")
        if cfg.exact_dedup.enabled:
            phase("dedup", jobs("dedup", partitions))
        if cfg.minhash_dedup.enabled:
            near = near_dedup(cfg, filtered, len(tasks), partitions, phase, jobs, raw_bytes)
        written = phase("write", jobs("write"), raw_bytes, "B")
    finally:
        executor.close()

    ledger = account(cfg, tasks, [read, filtered, written])  # the accounting check: raises when a document is lost
    outputs, records = write_audit(ledger, stage.dir, [read, filtered, written], tasks)
    report = None
    if contamination_index is not None:
        report, report_path = write_decontamination(contamination_index, records.get("contamination", []), stage.dir)
        outputs.append(report_path)
    examples, examples_path = write_pii_examples(records.get("pii_example", []), stage.dir)
    outputs.append(examples_path)
    duplicates_path = stage.dir / "audit" / "duplicate_ids.json"
    duplicates_path.write_text(json.dumps(records.get("duplicate_id", [])[: max(cfg.sample_size, 1)], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    outputs.append(duplicates_path)
    shutil.rmtree(stage.dir / "work")
    counts = {**totals(ledger), **({"minhash": near} if near else {})}
    shards = sorted((stage.dir / SHARDS).glob("*" + SUFFIX))
    if counts["docs_out"] == 0:
        log.warning("curate: no document was kept (%d in); see %s and %s", counts["docs_in"], stage.final_dir / SUMMARY, stage.final_dir / "quarantine.jsonl")
    # phase timings vary from run to run: beside the counts, never in them
    pii = format_pii(counts, examples)
    for source in sorted(set(cfg.sources) - set(counts["per_source"])):
        log.warning("curate: curate.sources.%s sets steps for a source no input produced (sources: %s)", source, ", ".join(counts["per_source"]) or "none")
    summary = format_summary(counts, funnel_rows(cfg), cfg) + ("\n" + pii if pii else "") + ("\n" + format_report(report) if report is not None else "")
    return stage.finish(shards + outputs, counts, summary, extra={"phases": timings})


# --- the stage's inputs and global steps between phases -------------------------------------------


def settle_duplicate_ids(cfg: CurateConfig, read_dir: Path, tasks: int) -> None:
    """Find ids that several documents share (across every read task); rename the later holders
    in the filter phase (curate.duplicate_ids: rename) or stop naming the first (refuse)."""
    found = duplicate_ids(read_dir, tasks)
    if found and cfg.duplicate_ids == "refuse":
        task, positions = min(found.items())
        position = min(positions)
        doc = next(d for i, d in enumerate(read_shard(read_dir / f"{task:05d}{SUFFIX}")) if i == position)
        total = sum(len(p) for p in found.values())
        raise FatalError(f"curate: {total} input document(s) repeat an id another document has, the first {doc.id!r} (source {doc.source}); "
                         "give every record its own id, or set curate.duplicate_ids=rename to have later ones renamed <id>#<n>")
    if found:
        log.warning("curate: %d document(s) repeat an id another document has; renamed <id>#<n> (audit/duplicate_ids.json)", sum(len(p) for p in found.values()))
    save_renames(read_dir, found, tasks)


def refuse_own_outputs(tasks: list[ReadTask], stage_dir: Path) -> None:
    """Stop when an input file lies in this run's curate stage (its shards, its audit files, or a
    folder above them named as input): the stage replaces those files while it would read them."""
    own = (stage_dir.resolve(), stage_dir.resolve().with_name(stage_dir.name + ".partial"))  # finished, or being built
    for task in tasks:
        for path in task_paths(task):
            if any(Path(path).resolve().is_relative_to(folder) for folder in own):
                raise FatalError(f"curate: input file {path} is inside this run's own curate stage ({stage_dir}), which the stage rewrites; "
                                 "curate another run's shards by naming them in a new run (--run NAME), or copy them out first")


def quality_models(cfg: CurateConfig, run_dir: Path) -> tuple[set[Path], CurateConfig]:
    """The model files the enabled quality filters read (stage inputs), and the config the tasks
    get: each such filter's `model` made an absolute folder, so a worker anywhere finds it."""
    files: set[Path] = set()
    update: dict[str, Any] = {}
    for name, default, scores in (("perplexity", LM_DIR, LM_SCORES), ("quality_classifier", CLASSIFIER_DIR, CLASSIFIER_SCORES)):
        section = getattr(cfg, name)
        if section.enabled:
            folder = model_folder(section.model, run_dir, default)
            files |= set(model_files(folder, scores))
            update[name] = section.model_copy(update={"model": str(folder)})
    return files, cfg.model_copy(update=update)


def check_quality_models(cfg: CurateConfig) -> None:
    """Build each enabled quality filter once, so a corrupt or foreign model stops curate before
    any work; then drop the loaded models (each worker loads its own)."""
    if cfg.perplexity.enabled:
        PerplexityFilter(cfg.perplexity, Path(str(cfg.perplexity.model)))
    if cfg.quality_classifier.enabled:
        ClassifierFilter(cfg.quality_classifier, Path(str(cfg.quality_classifier.model)))
    release_models()


def decontamination_sets(cfg: CurateConfig) -> set[Path]:
    """The evaluation set files decontamination reads (none when it is off); each must exist."""
    if not (cfg.decontaminate.enabled and cfg.decontaminate.eval_sets):
        return set()
    paths = {Path(es.path) for es in cfg.decontaminate.eval_sets}
    for path in sorted(paths):
        if not path.is_file():
            raise FatalError(f"curate.decontaminate: evaluation set {path} does not exist; fix the path given to --decontaminate (or curate.decontaminate.eval_sets)")
    return paths


def build_contamination_index(cfg: CurateConfig, folder: Path) -> dict[str, Any]:
    """The decontamination index, built once per run (a resumed run reuses it); returns its summary."""
    done = folder / "index.json"  # written last by build_index
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    summary = build_index(cfg.decontaminate, folder)
    for found in summary["sets"]:
        if found["items_too_short"]:
            log.warning("curate: decontaminate: %s of %s items of evaluation set %s have no text of %d words and cannot be checked (e.g. items %s)",
                        f"{found['items_too_short']:,}", f"{found['items']:,}", found["name"], cfg.decontaminate.ngram, ", ".join(map(str, found["too_short_sample"][:5])))
    return summary


def key_ranges(docs: int, budget_bytes: float = 256e6) -> int:
    """Bucket-key ranges per band: a power of two keeping one bucket task's rows (16 bytes a
    document, about 4 copies while sorting and pairing) within `budget_bytes`. Sized by data, not
    by task count, so a run of many small files does not open every sign file thousands of times."""
    need = max(1, math.ceil(docs * 16 * 4 / budget_bytes))
    return 1 << (need - 1).bit_length()


def near_dedup(cfg: CurateConfig, filtered: dict[int, dict[str, Any]], tasks: int, partitions: int, phase: Callable[..., dict[int, dict[str, Any]]],
               jobs: Callable[..., list[Job]], raw_bytes: Callable[[Job], int]) -> dict[str, Any]:
    """The four MinHash phases; returns their counts. Logs the memory estimate before they start."""
    near = cfg.minhash_dedup
    docs = sum(r["kept"] for r in filtered.values())
    subs = key_ranges(docs)
    estimate = memory_estimate(docs, tasks, near.bands * subs, partitions, near)
    log.info("curate: near-dedup of up to %s documents, %d bands x %d rows; estimated peak memory per process: %s",
             f"{docs:,}", near.bands, near.rows, ", ".join(f"{k} {v:,.0f} MB" for k, v in estimate.items()))
    signed = phase("sign", jobs("sign"), raw_bytes, "B")
    buckets = phase("buckets", jobs("buckets", near.bands * subs, subs))
    verified = phase("verify", jobs("verify", partitions))
    clustered = phase("components", jobs("components", 1))[0]
    return {
        "signed": sum(r["signed"] for r in signed.values()), "no_words": sum(r["no_words"] for r in signed.values()),
        "shingles": sum(r["shingles"] for r in signed.values()), "bucket_pairs": sum(r["candidates"] for r in buckets.values()),
        "candidates": sum(r["candidates"] for r in verified.values()), "verified": sum(r["verified"] for r in verified.values()),
        "rejected": sum(r["rejected"] for r in verified.values()),
        "max_rejected_jaccard": max((r["max_rejected_jaccard"] for r in verified.values() if r["max_rejected_jaccard"] is not None), default=None),
        **{k: clustered[k] for k in ("clusters", "clustered_docs", "largest_cluster")},
        "memory_estimate_mb": {k: round(v, 1) for k, v in estimate.items()},
    }
