"""The curate stage: nine map phases over shard tasks, with files between them.

1. read (one task per read task): read and extract, normalize, URL filter; write the task's
   documents to `work/read/`, and count the distinct normalized lines of each prose document.
2. lines (one task per hash partition): sum line counts over all tasks; the lines found in more
   than `line_dedup.max_docs` documents of a source are boilerplate.
3. filter (one task per read task): cut boilerplate lines, language ID, the prose rules (or the
   code rules), PII, length, decontamination; write survivors to `work/filter/` and their text
   hashes by partition.
4. dedup (one task per hash partition): choose, among equal texts, the one to keep.
5-8. sign, buckets, verify, components: MinHash near-dedup of the exact-dedup survivors
   (kiln.curate.dedup.near).
9. write (one task per read task): drop the exact and near duplicates, write
   `shards/<source>-<task>.jsonl.zst` and the task's rows of `clusters.parquet`.
Every task writes its outputs atomically and then a completion marker holding its ledger; an
interrupted run, re-run with the same config and inputs, skips finished tasks. Shard contents
depend only on the inputs and the config, never on the executor or the number of workers.
The run ends with the accounting check (input = kept + removed + quarantined, per task and per
source), the audit (`removed.parquet`, `quarantine.jsonl`, `clusters.parquet`, `audit/`) and the
funnel per source. The manifest's `phases` give each phase's time and peak memory per process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import shutil
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from kiln.core.atomic import save_npy, write_atomically
from kiln.core.docshards import SUFFIX, ShardWriter, read_shard, read_shard_lines
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.core.executors import Executor, build_executor
from kiln.core.layout import CURATE, SHARDS
from kiln.core.manifest import Stage
from kiln.curate.audit import Ledger, SourceTally
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.exact import HashTable, dedup_partition, removals_for_task
from kiln.curate.dedup.minhash import memory_estimate
from kiln.curate.dedup.near import Sets, assignments_for_task, bucket_task, components_task, sign_task, verify_task
from kiln.curate.quality.config import CLASSIFIER_DIR, LM_DIR
from kiln.curate.readers import ReadLimits, ReadTask, plan_reads, read_task, task_paths
from kiln.curate.steps.base import Step
from kiln.curate.steps.decontaminate import build_index, build_report, format_report
from kiln.curate.steps.lines import LineCounts, document_line_keys
from kiln.curate.steps.pipeline import BRANCHES, code_steps, early_steps, funnel_rows, groups, prose_steps, run_document, run_documents
from kiln.curate.steps.quality import CLASSIFIER_SCORES, LM_SCORES, ClassifierFilter, PerplexityFilter, model_files, model_folder, release_models
from kiln.text.code import doc_is_code

log = logging.getLogger("kiln.curate")
MB = 1_000_000
PHASES = ("read", "lines", "filter", "dedup", "sign", "buckets", "verify", "components", "write")
CHAINED = "; below the threshold to the kept copy: joined its cluster through other members"
MAX_OPEN_SHARDS = 64  # shard writers one write task keeps open at once
CLUSTERS_SCHEMA = pa.schema([("id", pa.string()), ("cluster", pa.int64()), ("kept", pa.bool_()), ("jaccard_to_kept", pa.float64())])
REMOVED_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("step", pa.string()), ("reason", pa.string()),
    ("value", pa.float64()), ("threshold", pa.float64()), ("note", pa.string()), ("kept_id", pa.string()),
])


@dataclass(frozen=True)
class Job:
    """One task of one phase. `index` is the read task's index, or the partition's."""

    phase: str
    index: int
    stage_dir: Path
    cfg: CurateConfig
    partitions: int
    task: ReadTask | None = None
    tasks: int = 0  # read tasks in the run (their indices are 0..tasks-1)

    @property
    def folder(self) -> Path:
        return self.stage_dir / "work" / self.phase

    @property
    def marker(self) -> Path:
        return self.folder / f"{self.index:05d}.done"

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the completion marker (after every other output of the task) and return its content,
        with the process's peak resident memory so far (the phase's memory figure)."""
        summary = {**summary, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        write_atomically(self.marker, lambda p: p.write_text(json.dumps(summary, ensure_ascii=False), encoding="utf-8"))
        return summary


def partition_count(tasks: int) -> int:
    """Hash partitions for the global phases: a power of two near a quarter of the task count, at most 256."""
    target = max(1, min(256, tasks // 4))
    return 1 << (target.bit_length() - 1)


# --- ledgers in completion markers ---------------------------------------------------------------


def save_ledger(job: Job, ledger: Ledger, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the ledger's removed and quarantined rows beside the marker, then the marker itself (last)."""
    base = job.folder / f"{job.index:05d}"
    write_atomically(base.with_suffix(".removed.parquet"), lambda p: pq.write_table(pa.Table.from_pylist(ledger.removed, schema=REMOVED_SCHEMA), p))
    write_atomically(base.with_suffix(".quarantine.jsonl"), lambda p: p.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in ledger.quarantined), encoding="utf-8"))
    records = "".join(json.dumps({"kind": kind, "row": row}, ensure_ascii=False) + "\n" for kind, rows in sorted(ledger.records.items()) for row in rows)
    write_atomically(base.with_suffix(".records.jsonl"), lambda p: p.write_text(records, encoding="utf-8"))
    summary = {
        "sources": {s: t.to_json() for s, t in ledger.sources.items()},
        "samples": {f"{s}\x00{r}": ledger.sample(s, r) for s, r in ledger.samples},
        **(extra or {}),
    }
    return job.finish(summary)


def load_ledger(summary: dict[str, Any], sample_size: int) -> Ledger:
    """Counts and samples of a marker (rows stay in their files; the audit streams them)."""
    ledger = Ledger(sample_size)
    ledger.sources = {s: SourceTally.from_json(t) for s, t in summary["sources"].items()}
    for key, entries in summary["samples"].items():
        source, reason = key.split("\x00")
        for entry in entries:
            ledger.offer_sample(source, reason, entry)
    return ledger


# --- the phases ---------------------------------------------------------------------------------


def read_phase(job: Job) -> dict[str, Any]:
    assert job.task is not None
    cfg, task = job.cfg, job.task
    ledger, steps = Ledger(cfg.sample_size), early_steps(cfg)
    limits = ReadLimits(max_doc_bytes=int(cfg.max_doc_mb * MB), extract_timeout_s=cfg.extract_timeout_s)
    lines = LineCounts()
    docs = 0
    with ShardWriter(job.folder / f"{job.index:05d}{SUFFIX}", level=1) as writer:
        for doc in read_task(task, limits, ledger):
            ledger.seen(doc.source, len(doc.text.encode("utf-8", "surrogatepass")))
            ledger.passed("read", doc)
            docs += 1
            out = run_document(doc, steps, ledger)
            if out is None:
                continue
            writer.write(out)
            if cfg.line_dedup.enabled and not doc_is_code(out, task.input.code):
                lines.add(document_line_keys(out))
    keys, counts = lines.result()
    save_npy(job.folder / f"{job.index:05d}.keys.npy", keys)
    save_npy(job.folder / f"{job.index:05d}.counts.npy", counts)
    return save_ledger(job, ledger, {"docs": docs})


def lines_phase(job: Job) -> dict[str, Any]:
    """Sum one key range of every read task's line counts; keep the keys over the threshold."""
    bits = job.partitions.bit_length() - 1
    lo = np.uint64(job.index << (64 - bits)) if bits else np.uint64(0)
    parts_keys, parts_counts = [], []
    for keys_path in sorted((job.stage_dir / "work" / "read").glob("*.keys.npy")):
        keys = np.load(keys_path, mmap_mode="r")
        counts = np.load(keys_path.with_name(keys_path.name.replace(".keys.", ".counts.")), mmap_mode="r")
        start = np.searchsorted(keys, lo) if bits else 0
        stop = np.searchsorted(keys, np.uint64((job.index + 1) << (64 - bits))) if bits and job.index + 1 < job.partitions else len(keys)
        parts_keys.append(np.asarray(keys[start:stop]))
        parts_counts.append(np.asarray(counts[start:stop]))
    keys = np.concatenate(parts_keys) if parts_keys else np.zeros(0, np.uint64)
    counts = np.concatenate(parts_counts) if parts_counts else np.zeros(0, np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    totals = np.bincount(inverse.ravel(), weights=counts, minlength=len(unique)) if len(unique) else np.zeros(0)
    boilerplate = unique[totals > job.cfg.line_dedup.max_docs]
    save_npy(job.folder / f"{job.index:05d}.npy", boilerplate)
    return job.finish({"boilerplate_lines": int(len(boilerplate))})


def filter_phase(job: Job) -> dict[str, Any]:
    assert job.task is not None
    cfg = job.cfg
    ledger = Ledger(cfg.sample_size)
    boilerplate = np.load(job.stage_dir / "work" / "lines" / "boilerplate.npy") if cfg.line_dedup.enabled else np.zeros(0, np.uint64)
    index = job.stage_dir / "work" / "decontaminate"
    prose, code = prose_steps(cfg, boilerplate.tolist(), index), code_steps(cfg, index)
    hashes = HashTable(job.index, cfg.exact_dedup.source_priority)
    kept = seen = 0
    source, target = job.stage_dir / "work" / "read" / f"{job.index:05d}{SUFFIX}", job.folder / f"{job.index:05d}{SUFFIX}"
    # perf: with no step in either branch (a dedup-only run) no document changes here, so the read
    # phase's file is linked rather than encoded and compressed again (0.4 s of 0.8 s per 33 MB).
    unchanged = not prose and not code
    with nullcontext() if unchanged else ShardWriter(target, level=1) as writer:
        for group in groups(read_shard(source)):
            seen += len(group)
            for out in branch_outcomes(group, job.task.input.code, prose, code, ledger):
                if out is None:
                    continue
                if cfg.exact_dedup.enabled:
                    hashes.add(kept, out.id, out.source, out.text)
                if writer is not None:
                    writer.write(out)
                kept += 1
    if unchanged:
        link = target.with_name(target.name + ".link")
        link.unlink(missing_ok=True)
        os.link(source, link)
        os.replace(link, target)
    if cfg.exact_dedup.enabled:
        hashes.write(job.folder, job.partitions)
    return save_ledger(job, ledger, {"docs": seen, "kept": kept})


def branch_outcomes(group: list[Document], marked: bool | None, prose: list[Step], code: list[Step], ledger: Ledger) -> list[Document | None]:
    """Each document of `group` after its branch's steps (None: removed or quarantined), in order.
    The ledger rows the group adds (removals, quarantines, step records) are put in read order,
    as running each document through its steps in turn writes them."""
    starts = len(ledger.removed), len(ledger.quarantined), {kind: len(rows) for kind, rows in ledger.records.items()}
    is_code = [doc_is_code(doc, marked) for doc in group]
    outcomes: list[Document | None] = [None] * len(group)
    for branch, steps in (("prose", prose), ("code", code)):
        members = [i for i, c in enumerate(is_code) if c == (branch == "code")]
        for i, out in zip(members, run_documents([group[i] for i in members], steps, ledger, branch)):
            outcomes[i] = out
    first: dict[str, int] = {}
    for i, doc in enumerate(group):
        first.setdefault(doc.id, i)

    def in_read_order(rows: list[dict[str, Any]], start: int) -> None:
        rows[start:] = sorted(rows[start:], key=lambda row: first.get(row["id"], len(group)))  # stable: one document's rows keep step order

    in_read_order(ledger.removed, starts[0])
    in_read_order(ledger.quarantined, starts[1])
    for kind, rows in ledger.records.items():
        in_read_order(rows, starts[2].get(kind, 0))
    return outcomes


def dedup_phase(job: Job) -> dict[str, Any]:
    removed = dedup_partition(job.stage_dir / "work" / "filter", job.index, job.folder / f"{job.index:05d}.parquet")
    return job.finish({"duplicates": removed})


def exact_removals(job: Job) -> dict[int, str]:
    return removals_for_task(job.stage_dir / "work" / "dedup", job.index) if job.cfg.exact_dedup.enabled else {}


def sign_phase(job: Job) -> dict[str, Any]:
    filtered = job.stage_dir / "work" / "filter" / f"{job.index:05d}{SUFFIX}"
    return job.finish(sign_task(filtered, job.folder, job.index, exact_removals(job), job.cfg.minhash_dedup, job.cfg.near_priority))


def bucket_phase(job: Job) -> dict[str, Any]:
    band, sub = divmod(job.index, job.partitions)
    work = job.stage_dir / "work"
    return job.finish(bucket_task(work / "sign", job.folder / f"{job.index:05d}.npy", band, sub, job.partitions, job.cfg.minhash_dedup))


def verify_phase(job: Job) -> dict[str, Any]:
    work = job.stage_dir / "work"
    return job.finish(verify_task(work / "buckets", work / "sign", job.folder / f"{job.index:05d}.parquet", job.index, job.partitions, job.tasks, job.cfg.minhash_dedup))


def components_phase(job: Job) -> dict[str, Any]:
    work = job.stage_dir / "work"
    return job.finish(components_task(work / "verify", work / "sign", job.folder / "assign.parquet"))


def write_phase(job: Job) -> dict[str, Any]:
    """Drop the task's exact and near duplicates and write one shard per source. A task whose
    documents carry more than MAX_OPEN_SHARDS sources is written in several passes over its
    filtered file, so the number of open files stays bounded."""
    cfg = job.cfg
    ledger = Ledger(cfg.sample_size)
    removals = exact_removals(job)
    near = cfg.minhash_dedup
    assigned = assignments_for_task(job.stage_dir / "work" / "components" / "assign.parquet", job.index) if near.enabled else {}
    sets = Sets(job.stage_dir / "work" / "sign", near)
    clusters: dict[str, list[Any]] = {name: [] for name in CLUSTERS_SCHEMA.names}
    filtered = job.stage_dir / "work" / "filter" / f"{job.index:05d}{SUFFIX}"
    finished: set[str] = set()
    shards, docs, more = [], 0, True
    while more:
        more, batch, writers = False, set(), {}
        try:
            for ordinal, (doc, line) in enumerate(read_shard_lines(filtered)):
                if doc.source in finished:
                    continue
                if doc.source not in batch:
                    if len(batch) == MAX_OPEN_SHARDS:
                        more = True  # a later pass takes this source
                        continue
                    batch.add(doc.source)
                if ordinal in removals:
                    ledger.remove(doc, "exact_dedup", "duplicate", note=f"duplicate of {removals[ordinal]}", kept_id=removals[ordinal])
                    continue
                if cfg.exact_dedup.enabled:
                    ledger.passed("exact_dedup", doc)
                if (found := assigned.get(ordinal)) is not None:
                    similarity = 1.0 if found.kept else sets.similarity(found.doc, found.keeper)
                    for name, value in zip(CLUSTERS_SCHEMA.names, (doc.id, found.cluster, found.kept, similarity)):
                        clusters[name].append(value)
                    if not found.kept:
                        ledger.remove(doc, "minhash_dedup", "near_duplicate", similarity, near.threshold, note=f"cluster {found.cluster}" + (CHAINED if near.verify and similarity < near.threshold else ""), kept_id=found.kept_id)
                        continue
                if near.enabled:
                    ledger.passed("minhash_dedup", doc)
                if doc.source not in writers:
                    writers[doc.source] = ShardWriter(job.stage_dir / SHARDS / f"{doc.source}-{job.index:05d}{SUFFIX}")
                writers[doc.source].write_line(line)  # kept as the filter phase wrote it
                ledger.kept(doc)
        except BaseException:
            for writer in writers.values():
                writer.__exit__(RuntimeError, None, None)  # removes its temp file
            sets.close()
            raise
        for writer in writers.values():
            writer.close()
            shards.append(writer.path.name)
            docs += writer.docs
        finished |= batch
    sets.close()
    # every row of a source is written in that source's pass: sort so the file never depends on passes
    table = pa.table(clusters, schema=CLUSTERS_SCHEMA).sort_by([("cluster", "ascending"), ("id", "ascending")])
    write_atomically(job.folder / f"{job.index:05d}.clusters.parquet", lambda p: pq.write_table(table, p))
    return save_ledger(job, ledger, {"docs": docs, "shards": sorted(shards)})


PHASE_FUNCTIONS = {
    "read": read_phase, "lines": lines_phase, "filter": filter_phase, "dedup": dedup_phase, "sign": sign_phase,
    "buckets": bucket_phase, "verify": verify_phase, "components": components_phase, "write": write_phase,
}


def run_job(job: Job) -> tuple[int, dict[str, Any]]:
    return job.index, PHASE_FUNCTIONS[job.phase](job)


# --- the driver -----------------------------------------------------------------------------------


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
    tasks = plan_reads(cfg.inputs, None if cfg.max_total_mb is None else int(cfg.max_total_mb * MB), int(cfg.shard_mb * MB))
    if not tasks:
        raise FatalError("curate: no input documents found; check the --input paths or curate.inputs (paths and globs) in the recipe")
    inputs = {p for t in tasks for p in task_paths(t) if os.access(p, os.R_OK)}  # an unreadable file is quarantined by its task
    eval_sets = decontamination_sets(cfg)
    inputs |= eval_sets  # a changed evaluation set redoes the stage
    models, cfg_for_tasks = quality_models(cfg, run_dir)
    inputs |= models  # so does a retrained quality model
    stage = Stage(run_dir, CURATE, {"curate": cfg}, inputs=inputs)
    if not force and (done := stage.current_manifest()):
        log.info("curate: up to date (%s docs kept); nothing to do. Use --force to redo.", done["counts"]["docs_out"])
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
        read = phase("read", jobs("read"), raw_bytes, "B")
        boilerplate_path = stage.dir / "work" / "lines" / "boilerplate.npy"
        if cfg.line_dedup.enabled and not boilerplate_path.is_file():
            phase("lines", jobs("lines", partitions))
            parts = [np.load(stage.dir / "work" / "lines" / f"{p:05d}.npy") for p in range(partitions)]
            save_npy(boilerplate_path, np.concatenate(parts))
        contamination_index = build_contamination_index(cfg, stage.dir / "work" / "decontaminate") if eval_sets else None
        filtered = phase("filter", jobs("filter"), raw_bytes, "B")
        if cfg.exact_dedup.enabled:
            phase("dedup", jobs("dedup", partitions))
        if cfg.minhash_dedup.enabled:
            near = near_dedup(cfg, filtered, len(tasks), partitions, phase, jobs, raw_bytes)
        written = phase("write", jobs("write"), raw_bytes, "B")
    finally:
        executor.close()

    ledger = account(cfg, tasks, [read, filtered, written])
    outputs, records = write_audit(ledger, stage.dir, [read, filtered, written], tasks)
    report = None
    if contamination_index is not None:
        report = build_report(contamination_index, records.get("contamination", []))
        (stage.dir / "audit" / "decontamination.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        outputs.append(stage.dir / "audit" / "decontamination.json")
    shutil.rmtree(stage.dir / "work")
    counts = {**totals(ledger), **({"minhash": near} if near else {})}
    shards = sorted((stage.dir / SHARDS).glob("*" + SUFFIX))
    if counts["docs_out"] == 0:
        log.warning("curate: no document was kept (%d in); see %s and %s", counts["docs_in"], stage.dir / "summary.txt", stage.dir / "quarantine.jsonl")
    # phase timings vary from run to run: beside the counts, never in them
    summary = format_summary(counts, funnel_rows(cfg)) + ("\n" + format_report(report) if report is not None else "")
    return stage.finish(shards + outputs, counts, summary, extra={"phases": timings})


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


def account(cfg: CurateConfig, tasks: list[ReadTask], phases: list[dict[int, dict[str, Any]]]) -> Ledger:
    """Merge every task's ledgers, checking input = kept + removed + quarantined per task, then per source."""
    total = Ledger(cfg.sample_size)
    for task in tasks:
        ledger = Ledger(cfg.sample_size)
        for phase in phases:
            ledger.merge(load_ledger(phase[task.index], cfg.sample_size))
        ledger.check_balanced(f"shard task {task.index:05d} ({', '.join(str(p) for p in task_paths(task)[:3])}{' ...' if len(task_paths(task)) > 3 else ''})")
        total.merge(ledger)
    total.check_balanced("the whole run")
    return total


def write_audit(ledger: Ledger, stage_dir: Path, phases: list[dict[int, dict[str, Any]]], tasks: list[ReadTask]) -> tuple[list[Path], dict[str, list[dict[str, Any]]]]:
    """removed.parquet, quarantine.jsonl, clusters.parquet, and under audit/ the per-reason table
    and the samples. Returns the files and the steps' records by kind (for their reports)."""
    work = stage_dir / "work"
    removed_path, quarantine_path = stage_dir / "removed.parquet", stage_dir / "quarantine.jsonl"
    with pq.ParquetWriter(removed_path, REMOVED_SCHEMA) as writer:
        for task in tasks:
            for phase in ("read", "filter", "write"):
                writer.write_table(pq.read_table(work / phase / f"{task.index:05d}.removed.parquet", schema=REMOVED_SCHEMA))
    with open(quarantine_path, "w", encoding="utf-8") as out:
        for task in tasks:
            for phase in ("read", "filter", "write"):
                out.write((work / phase / f"{task.index:05d}.quarantine.jsonl").read_text(encoding="utf-8"))
    records: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        for phase in ("read", "filter", "write"):
            with open(work / phase / f"{task.index:05d}.records.jsonl", encoding="utf-8") as f:
                for line in f:
                    entry = json.loads(line)
                    records.setdefault(entry["kind"], []).append(entry["row"])
    audit = stage_dir / "audit"
    audit.mkdir(exist_ok=True)
    reasons = {s: {r: {"docs": n, "bytes": t.removed_bytes[r]} for r, n in sorted(t.removed.items())} for s, t in sorted(ledger.sources.items())}
    (audit / "reasons.json").write_text(json.dumps(reasons, indent=2) + "\n")
    outputs = [removed_path, quarantine_path, audit / "reasons.json"]
    cluster_files = [work / "write" / f"{task.index:05d}.clusters.parquet" for task in tasks]
    clusters = pa.concat_tables([pq.read_table(f, schema=CLUSTERS_SCHEMA) for f in cluster_files])  # empty with minhash_dedup off
    pq.write_table(clusters.sort_by([("cluster", "ascending"), ("kept", "descending"), ("id", "ascending")]), stage_dir / "clusters.parquet")
    outputs.append(stage_dir / "clusters.parquet")
    for source, reason in sorted(ledger.samples):
        path = audit / "samples" / source / (reason.replace(":", "__") + ".jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in ledger.sample(source, reason)), encoding="utf-8")
        outputs.append(path)
    return outputs, records


def totals(ledger: Ledger) -> dict[str, Any]:
    per_source = {s: t.to_json() for s, t in sorted(ledger.sources.items())}
    removed: Counter[str] = Counter()
    stats: Counter[str] = Counter()
    for t in ledger.sources.values():
        removed.update(t.removed)
        stats.update(t.stats)
    return {
        "docs_in": sum(t["docs_in"] for t in per_source.values()),
        "docs_out": sum(t["docs_out"] for t in per_source.values()),
        "bytes_in": sum(t["bytes_in"] for t in per_source.values()),
        "bytes_out": sum(t["bytes_out"] for t in per_source.values()),
        "removed": dict(sorted(removed.items())),
        "quarantined": sum(t["quarantined"] for t in per_source.values()),
        "stats": dict(sorted(stats.items())),
        "per_source": per_source,
    }


def format_summary(counts: dict[str, Any], rows: list[str], top_reasons: int = 5) -> str:
    """The funnel per source (documents and MB after each step, in pipeline order, zeros shown)
    and its top removal reasons. A branch (prose or code rules) is shown when documents entered it."""
    lines = []
    for source, t in counts["per_source"].items():
        raw = ", quarantined ones at their raw size" if t["quarantined"] else ""
        lines.append(f"source {source}: {t['docs_in']:,} documents in ({t['bytes_in'] / MB:.1f} MB of text{raw}), {t['docs_out']:,} kept ({t['bytes_out'] / MB:.1f} MB), {t['quarantined']:,} quarantined")
        lines.append(f"  {'after step':<24} {'docs':>10} {'MB':>9} {'docs %':>7}")
        funnel = t["funnel"]
        for row in rows:
            branch = row.split("/")[0] if row in BRANCHES or "/" in row else None
            if branch is not None and branch not in funnel:
                continue  # no document of this source took that branch
            found = funnel.get(row, {"docs": 0, "bytes": 0})
            label = f"{row} rules, in" if row in BRANCHES else ("  " + row.split("/")[1] if "/" in row else row)
            lines.append(f"  {label:<24} {found['docs']:>10,} {found['bytes'] / MB:>9.2f} {100 * found['docs'] / max(t['docs_in'], 1):>6.1f}%")
        top = sorted(t["removed"].items(), key=lambda kv: (-kv[1], kv[0]))[:top_reasons]
        if top:
            lines.append("  top removal reasons: " + ", ".join(f"{r}={n:,}" for r, n in top))
    if counts["stats"]:
        lines.append("counters: " + ", ".join(f"{k}={v:,}" for k, v in counts["stats"].items()))
    lines.append(f"total: {counts['docs_in']:,} in, {counts['docs_out']:,} kept, {sum(counts['removed'].values()):,} removed, {counts['quarantined']:,} quarantined")
    if counts["docs_out"] == 0:
        lines.append("warning: no document was kept; the top removal reasons above and quarantine.jsonl say why")
    return "\n".join(lines)

