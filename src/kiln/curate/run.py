"""The curate stage's driver: plan the read tasks, run the nine phases in order, check the accounting.

`run(cfg, run_dir)` decides whether the stage is up to date (its inputs: the input files, the
evaluation sets, the quality models), builds the executor, and runs each phase's tasks
(kiln.curate.phases; `PhaseRunner` builds their jobs, each with the phase's own settings) whose
completion marker is missing, so an interrupted run, re-run with the same config and inputs, skips
finished tasks. Between phases it does the small global steps
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm import tqdm

from kiln.core.atomic import save_npy
from kiln.core.docshards import SUFFIX, read_shard
from kiln.core.errors import FatalError
from kiln.core.executors import Executor, build_executor
from kiln.core.layout import CURATE, SHARDS, SUMMARY
from kiln.core.manifest import Stage
from kiln.core.mirror import place, pull, push_files
from kiln.core.storage import as_location, brief_traffic, is_file, is_url, merge_task_traffic, traffic_since
from kiln.core.store_lock import fenced
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.forms import DEDUP_KEY_VERSION
from kiln.curate.dedup.minhash import memory_estimate
from kiln.curate.dedup.ngram_index import build_index
from kiln.curate.jobs import Job, Phase, WorkDir, finished, run_job
from kiln.curate.languages import used
from kiln.curate.phases import (
    BUCKETS,
    COMPONENTS,
    DEDUP,
    FILTER,
    LEDGER_FILES,
    LINES,
    MB,
    PHASES,
    READ,
    SIGN,
    VERIFY,
    WRITE,
    BucketSettings,
    FilterSettings,
    LinesSettings,
    ReadSettings,
    SignSettings,
    VerifySettings,
    WriteSettings,
    duplicate_ids,
    save_renames,
)
from kiln.curate.quality.config import CLASSIFIER_DIR, LABELS_DIR, LM_DIR
from kiln.curate.readers import ReadTask, plan_reads, task_paths
from kiln.curate.report import (
    account,
    format_pii,
    format_summary,
    totals,
    write_audit,
    write_decontamination,
    write_pii_examples,
)
from kiln.curate.steps.bad_words import BadWords
from kiln.curate.steps.chain import funnel_rows
from kiln.curate.steps.decontaminate import format_report
from kiln.curate.steps.labels import LabelFilters
from kiln.curate.steps.quality import (
    CLASSIFIER_SCORES,
    LM_SCORES,
    ClassifierFilter,
    PerplexityFilter,
    load_label_model,
    model_files,
    model_folder,
    release_models,
)
from kiln.curate.steps.url import URLFilter
from kiln.text.languages import segmenters

log = logging.getLogger("kiln.curate")
S = TypeVar("S")
PIIExamples = dict[str, dict[str, list[dict[str, str]]]]  # per source and kind (kiln.curate.report.write_pii_examples)


def partition_count(tasks: int) -> int:
    """Hash partitions for the global phases: a power of two near a quarter of the task count, at most 256."""
    target = max(1, min(256, tasks // 4))
    return 1 << (target.bit_length() - 1)


def run_phase(
    executor: Executor, jobs: list[Job[Any]], desc: str, weight: Callable[[Job[Any]], int], unit: str
) -> dict[int, dict[str, Any]]:
    """Run the jobs whose marker is missing, with a progress bar (`weight` of each job, in `unit`); return every job's
    marker content by index."""
    for job in jobs[:1]:
        job.folder.mkdir(parents=True, exist_ok=True)
    results = finished(jobs)
    todo = [job for job in jobs if job.index not in results]
    if jobs and len(todo) < len(jobs):
        log.info(
            "curate: %s phase: %d of %d tasks already finished, skipped",
            jobs[0].phase.name,
            len(jobs) - len(todo),
            len(jobs),
        )
    by_index = {job.index: job for job in jobs}
    started, docs, traffic = time.perf_counter(), 0, traffic_since()
    with tqdm(
        total=sum(map(weight, jobs)),
        initial=sum(weight(by_index[i]) for i in results),
        desc=desc,
        unit=unit,
        unit_scale=unit == "B",
        dynamic_ncols=True,
        leave=False,
    ) as bar:
        for index, summary in executor.imap_unordered(fenced(run_job), todo):
            merge_task_traffic(summary.pop("traffic", None))
            results[index] = summary
            docs += summary.get("docs", 0)
            bar.update(weight(by_index[index]))
            rate = f"{docs / max(time.perf_counter() - started, 1e-9):,.0f} docs/s"
            bar.set_postfix_str(", ".join(filter(None, (rate, brief_traffic(traffic)))), refresh=False)
    return results


@dataclass
class PhaseRunner:
    """Runs the phases' jobs on one executor: one job per read task, or per partition; keeps each
    phase's time and peak memory (the manifest's `phases`)."""

    executor: Executor
    tasks: list[ReadTask]
    work: WorkDir
    timings: dict[str, dict[str, float]] = field(default_factory=dict)

    def per_task(self, phase: Phase[S], settings: S) -> dict[int, dict[str, Any]]:
        """One job per read task, the progress counted in raw input bytes."""
        jobs = [Job(phase, t.index, self.work, settings, t) for t in self.tasks]
        return self._run(phase, jobs, lambda job: job.task.size if job.task else 0, "B")

    def per_partition(self, phase: Phase[S], settings: S, count: int) -> dict[int, dict[str, Any]]:
        """One job per partition 0..count-1."""
        return self._run(phase, [Job(phase, p, self.work, settings) for p in range(count)], lambda job: 1, "task")

    def _run(
        self, phase: Phase[S], jobs: list[Job[S]], weight: Callable[[Job[Any]], int], unit: str
    ) -> dict[int, dict[str, Any]]:
        started = time.perf_counter()
        results = run_phase(
            self.executor, jobs, f"curate {PHASES.index(phase) + 1}/{len(PHASES)} {phase.name}", weight, unit
        )
        peak = max((r.get("rss_mb", 0) for r in results.values()), default=0)
        self.timings[phase.name] = {"seconds": round(time.perf_counter() - started, 3), "max_rss_mb": round(peak, 1)}
        return results


def run(cfg: CurateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    """Curate `cfg.inputs` into `run_dir/curate/`; returns the stage's manifest (as it was, when up to date)."""
    tasks = plan_reads(
        cfg.inputs, None if cfg.max_total_mb is None else int(cfg.max_total_mb * MB), int(cfg.shard_mb * MB)
    )
    if not tasks:
        raise FatalError(
            "curate: no input documents found; check the --input paths or curate.inputs (paths and globs) in the recipe"
        )
    refuse_own_outputs(tasks, run_dir / CURATE)
    inputs = {
        p for t in tasks for p in task_paths(t) if is_url(p) or os.access(p, os.R_OK)
    }  # an unreadable file is quarantined by its task
    eval_sets = decontamination_sets(cfg)
    inputs |= eval_sets  # a changed evaluation set redoes the stage
    models, cfg_for_tasks = quality_models(cfg, run_dir)
    inputs |= models  # so does a retrained quality model
    lists = block_lists(cfg)  # and a changed block or word list; a list that is not text stops the run here
    inputs |= {Path(found["path"]) for found in lists}
    stage = Stage(run_dir, CURATE, {"curate": cfg}, inputs=inputs)
    if done := stage.up_to_date(force, lambda m: f"{m['counts']['docs_out']} docs kept"):
        return done
    check_quality_models(cfg_for_tasks)
    # Before the lock and the partial folder: joining a Ray cluster may fail (address, token) or wait for CPUs.
    executor = build_executor(cfg.executor, "curate.executor", str(stage.final_dir))
    try:
        stage.begin(resume=not force)
        (stage.dir / SHARDS).mkdir(exist_ok=True)
        # Tasks may run on other machines (ray): no path relative to this process's cwd, and for a run on a store,
        # the folder's place in the mirror, which each machine resolves to its own.
        work = WorkDir(stage.dir.resolve(), place(stage.dir))
        partitions = partition_count(len(tasks))
        log.info(
            "curate: %d read tasks (%.1f MB) from %d inputs, %d partitions, %s executor with %d workers",
            len(tasks),
            sum(t.size for t in tasks) / MB,
            len(cfg.inputs),
            partitions,
            cfg.executor.kind,
            executor.workers,
        )
        runner = PhaseRunner(executor, tasks, work)
        # First: a malformed evaluation set stops the run before any document is read.
        contamination_index = build_contamination_index(cfg, work.decontamination_index) if eval_sets else None
        results, near = run_phases(cfg_for_tasks, runner, partitions)
    finally:
        executor.close()

    ledger = account(cfg, tasks, results)  # the accounting check: raises when a document is lost
    # A run on a store: the tasks' ledgers, wherever they ran, into this machine's mirror.
    pull(work.root, [f"*/?????{suffix}" for suffix in LEDGER_FILES] + ["write/*.clusters.parquet"])
    outputs, report, examples = write_reports(cfg, ledger, tasks, results, contamination_index, stage.dir)
    shutil.rmtree(work.root)
    counts = {**totals(ledger), **({"minhash": near} if near else {})}
    # The shards as the write tasks recorded them: a task on another machine kept its shards on the store only.
    known = {f"{SHARDS}/{name}": r for written in results[-1].values() for name, r in written["shard_records"].items()}
    shards = [stage.dir / name for name in sorted(known)]
    segmented = segmenters()  # what split the words of languages written without spaces, with versions
    by_character = [code for code, what in segmented.items() if what == "characters"]
    summary = summarize(cfg, counts, examples, report, stage).rstrip() + (
        f"\nwords: {', '.join(f'{c} {w}' for c, w in segmented.items() if w != 'characters')}; "
        f"one word per character: {', '.join(by_character) or 'none'}\n"
    )
    # phase timings vary from run to run: beside the counts, never in them
    languages = used(counts["stats"], cfg.languages, cfg.language_defaults)
    if languages:
        summary += "settings of their own: " + ", ".join(f"{c}={v['documents']:,}" for c, v in languages.items()) + "\n"
    extra = {
        "phases": runner.timings,
        "word_segmenters": segmented,
        "dedup_keys": DEDUP_KEY_VERSION,
        "languages": languages,
        "lists": lists,
    }
    return stage.finish(shards + outputs, counts, summary, extra=extra, known=known)


