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
config, never on the executor or the number of workers. Each phase is a `Phase` (kiln.curate.jobs)
holding its function; its jobs carry its settings record (`ReadSettings`, ...: only what it reads,
built from the curate config by kiln.curate.run), never the whole config.
Not handled here: running the phases in order and skipping finished tasks (kiln.curate.run), and
merging the ledgers into the audit and the funnel (kiln.curate.report).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from kiln.core.atomic import save_npy, write_atomically
from kiln.core.docshards import SUFFIX, ShardWriter, read_shard, read_shard_lines
from kiln.core.document import Document
from kiln.core.layout import SHARDS
from kiln.core.manifest import sha256_file
from kiln.curate.audit import Ledger
from kiln.curate.config import CurateConfig
from kiln.curate.dedup.exact import ExactDedupConfig, HashTable, dedup_partition, removals_for_task
from kiln.curate.dedup.minhash import MinHashConfig
from kiln.curate.dedup.near import (
    NearDecision,
    bucket_task,
    components_task,
    decisions_for_task,
    sign_task,
    verify_task,
)
from kiln.curate.jobs import Job, Phase, WorkDir
from kiln.curate.readers import ReadLimits, read_task
from kiln.curate.steps.base import Step
from kiln.curate.steps.chain import (
    SourceSteps,
    code_steps,
    early_steps,
    groups,
    prose_steps,
    run_document,
    run_documents,
)
from kiln.curate.steps.lines import LineCounts, document_line_keys
from kiln.text.code import doc_is_code

MB = 1_000_000
LEDGER_PHASES = ("read", "filter", "write")  # the phases whose tasks save a ledger (save_ledger)
LEDGER_FILES = (".removed.parquet", ".quarantine.jsonl", ".records.jsonl")  # what save_ledger writes beside its marker
MAX_OPEN_SHARDS = 64  # shard writers one write task keeps open at once
# The rows of clusters.parquet and removed.parquet; each task writes its part in the same schema.
CLUSTERS_SCHEMA = pa.schema(
    [("id", pa.string()), ("cluster", pa.int64()), ("kept", pa.bool_()), ("jaccard_to_kept", pa.float64())]
)
REMOVED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("value", pa.float64()),
        ("threshold", pa.float64()),
        ("note", pa.string()),
        ("kept_id", pa.string()),
    ]
)


# --- what each phase reads: one frozen record per phase, built from the curate config --------------


@dataclass(frozen=True)
class ReadSettings:
    steps: SourceSteps  # the early steps (normalize, url_filter) per source
    limits: ReadLimits
    count_lines: bool  # line_dedup.enabled: count each prose document's distinct lines for the lines phase
    sample_size: int

    @classmethod
    def of(cls, cfg: CurateConfig) -> ReadSettings:
        limits = ReadLimits(max_doc_bytes=int(cfg.max_doc_mb * MB), extract_timeout_s=cfg.extract_timeout_s)
        return cls(SourceSteps.of(cfg), limits, cfg.line_dedup.enabled, cfg.sample_size)


@dataclass(frozen=True)
class LinesSettings:
    partitions: int
    max_docs: int  # line_dedup.max_docs: a line in more documents of a source than this is boilerplate


@dataclass(frozen=True)
class FilterSettings:
    steps: SourceSteps  # the prose and code branches per source
    boilerplate: bool  # line_dedup.enabled: the lines phase left a boilerplate list
    exact_dedup: ExactDedupConfig
    partitions: int  # of the text hashes the dedup phase reads
    sample_size: int

    @classmethod
    def of(cls, cfg: CurateConfig, partitions: int) -> FilterSettings:
        return cls(SourceSteps.of(cfg), cfg.line_dedup.enabled, cfg.exact_dedup, partitions, cfg.sample_size)


@dataclass(frozen=True)
class SignSettings:
    exact: bool  # exact_dedup.enabled: its duplicates are not signed
    near: MinHashConfig
    priority: tuple[str, ...]  # CurateConfig.near_priority


@dataclass(frozen=True)
class BucketSettings:
    subs: int  # bucket-key ranges per band (kiln.curate.run.key_ranges)
    near: MinHashConfig


