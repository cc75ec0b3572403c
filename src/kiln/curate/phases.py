"""The curate stage's nine map phases: one function per phase, each running one task, files between them.

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
9. write (one task per read task): drop the exact and near duplicates as the dedup modules
   decided, write `shards/<source>-<task>.jsonl.zst` and the task's rows of `clusters.parquet`.
Every task writes its outputs atomically and then a completion marker holding its ledger (the
read, filter and write phases) or its counts. Shard contents depend only on the inputs and the
config, never on the executor or the number of workers.
Not handled here: running the phases in order and skipping finished tasks (kiln.curate.run), and
merging the ledgers into the audit and the funnel (kiln.curate.report).
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from kiln.core.atomic import save_npy, write_atomically
from kiln.core.docshards import SUFFIX, ShardWriter, read_shard, read_shard_lines
from kiln.core.document import Document
from kiln.core.layout import SHARDS
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.exact import HashTable, dedup_partition, removals_for_task
from kiln.curate.dedup.near import bucket_task, components_task, decisions_for_task, sign_task, verify_task
from kiln.curate.readers import ReadLimits, ReadTask, read_task
from kiln.curate.steps.base import Step
from kiln.curate.steps.chain import code_steps, early_steps, groups, prose_steps, run_document, run_documents
from kiln.curate.steps.lines import LineCounts, document_line_keys
from kiln.text.code import doc_is_code

MB = 1_000_000
PHASES = ("read", "lines", "filter", "dedup", "sign", "buckets", "verify", "components", "write")
LEDGER_PHASES = ("read", "filter", "write")  # the phases whose tasks save a ledger (save_ledger)
MAX_OPEN_SHARDS = 64  # shard writers one write task keeps open at once
# The rows of clusters.parquet and removed.parquet; each task writes its part in the same schema.
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


def save_ledger(job: Job, ledger: Ledger, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the ledger's removed and quarantined rows beside the marker, then the marker itself (last).
    The marker holds the counts and samples (kiln.curate.report.load_ledger reads them back)."""
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


# --- the phases ---------------------------------------------------------------------------------


def read_phase(job: Job) -> dict[str, Any]:
    assert job.task is not None
    cfg, task = job.cfg, job.task
    ledger = Ledger(cfg.sample_size)
    steps: dict[str, list[Step]] = {}  # per source: its own url_filter settings, if any
    limits = ReadLimits(max_doc_bytes=int(cfg.max_doc_mb * MB), extract_timeout_s=cfg.extract_timeout_s)
    lines = LineCounts()
    docs = 0
    id_hashes: list[bytes] = []  # of the documents written, in order: duplicate ids are found across tasks (duplicate_ids)
    with ShardWriter(job.folder / f"{job.index:05d}{SUFFIX}", level=1) as writer:
        for doc in read_task(task, limits, ledger):
            ledger.seen(doc.source, len(doc.text.encode("utf-8", "surrogatepass")))
            ledger.passed("read", doc)
            docs += 1
            if doc.source not in steps:
                steps[doc.source] = early_steps(cfg.for_source(doc.source))
            out = run_document(doc, steps[doc.source], ledger)
            if out is None:
                continue
            writer.write(out)
            id_hashes.append(xxhash.xxh3_128_digest(out.id.encode("utf-8", "surrogatepass")))
            if cfg.line_dedup.enabled and not doc_is_code(out, task.input.code):
                lines.add(document_line_keys(out))
    save_npy(job.folder / f"{job.index:05d}.ids.npy", np.frombuffer(b"".join(id_hashes), dtype=ID_HASH).copy())
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
    branches: dict[str, tuple[list[Step], list[Step]]] = {}
    boilerplate_keys = boilerplate.tolist()

    def steps_of(source: str) -> tuple[list[Step], list[Step]]:
        """The prose and code steps for one source's documents (its own settings applied)."""
        if source not in branches:
            own = cfg.for_source(source)
            branches[source] = prose_steps(own, boilerplate_keys, index), code_steps(own, index)
        return branches[source]

    hashes = HashTable(job.index, cfg.exact_dedup.source_priority)
    renames = load_renames(job.stage_dir / "work" / "read", job.index)
    kept = seen = 0
    source, target = job.stage_dir / "work" / "read" / f"{job.index:05d}{SUFFIX}", job.folder / f"{job.index:05d}{SUFFIX}"
    # perf: with no step in either branch (a dedup-only run) no document changes here, so the read
    # phase's file is linked rather than encoded and compressed again (0.4 s of 0.8 s per 33 MB).
    unchanged = not cfg.sources and not renames and steps_of("") == ([], [])
    with nullcontext() if unchanged else ShardWriter(target, level=1) as writer:
        for group in groups(renamed(read_shard(source), renames, ledger)):
            seen += len(group)
            for out in branch_outcomes(group, job.task.input.code, steps_of, ledger):
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


# --- duplicate ids: found across the read tasks, renamed in the filter phase -------------------------

ID_HASH = np.dtype([("high", "<u8"), ("low", "<u8")])  # xxh3_128 of a document id