def run_phases(
    cfg: CurateConfig, runner: PhaseRunner, partitions: int
) -> tuple[list[dict[int, dict[str, Any]]], dict[str, Any]]:
    """The phases in order, those of a step turned off left out, and the small global steps between them.
    Returns the results of the phases that keep a ledger (read, filter, write) and the near-dedup counts."""
    work, tasks = runner.work, len(runner.tasks)
    read = runner.per_task(READ, ReadSettings.of(cfg))
    settle_duplicate_ids(cfg, work, tasks)
    pull(work.root, ["lines/boilerplate.npy"])  # a run on a store: made by an earlier attempt
    if cfg.line_dedup.enabled and not work.boilerplate.is_file():
        runner.per_partition(LINES, LinesSettings(partitions, cfg.line_dedup.max_docs), partitions)
        pull(work.root, ["lines/?????.npy"])
        save_npy(work.boilerplate, np.concatenate([np.load(work.file("lines", p, ".npy")) for p in range(partitions)]))
        push_files(work.stage_dir, [work.boilerplate])
    elif cfg.line_dedup.enabled:  # said as run_phase says it of the phases it skips task by task
        log.info("curate: lines phase: finished earlier (%s kept), skipped", work.boilerplate.name)
    filtered = runner.per_task(FILTER, FilterSettings.of(cfg, partitions))
    if cfg.exact_dedup.enabled:
        runner.per_partition(DEDUP, None, partitions)
    near = near_dedup(cfg, filtered, runner, partitions) if cfg.minhash_dedup.enabled else {}
    written = runner.per_task(WRITE, WriteSettings(cfg.exact_dedup.enabled, cfg.minhash_dedup, cfg.sample_size))
    return [read, filtered, written], near