@dataclass(frozen=True)
class VerifySettings:
    partitions: int
    tasks: int  # read tasks in the run (their indices are 0..tasks-1)
    near: MinHashConfig


@dataclass(frozen=True)
class WriteSettings:
    exact: bool  # exact_dedup.enabled
    near: MinHashConfig
    sample_size: int


def save_ledger(job: Job[Any], ledger: Ledger, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the ledger's removed and quarantined rows beside the marker, then the marker itself (last).
    The marker holds the counts and samples (kiln.curate.report.load_ledger reads them back)."""
    removed = pa.Table.from_pylist(ledger.removed, schema=REMOVED_SCHEMA)
    write_atomically(job.file(".removed.parquet"), lambda p: pq.write_table(removed, p))
    quarantined = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in ledger.quarantined)
    write_atomically(job.file(".quarantine.jsonl"), lambda p: p.write_text(quarantined, encoding="utf-8"))
    rows = ((kind, row) for kind, kind_rows in sorted(ledger.records.items()) for row in kind_rows)
    records = "".join(json.dumps({"kind": kind, "row": row}, ensure_ascii=False) + "\n" for kind, row in rows)
    write_atomically(job.file(".records.jsonl"), lambda p: p.write_text(records, encoding="utf-8"))
    summary = {
        "sources": {s: t.to_json() for s, t in ledger.sources.items()},
        "samples": {f"{s}\x00{r}": ledger.sample(s, r) for s, r in ledger.samples},
        **(extra or {}),
    }
    return job.finish(summary)


# --- the phases ---------------------------------------------------------------------------------


def read_phase(job: Job[ReadSettings]) -> dict[str, Any]:
    assert job.task is not None
    settings, task = job.settings, job.task
    ledger = Ledger(settings.sample_size)
    steps: dict[str, list[Step]] = {}  # per source: its own url_filter settings, if any
    lines = LineCounts()
    docs = 0
    id_hashes: list[
        bytes
    ] = []  # of the documents written, in order: duplicate ids are found across tasks (duplicate_ids)
    with ShardWriter(job.file(SUFFIX), level=1) as writer:
        for doc in read_task(task, settings.limits, ledger):
            ledger.seen(doc.source, len(doc.text.encode("utf-8", "surrogatepass")))
            ledger.passed("read", doc)
            docs += 1
            if doc.source not in steps:
                steps[doc.source] = early_steps(settings.steps.for_source(doc.source))
            out = run_document(doc, steps[doc.source], ledger)
            if out is None:
                continue
            writer.write(out)
            id_hashes.append(xxhash.xxh3_128_digest(out.id.encode("utf-8", "surrogatepass")))
            if settings.count_lines and not doc_is_code(out, task.input.code):
                lines.add(document_line_keys(out))
    save_npy(job.file(".ids.npy"), np.frombuffer(b"".join(id_hashes), dtype=ID_HASH).copy())
    keys, counts = lines.result()
    save_npy(job.file(".keys.npy"), keys)
    save_npy(job.file(".counts.npy"), counts)
    return save_ledger(job, ledger, {"docs": docs})


def lines_phase(job: Job[LinesSettings]) -> dict[str, Any]:
    """Sum one key range of every read task's line counts; keep the keys over the threshold."""
    partitions = job.settings.partitions
    bits = partitions.bit_length() - 1
    lo = np.uint64(job.index << (64 - bits)) if bits else np.uint64(0)
    hi = np.uint64((job.index + 1) << (64 - bits)) if bits and job.index + 1 < partitions else None
    parts_keys, parts_counts = [], []
    for keys_path in sorted(job.work.phase("read").glob("*.keys.npy")):
        keys = np.load(keys_path, mmap_mode="r")
        counts = np.load(keys_path.with_name(keys_path.name.replace(".keys.", ".counts.")), mmap_mode="r")
        start = np.searchsorted(keys, lo) if bits else 0
        stop = np.searchsorted(keys, hi) if hi is not None else len(keys)
        parts_keys.append(np.asarray(keys[start:stop]))
        parts_counts.append(np.asarray(counts[start:stop]))
    keys = np.concatenate(parts_keys) if parts_keys else np.zeros(0, np.uint64)
    counts = np.concatenate(parts_counts) if parts_counts else np.zeros(0, np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    totals = np.bincount(inverse.ravel(), weights=counts, minlength=len(unique)) if len(unique) else np.zeros(0)
    boilerplate = unique[totals > job.settings.max_docs]
    save_npy(job.file(".npy"), boilerplate)
    return job.finish({"boilerplate_lines": int(len(boilerplate))})


def filter_phase(job: Job[FilterSettings]) -> dict[str, Any]:
    assert job.task is not None
    settings, work = job.settings, job.work
    ledger = Ledger(settings.sample_size)
    boilerplate = np.load(work.boilerplate) if settings.boilerplate else np.zeros(0, np.uint64)
    index = work.decontamination_index
    branches: dict[str, tuple[list[Step], list[Step]]] = {}
    boilerplate_keys = boilerplate.tolist()

    def steps_of(source: str) -> tuple[list[Step], list[Step]]:
        """The prose and code steps for one source's documents (its own settings applied)."""
        if source not in branches:
            own = settings.steps.for_source(source)
            languages = settings.steps.languages_of(source)
            branches[source] = prose_steps(own, boilerplate_keys, index, languages), code_steps(own, index)
        return branches[source]

    exact = settings.exact_dedup
    hashes = HashTable(job.index, exact.source_priority)
    renames = load_renames(work, job.index)
    kept = seen = 0
    source, target = work.file("read", job.index, SUFFIX), job.file(SUFFIX)
    # perf: with no step in either branch (a dedup-only run) no document changes here, so the read
    # phase's file is linked rather than encoded and compressed again (0.4 s of 0.8 s per 33 MB).
    unchanged = not settings.steps.own and not renames and steps_of("") == ([], [])
    with nullcontext() if unchanged else ShardWriter(target, level=1) as writer:
        for group in groups(renamed(read_shard(source), renames, ledger)):
            seen += len(group)
            for out in branch_outcomes(group, job.task.input.code, steps_of, ledger):
                if out is None:
                    continue
                if exact.enabled:
                    hashes.add(kept, out.id, out.source, out.text)
                if writer is not None:
                    writer.write(out)
                kept += 1
    if unchanged:
        link = target.with_name(target.name + ".link")
        link.unlink(missing_ok=True)
        os.link(source, link)
        os.replace(link, target)
    if exact.enabled:
        hashes.write(job.folder, settings.partitions)
    return save_ledger(job, ledger, {"docs": seen, "kept": kept})


# --- duplicate ids: found across the read tasks, renamed in the filter phase -------------------------

ID_HASH = np.dtype([("high", "<u8"), ("low", "<u8")])  # xxh3_128 of a document id


def duplicate_ids(work: WorkDir, tasks: int) -> dict[int, dict[int, int]]:
    """Per task, the positions (in its read output) of documents whose id an earlier document
    (in task order, then read order) already has, and which occurrence each is (2, 3, ...)."""
    per_task = [np.load(work.file("read", t, ".ids.npy")) for t in range(tasks)]
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


def save_renames(work: WorkDir, renames: dict[int, dict[int, int]], tasks: int) -> None:
    for task in range(tasks):
        text = json.dumps({str(k): v for k, v in renames.get(task, {}).items()})
        write_atomically(work.file("read", task, ".renames.json"), lambda p, text=text: p.write_text(text))


def load_renames(work: WorkDir, task: int) -> dict[int, int]:
    path = work.file("read", task, ".renames.json")
    return {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}


def renamed(docs: Iterator[Document], renames: dict[int, int], ledger: Ledger) -> Iterator[Document]:
    """The task's documents, each later holder of a shared id as `<id>#<n>` (counted, and recorded for
    audit/duplicate_ids.json)."""
    for position, doc in enumerate(docs):
        n = renames.get(position)
        if n is not None:
            new = replace(doc, id=f"{doc.id}#{n}")
            ledger.count(doc.source, "read:duplicate_id")
            ledger.record("duplicate_id", {"id": doc.id, "renamed": new.id, "source": doc.source})
            doc = new
        yield doc


def branch_outcomes(
    group: list[Document], marked: bool | None, steps_of: Callable[[str], tuple[list[Step], list[Step]]], ledger: Ledger
) -> list[Document | None]:
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
            members = [
                i
                for i, (c, doc) in enumerate(zip(is_code, group, strict=True))
                if c == (branch == "code") and doc.source == source
            ]
            for i, out in zip(members, run_documents([group[i] for i in members], steps, ledger, branch), strict=True):
                outcomes[i] = out
    first: dict[str, int] = {}
    for i, doc in enumerate(group):
        first.setdefault(doc.id, i)

    def in_read_order(rows: list[dict[str, Any]], start: int) -> None:
        rows[start:] = sorted(
            rows[start:], key=lambda row: first.get(row["id"], len(group))
        )  # stable: one document's rows keep step order

    in_read_order(ledger.removed, starts[0])
    in_read_order(ledger.quarantined, starts[1])
    for kind, rows in ledger.records.items():
        in_read_order(rows, starts[2].get(kind, 0))
    return outcomes


def dedup_phase(job: Job[None]) -> dict[str, Any]:
    removed = dedup_partition(job.work.phase("filter"), job.index, job.file(".parquet"))
    return job.finish({"duplicates": removed})


def exact_removals(work: WorkDir, task: int, exact: bool) -> dict[int, str]:
    """The task's exact duplicates (by position in its filtered file), each with the id of the copy kept."""
    return removals_for_task(work.phase("dedup"), task) if exact else {}


def sign_phase(job: Job[SignSettings]) -> dict[str, Any]:
    settings, work = job.settings, job.work
    skip = exact_removals(work, job.index, settings.exact)
    filtered = work.file("filter", job.index, SUFFIX)
    return job.finish(sign_task(filtered, job.folder, job.index, skip, settings.near, settings.priority))


def bucket_phase(job: Job[BucketSettings]) -> dict[str, Any]:
    subs = job.settings.subs
    band, sub = divmod(job.index, subs)
    return job.finish(bucket_task(job.work.phase("sign"), job.file(".npy"), band, sub, subs, job.settings.near))


def verify_phase(job: Job[VerifySettings]) -> dict[str, Any]:
    settings, work = job.settings, job.work
    found = verify_task(
        work.phase("buckets"),
        work.phase("sign"),
        job.file(".parquet"),
        job.index,
        settings.partitions,
        settings.tasks,
        settings.near,
    )
    return job.finish(found)


def components_phase(job: Job[None]) -> dict[str, Any]:
    work = job.work
    return job.finish(components_task(work.phase("verify"), work.phase("sign"), work.assignments))


def write_phase(job: Job[WriteSettings]) -> dict[str, Any]:
    """Drop the task's exact and near duplicates, as the dedup phases decided, and write one shard
    per source. A task whose documents carry more than MAX_OPEN_SHARDS sources is written in
    several passes over its filtered file, so the number of open files stays bounded."""
    settings, work = job.settings, job.work
    ledger = Ledger(settings.sample_size)
    removals = exact_removals(work, job.index, settings.exact)
    near = settings.near
    decisions = decisions_for_task(work.assignments, work.phase("sign"), job.index, near) if near.enabled else {}
    clusters: dict[str, list[Any]] = {name: [] for name in CLUSTERS_SCHEMA.names}
    filtered = work.file("filter", job.index, SUFFIX)
    (work.stage_dir / SHARDS).mkdir(exist_ok=True)  # on another machine of a run on a store, the first shard there
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
                if not survives_dedup(doc, ordinal, removals, decisions, settings, ledger, clusters):
                    continue
                if doc.source not in writers:
                    writers[doc.source] = ShardWriter(work.stage_dir / SHARDS / f"{doc.source}-{job.index:05d}{SUFFIX}")
                writers[doc.source].write_line(line)  # kept as the filter phase wrote it
                ledger.kept(doc)
        except BaseException:
            for writer in writers.values():
                writer.__exit__(RuntimeError, None, None)  # removes its temp file
            raise
        for writer in writers.values():
            writer.close()
            shards.append(writer.path)
            docs += writer.docs
        finished |= batch
    # every row of a source is written in that source's pass: sort so the file never depends on passes
    table = pa.table(clusters, schema=CLUSTERS_SCHEMA).sort_by([("cluster", "ascending"), ("id", "ascending")])
    write_atomically(job.file(".clusters.parquet"), lambda p: pq.write_table(table, p))
    # Each shard's size and sha256 (read back from the page cache): the stage's manifest takes them from
    # here, so a driver that never holds a shard (a run on a store, tasks on other machines) records them.
    records = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(shards)}
    files = [f"{SHARDS}/{name}" for name in records]
    return save_ledger(job, ledger, {"docs": docs, "shards": sorted(records), "shard_records": records, "files": files})


def survives_dedup(
    doc: Document,
    ordinal: int,
    removals: dict[int, str],
    decisions: dict[int, NearDecision],
    settings: WriteSettings,
    ledger: Ledger,
    clusters: dict[str, list[Any]],
) -> bool:
    """Whether the filtered document at `ordinal` is neither an exact nor a near duplicate removed; the
    removal, the steps it passed and its cluster row (when clustered) go to `ledger` and `clusters`."""
    if ordinal in removals:
        ledger.remove(
            doc, "exact_dedup", "duplicate", note=f"duplicate of {removals[ordinal]}", kept_id=removals[ordinal]
        )
        return False
    if settings.exact:
        ledger.passed("exact_dedup", doc)
    if (decided := decisions.get(ordinal)) is not None:
        for name, value in zip(CLUSTERS_SCHEMA.names, (doc.id, decided.cluster, decided.kept, decided.jaccard_to_kept)):
            clusters[name].append(value)
        if not decided.kept:
            ledger.remove(
                doc,
                "minhash_dedup",
                "near_duplicate",
                decided.jaccard_to_kept,
                decided.threshold,
                note=decided.note,
                kept_id=decided.kept_id,
            )
            return False
    if settings.near.enabled:
        ledger.passed("minhash_dedup", doc)
    return True


def lines_reads(job: Job[LinesSettings]) -> list[str]:
    return ["read/*.keys.npy", "read/*.counts.npy"]


def filter_reads(job: Job[FilterSettings]) -> list[str]:
    own = f"read/{job.index:05d}"
    return [own + SUFFIX, own + ".renames.json", "lines/boilerplate.npy", "decontaminate/*"]


def dedup_reads(job: Job[None]) -> list[str]:
    return [f"filter/p{job.index:04d}/*.parquet"]


def sign_reads(job: Job[SignSettings]) -> list[str]:
    return [f"filter/{job.index:05d}{SUFFIX}", "dedup/*.parquet"]


def bucket_reads(job: Job[BucketSettings]) -> list[str]:
    return ["sign/*.bands.npy"]


def verify_reads(job: Job[VerifySettings]) -> list[str]:
    return ["buckets/*.npy", "sign/*"]


def components_reads(job: Job[None]) -> list[str]:
    return ["verify/*.parquet", "sign/*.docs.parquet"]


def write_reads(job: Job[WriteSettings]) -> list[str]:
    # The sign files of every task: a removed document's Jaccard to its keeper reads the keeper's task's sets.
    return [f"filter/{job.index:05d}{SUFFIX}", "dedup/*.parquet", "components/assign.parquet", "sign/*"]


# What each phase reads of the others' files (globs under work/): what a task on another machine of a run on
# a store fetches first (kiln.curate.jobs.run_job).
READ: Phase[ReadSettings] = Phase("read", read_phase)
LINES: Phase[LinesSettings] = Phase("lines", lines_phase, lines_reads)
FILTER: Phase[FilterSettings] = Phase("filter", filter_phase, filter_reads)
DEDUP: Phase[None] = Phase("dedup", dedup_phase, dedup_reads)
SIGN: Phase[SignSettings] = Phase("sign", sign_phase, sign_reads)
BUCKETS: Phase[BucketSettings] = Phase("buckets", bucket_phase, bucket_reads)
VERIFY: Phase[VerifySettings] = Phase("verify", verify_phase, verify_reads)
COMPONENTS: Phase[None] = Phase("components", components_phase, components_reads)
WRITE: Phase[WriteSettings] = Phase("write", write_phase, write_reads)
PHASES: tuple[Phase[Any], ...] = (READ, LINES, FILTER, DEDUP, SIGN, BUCKETS, VERIFY, COMPONENTS, WRITE)  # in run order