def duplicate_ids(read_dir: Path, tasks: int) -> dict[int, dict[int, int]]:
    """Per task, the positions (in its read output) of documents whose id an earlier document
    (in task order, then read order) already has, and which occurrence each is (2, 3, ...)."""
    per_task = [np.load(read_dir / f"{t:05d}.ids.npy") for t in range(tasks)]
    every = np.concatenate(per_task) if per_task else np.zeros(0, ID_HASH)
    _, inverse, counts = np.unique(every, return_inverse=True, return_counts=True)
    repeated = np.flatnonzero(counts[inverse] > 1)
    found: dict[int, dict[int, int]] = {}
    seen: dict[int, int] = {}
    starts = np.cumsum([0, *(len(p) for p in per_task)])
    for index in repeated.tolist():  # in global order, so the first occurrence keeps its id
        group = int(inverse[index])
        seen[group] = seen.get(group, 0) + 1
        if seen[group] > 1:
            task = int(np.searchsorted(starts, index, side="right")) - 1
            found.setdefault(task, {})[index - int(starts[task])] = seen[group]
    return found


def save_renames(read_dir: Path, renames: dict[int, dict[int, int]], tasks: int) -> None:
    for task in range(tasks):
        write_atomically(read_dir / f"{task:05d}.renames.json", lambda p, t=task: p.write_text(json.dumps({str(k): v for k, v in renames.get(t, {}).items()})))


def load_renames(read_dir: Path, task: int) -> dict[int, int]:
    path = read_dir / f"{task:05d}.renames.json"
    return {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}


def renamed(docs: Iterator[Document], renames: dict[int, int], ledger: Ledger) -> Iterator[Document]:
    """The task's documents, each later holder of a shared id as `<id>#<n>` (counted, and recorded for audit/duplicate_ids.json)."""
    for position, doc in enumerate(docs):
        n = renames.get(position)
        if n is not None:
            new = replace(doc, id=f"{doc.id}#{n}")
            ledger.count(doc.source, "read:duplicate_id")
            ledger.record("duplicate_id", {"id": doc.id, "renamed": new.id, "source": doc.source})
            doc = new
        yield doc


def branch_outcomes(group: list[Document], marked: bool | None, steps_of: Callable[[str], tuple[list[Step], list[Step]]], ledger: Ledger) -> list[Document | None]:
    """Each document of `group` after its branch's steps for its source (steps_of(source): prose,
    code; None: removed or quarantined), in order. The ledger rows the group adds (removals,
    quarantines, step records) are put in read order, as running each document through its steps
    in turn writes them."""
    starts = len(ledger.removed), len(ledger.quarantined), {kind: len(rows) for kind, rows in ledger.records.items()}
    is_code = [doc_is_code(doc, marked) for doc in group]
    outcomes: list[Document | None] = [None] * len(group)
    for source in dict.fromkeys(doc.source for doc in group):
        prose, code = steps_of(source)
        for branch, steps in (("prose", prose), ("code", code)):
            members = [i for i, (c, doc) in enumerate(zip(is_code, group, strict=True)) if c == (branch == "code") and doc.source == source]
            for i, out in zip(members, run_documents([group[i] for i in members], steps, ledger, branch), strict=True):
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
    """Drop the task's exact and near duplicates, as the dedup phases decided, and write one shard
    per source. A task whose documents carry more than MAX_OPEN_SHARDS sources is written in
    several passes over its filtered file, so the number of open files stays bounded."""
    cfg = job.cfg
    ledger = Ledger(cfg.sample_size)
    work = job.stage_dir / "work"
    removals = exact_removals(job)
    near = cfg.minhash_dedup
    decisions = decisions_for_task(work / "components" / "assign.parquet", work / "sign", job.index, near) if near.enabled else {}
    clusters: dict[str, list[Any]] = {name: [] for name in CLUSTERS_SCHEMA.names}
    filtered = work / "filter" / f"{job.index:05d}{SUFFIX}"
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
                if (decided := decisions.get(ordinal)) is not None:
                    for name, value in zip(CLUSTERS_SCHEMA.names, (doc.id, decided.cluster, decided.kept, decided.jaccard_to_kept)):
                        clusters[name].append(value)
                    if not decided.kept:
                        ledger.remove(doc, "minhash_dedup", "near_duplicate", decided.jaccard_to_kept, decided.threshold, note=decided.note, kept_id=decided.kept_id)
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
            raise
        for writer in writers.values():
            writer.close()
            shards.append(writer.path.name)
            docs += writer.docs
        finished |= batch
    # every row of a source is written in that source's pass: sort so the file never depends on passes
    table = pa.table(clusters, schema=CLUSTERS_SCHEMA).sort_by([("cluster", "ascending"), ("id", "ascending")])
    write_atomically(job.folder / f"{job.index:05d}.clusters.parquet", lambda p: pq.write_table(table, p))
    return save_ledger(job, ledger, {"docs": docs, "shards": sorted(shards)})


PHASE_FUNCTIONS = {
    "read": read_phase, "lines": lines_phase, "filter": filter_phase, "dedup": dedup_phase, "sign": sign_phase,
    "buckets": bucket_phase, "verify": verify_phase, "components": components_phase, "write": write_phase,
}


def run_job(job: Job) -> tuple[int, dict[str, Any]]:
    """The executor's entry point: run one task of its phase; return its index and marker content."""
    return job.index, PHASE_FUNCTIONS[job.phase](job)