def write_reports(
    cfg: CurateConfig,
    ledger: Ledger,
    tasks: list[ReadTask],
    results: list[dict[int, dict[str, Any]]],
    contamination_index: dict[str, Any] | None,
    stage_dir: Path,
) -> tuple[list[Path], dict[str, Any] | None, PIIExamples]:
    """The audit (kiln.curate.report.write_audit), the decontamination report, the PII examples and the renamed
    duplicate ids; returns the files, the decontamination report and the PII examples (for the summary)."""
    outputs, records = write_audit(ledger, stage_dir, results, tasks)
    report = None
    if contamination_index is not None:
        report, report_path = write_decontamination(contamination_index, records.get("contamination", []), stage_dir)
        outputs.append(report_path)
    examples, examples_path = write_pii_examples(records.get("pii_example", []), stage_dir)
    outputs.append(examples_path)
    duplicates_path = stage_dir / "audit" / "duplicate_ids.json"
    duplicates = records.get("duplicate_id", [])[: max(cfg.sample_size, 1)]
    duplicates_path.write_text(json.dumps(duplicates, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    outputs.append(duplicates_path)
    return outputs, report, examples


def summarize(
    cfg: CurateConfig, counts: dict[str, Any], examples: PIIExamples, report: dict[str, Any] | None, stage: Stage
) -> str:
    """summary.txt: the funnel per source, the PII redactions, the decontamination report; warns of an empty
    result and of settings for a source no input produced."""
    if counts["docs_out"] == 0:
        log.warning(
            "curate: no document was kept (%d in); see %s and %s",
            counts["docs_in"],
            stage.final_dir / SUMMARY,
            stage.final_dir / "quarantine.jsonl",
        )
    pii = format_pii(counts, examples)
    for source in sorted(set(cfg.sources) - set(counts["per_source"])):
        log.warning(
            "curate: curate.sources.%s sets steps for a source no input produced (sources: %s)",
            source,
            ", ".join(counts["per_source"]) or "none",
        )
    return (
        format_summary(counts, funnel_rows(cfg), cfg)
        + ("\n" + pii if pii else "")
        + ("\n" + format_report(report) if report is not None else "")
    )


# --- the stage's inputs and global steps between phases -------------------------------------------


def settle_duplicate_ids(cfg: CurateConfig, work: WorkDir, tasks: int) -> None:
    """Find ids that several documents share (across every read task); rename the later holders
    in the filter phase (curate.duplicate_ids: rename) or stop naming the first (refuse)."""
    pull(work.root, ["read/*.ids.npy"])
    found = duplicate_ids(work, tasks)
    if found and cfg.duplicate_ids == "refuse":
        task, positions = min(found.items())
        position = min(positions)
        doc = next(d for i, d in enumerate(read_shard(work.file("read", task, SUFFIX))) if i == position)
        total = sum(len(p) for p in found.values())
        raise FatalError(
            f"curate: {total} input document(s) repeat an id another document has, the first {doc.id!r} (source "
            f"{doc.source}); "
            "give every record its own id, or set curate.duplicate_ids=rename to have later ones renamed <id>#<n>"
        )
    if found:
        log.warning(
            "curate: %d document(s) repeat an id another document has; renamed <id>#<n> (audit/duplicate_ids.json)",
            sum(len(p) for p in found.values()),
        )
    save_renames(work, found, tasks)
    push_files(work.stage_dir, sorted(work.phase("read").glob("*.renames.json")))


def refuse_own_outputs(tasks: list[ReadTask], stage_dir: Path) -> None:
    """Stop when an input file lies in this run's curate stage (its shards, its audit files, or a
    folder above them named as input): the stage replaces those files while it would read them."""
    own = (stage_dir.resolve(), stage_dir.resolve().with_name(stage_dir.name + ".partial"))  # finished, or being built
    for task in tasks:
        for path in task_paths(task):
            if not is_url(path) and any(Path(path).resolve().is_relative_to(folder) for folder in own):
                raise FatalError(
                    f"curate: input file {path} is inside this run's own curate stage ({stage_dir}), which the "
                    "stage rewrites; "
                    "curate another run's shards by naming them in a new run (--run NAME), or copy them out first"
                )


def quality_models(cfg: CurateConfig, run_dir: Path) -> tuple[set[Path], CurateConfig]:
    """The model files the enabled quality filters read (stage inputs), and the config the tasks
    get: each such filter's `model` made an absolute folder, so a worker anywhere finds it."""
    files: set[Path] = set()
    update: dict[str, Any] = {}
    for name, default, scores in (
        ("perplexity", LM_DIR, LM_SCORES),
        ("quality_classifier", CLASSIFIER_DIR, CLASSIFIER_SCORES),
    ):
        section = getattr(cfg, name)
        if section.enabled:
            folder = model_folder(section.model, run_dir, default)
            files |= set(model_files(folder, scores))
            update[name] = section.model_copy(update={"model": str(folder)})
    if cfg.classifiers.enabled and cfg.classifiers.models:
        models = {}
        for name, own in cfg.classifiers.models.items():
            folder = model_folder(own.model, run_dir, f"{LABELS_DIR}/{name}")
            files |= set(load_label_model(folder).files(folder))  # a missing or foreign model stops curate here
            models[name] = own.model_copy(update={"model": str(folder)})
        update["classifiers"] = cfg.classifiers.model_copy(update={"models": models})
    return files, cfg.model_copy(update=update)


def block_lists(cfg: CurateConfig) -> list[dict[str, Any]]:
    """Every list the URL and bad-words steps read, for any source: name, version, file, sha256, entries
    (the manifest's `lists`). Building the steps reads each list, so a bad one stops curate before any work."""
    configs = [cfg, *(cfg.for_source(s) for s in cfg.sources)]
    found: dict[str, dict[str, Any]] = {}
    for c in configs:
        steps = [
            *([URLFilter(c.url_filter)] if c.url_filter.enabled else []),
            *([BadWords(c.bad_words)] if c.bad_words.enabled else []),
        ]
        for step in steps:
            for listed in step.lists:
                found.setdefault(listed["path"], listed)
    return [found[path] for path in sorted(found)]


def check_quality_models(cfg: CurateConfig) -> None:
    """Build each enabled quality filter once, so a corrupt or foreign model stops curate before
    any work; then drop the loaded models (each worker loads its own)."""
    if cfg.perplexity.enabled:
        PerplexityFilter(cfg.perplexity, Path(str(cfg.perplexity.model)))
    if cfg.quality_classifier.enabled:
        ClassifierFilter(cfg.quality_classifier, Path(str(cfg.quality_classifier.model)))
    if cfg.classifiers.enabled and cfg.classifiers.models:
        LabelFilters(cfg.classifiers)  # a threshold of a label the model lacks stops curate here
    release_models()


def decontamination_sets(cfg: CurateConfig) -> set[Path | str]:
    """The evaluation set files decontamination reads (none when it is off); each must exist (a file, or a
    store's object)."""
    if not (cfg.decontaminate.enabled and cfg.decontaminate.eval_sets):
        return set()
    paths = {as_location(es.path) for es in cfg.decontaminate.eval_sets}
    for path in sorted(paths, key=str):
        if not is_file(path):
            raise FatalError(
                f"curate.decontaminate: evaluation set {path} does not exist; fix the path given to "
                "--decontaminate (or curate.decontaminate.eval_sets)"
            )
    return paths


def build_contamination_index(cfg: CurateConfig, folder: Path) -> dict[str, Any]:
    """The decontamination index, built once per run (a resumed run reuses it); returns its summary."""
    done = folder / "index.json"  # written last by build_index
    pull(folder, ["*"])  # a run on a store: built by an earlier attempt
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    summary = build_index(cfg.decontaminate, folder)
    push_files(folder, sorted(p for p in folder.rglob("*") if p.is_file() and p != done) + [done])
    for found in summary["sets"]:
        if found["items_too_short"]:
            log.warning(
                (
                    "curate: decontaminate: %s of %s items of evaluation set %s have no text of %d words and cannot "
                    "be checked (e.g. items %s)"
                ),
                f"{found['items_too_short']:,}",
                f"{found['items']:,}",
                found["name"],
                cfg.decontaminate.ngram,
                ", ".join(map(str, found["too_short_sample"][:5])),
            )
    return summary


def key_ranges(docs: int, budget_bytes: float = 256e6) -> int:
    """Bucket-key ranges per band: a power of two keeping one bucket task's rows (16 bytes a
    document, about 4 copies while sorting and pairing) within `budget_bytes`. Sized by data, not
    by task count, so a run of many small files does not open every sign file thousands of times."""
    need = max(1, math.ceil(docs * 16 * 4 / budget_bytes))
    return 1 << (need - 1).bit_length()


def near_dedup(
    cfg: CurateConfig, filtered: dict[int, dict[str, Any]], runner: PhaseRunner, partitions: int
) -> dict[str, Any]:
    """The four MinHash phases; returns their counts. Logs the memory estimate before they start."""
    near, tasks = cfg.minhash_dedup, len(runner.tasks)
    docs = sum(r["kept"] for r in filtered.values())
    subs = key_ranges(docs)
    estimate = memory_estimate(docs, tasks, near.bands * subs, partitions, near)
    log.info(
        "curate: near-dedup of up to %s documents, %d bands x %d rows; estimated peak memory per process: %s",
        f"{docs:,}",
        near.bands,
        near.rows,
        ", ".join(f"{k} {v:,.0f} MB" for k, v in estimate.items()),
    )
    signed = runner.per_task(SIGN, SignSettings(cfg.exact_dedup.enabled, near, cfg.near_priority))
    buckets = runner.per_partition(BUCKETS, BucketSettings(subs, near), near.bands * subs)
    verified = runner.per_partition(VERIFY, VerifySettings(partitions, tasks, near), partitions)
    clustered = runner.per_partition(COMPONENTS, None, 1)[0]
    return {
        "signed": sum(r["signed"] for r in signed.values()),
        "no_words": sum(r["no_words"] for r in signed.values()),
        "shingles": sum(r["shingles"] for r in signed.values()),
        "bucket_pairs": sum(r["candidates"] for r in buckets.values()),
        "candidates": sum(r["candidates"] for r in verified.values()),
        "verified": sum(r["verified"] for r in verified.values()),
        "rejected": sum(r["rejected"] for r in verified.values()),
        "max_rejected_jaccard": max(
            (r["max_rejected_jaccard"] for r in verified.values() if r["max_rejected_jaccard"] is not None),
            default=None,
        ),
        **{k: clustered[k] for k in ("clusters", "clustered_docs", "largest_cluster")},
        "memory_estimate_mb": {k: round(v, 1) for k, v in estimate.items()},
    }
