"""Near-duplicate removal at corpus scale: four map phases with files between them.

1. sign (one task per read task): shingle every document that survived exact dedup, write its
   signature, its shingle set (for verification), its row (id, source, rank, keeper preference),
   and per band its bucket keys sorted, as `(key, doc)` rows. A document is named by a 64-bit
   number `task << 32 | local`, so no phase needs a global numbering first.
2. buckets (one task per band and key range): read that slice of every sign task's sorted keys,
   propose the pairs that share a bucket, write them sorted by their first document.
3. verify (one task per range of sign tasks): take the candidate pairs whose first document is
   in the range, drop repeats, and keep those whose exact shingle Jaccard reaches the threshold
   (or, with verification off, all of them, with the signature estimate).
4. components (one task): connected components of the verified pairs; one keeper per cluster.
   It writes the assignment of every clustered document, sorted by task.
Then the curate write phase asks `decisions_for_task` what to do with each clustered document of
its task: this module alone applies the threshold and the chained-member rule (`decide`), and
the write phase (kiln.curate.phases) applies the decisions as given.
Memory: a sign task holds its own documents' keys (about 250 bytes a document); a bucket task
one band's key range; a verify task its pairs and the two sets it compares; the components
task the verified pairs only. No process holds all signatures.
Not handled here: the MinHash math (kiln.curate.dedup.minhash), the phase functions and
markers (kiln.curate.phases) and the driver (kiln.curate.run).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.core.atomic import save_npy, write_atomically
from kiln.core.docshards import read_shard
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.dedup.exact import source_rank
from kiln.curate.dedup.minhash import (
    MinHashConfig,
    band_keys,
    bucket_pairs,
    choose_keepers,
    components,
    estimated_jaccard,
    jaccard,
    permutation_params,
    preference_value,
    signatures_flat,
)
from kiln.text.shingles import shingle_sets

DOCS_SCHEMA = pa.schema(
    [
        ("local", pa.int32()),
        ("ordinal", pa.int64()),
        ("id", pa.string()),
        ("source", pa.string()),
        ("rank", pa.int32()),
        ("preference", pa.float64()),
    ]
)
EDGE_SCHEMA = pa.schema([("a", pa.uint64()), ("b", pa.uint64()), ("jaccard", pa.float64())])
ASSIGN_SCHEMA = pa.schema(
    [
        ("task", pa.int32()),
        ("ordinal", pa.int64()),
        ("doc", pa.uint64()),
        ("id", pa.string()),
        ("cluster", pa.int64()),
        ("kept", pa.bool_()),
        ("keeper", pa.uint64()),
        ("kept_id", pa.string()),
    ]
)
SIGN_BATCH = 512  # documents shingled and signed together


def doc_number(task: int, local: int | np.ndarray) -> Any:
    """A signed document's number: its read task in the high 32 bits, its index there in the low."""
    return (np.uint64(task) << np.uint64(32)) | np.asarray(local, dtype=np.uint64)


def task_of(doc: int | np.ndarray) -> Any:
    """The read task of a document number."""
    return np.asarray(doc, dtype=np.uint64) >> np.uint64(32)


# --- 1. sign --------------------------------------------------------------------------------------


def sign_task(
    filtered: Path, folder: Path, task: int, skip: Container[int], cfg: MinHashConfig, priority: Sequence[str]
) -> dict[str, Any]:
    """Shingle and sign the documents of one filtered shard, except the ordinals in `skip`."""
    a, b = permutation_params(cfg.permutations, cfg.seed)
    base = folder / f"{task:05d}"
    rows: dict[str, list[Any]] = {name: [] for name in DOCS_SCHEMA.names}
    keys: list[np.ndarray] = []
    offsets, no_words, shingle_total = [0], 0, 0
    batch: list[tuple[int, Document]] = []
    with open(part(base, ".sig.u32"), "wb") as sig_out, open(part(base, ".shingles.u64"), "wb") as set_out:

        def flush() -> None:
            nonlocal no_words, shingle_total
            # each document's language (the language step's meta.language) picks the segmenter of its runs
            # written without spaces; a value that is not a language code counts as unknown
            languages = [lang if isinstance(lang := doc.meta.get("language"), str) else None for _, doc in batch]
            values, ends = shingle_sets([doc.text for _, doc in batch], cfg.ngram, cfg.fold_digits, languages)
            sizes = np.diff(ends)
            signed = 0
            for (ordinal, doc), size in zip(batch, sizes):
                if size == 0:
                    no_words += 1  # nothing to compare: such a document is never a near-duplicate
                    continue
                rows["local"].append(len(rows["local"]))
                rows["ordinal"].append(ordinal)
                rows["id"].append(doc.id)
                rows["source"].append(doc.source)
                rows["rank"].append(source_rank(doc.source, priority))
                rows["preference"].append(
                    preference_value(cfg.prefer, len(doc.text.encode("utf-8", "surrogatepass")), doc.meta)
                )
                offsets.append(offsets[-1] + int(size))
                signed += 1
            batch.clear()
            if not signed:
                return
            if cfg.verify:
                set_out.write(values.tobytes())  # the batch's sets in document order; empty ones add nothing
            shingle_total += len(values)
            sigs = signatures_flat(values, np.unique(ends), a, b)  # empty sets (repeated ends) dropped
            sig_out.write(sigs.tobytes())
            keys.append(band_keys(sigs, cfg.bands, cfg.rows))

        for ordinal, doc in enumerate(read_shard(filtered)):
            if ordinal in skip:
                continue
            batch.append((ordinal, doc))
            if len(batch) == SIGN_BATCH:
                flush()
        if batch:
            flush()
    count = len(rows["local"])
    if count >= 2**31:  # a document's number holds its task-local index in 32 bits (int32 in the table)
        raise FatalError(
            f"curate: read task {task} holds {count:,} documents, over the 2^31 one task can sign; split its "
            "input file (one JSONL file is one task)"
        )
    all_keys = np.concatenate(keys) if keys else np.zeros((0, cfg.bands), dtype=np.uint64)
    docs = doc_number(task, np.arange(count))
    bands = np.empty((cfg.bands, count, 2), dtype=np.uint64)
    for band in range(cfg.bands):  # per band, rows sorted by (key, doc): bucket tasks slice a key range
        order = np.lexsort((docs, all_keys[:, band]))
        bands[band, :, 0] = all_keys[order, band]
        bands[band, :, 1] = docs[order]
    save_npy(base.with_suffix(".bands.npy"), bands)
    save_npy(base.with_suffix(".offsets.npy"), np.array(offsets, dtype=np.int64))
    write_atomically(base.with_suffix(".docs.parquet"), lambda p: pq.write_table(pa.table(rows, schema=DOCS_SCHEMA), p))
    for suffix in (".sig.u32", ".shingles.u64"):
        os.replace(part(base, suffix), base.with_suffix(suffix))
    return {"signed": count, "no_words": no_words, "shingles": shingle_total}


def part(base: Path, suffix: str) -> Path:
    return base.with_suffix(suffix + ".part")


# --- 2. buckets -----------------------------------------------------------------------------------


def key_range(sub: int, subs: int) -> tuple[np.uint64, np.uint64 | None]:
    """Bucket keys of sub-partition `sub` of `subs` (a power of two): [lo, hi), hi None for the top."""
    bits = subs.bit_length() - 1
    lo = np.uint64(sub << (64 - bits)) if bits else np.uint64(0)
    hi = np.uint64((sub + 1) << (64 - bits)) if bits and sub + 1 < subs else None
    return lo, hi


def bucket_task(sign_dir: Path, out: Path, band: int, sub: int, subs: int, cfg: MinHashConfig) -> dict[str, Any]:
    """Candidate pairs of one band's key range, over every sign task; written sorted by (a, b)."""
    lo, hi = key_range(sub, subs)
    keys, docs = [], []
    for path in sorted(sign_dir.glob("*.bands.npy")):
        rows = np.load(path, mmap_mode="r")[band]
        start = np.searchsorted(rows[:, 0], lo)
        stop = np.searchsorted(rows[:, 0], hi) if hi is not None else len(rows)
        keys.append(np.asarray(rows[start:stop, 0]))
        docs.append(np.asarray(rows[start:stop, 1]))
    pairs = bucket_pairs(
        np.concatenate(keys) if keys else np.zeros(0, np.uint64),
        np.concatenate(docs) if docs else np.zeros(0, np.uint64),
        cfg.max_bucket_pairs,
    )
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs  # sorted by (a, b), repeats dropped
    save_npy(out, pairs)
    return {"candidates": int(len(pairs))}


# --- 3. verify ------------------------------------------------------------------------------------


def task_range(partition: int, partitions: int, tasks: int) -> tuple[int, int]:
    """Sign tasks [first, stop) whose pairs verify partition `partition` takes."""
    return partition * tasks // partitions, (partition + 1) * tasks // partitions


class Sets:
    """Shingle sets and signatures of signed documents, by document number, read with pread.

    subtle: not memory maps. Pages of a mapped file count in the process's resident memory, and a
    write task touching keepers across every sign file grew to 2.9 GB at a million documents;
    explicit reads keep memory at the sets being compared. At most MAX_OPEN tasks' files are
    open at once (least recently used closed first). Use as a context manager."""

    MAX_OPEN = 64

    def __init__(self, sign_dir: Path, cfg: MinHashConfig):
        self.dir, self.cfg = sign_dir, cfg
        self._open: OrderedDict[int, tuple[int, int, np.ndarray]] = (
            OrderedDict()
        )  # task -> (shingles fd, signatures fd, offsets)

    def _files(self, task: int) -> tuple[int, int, np.ndarray]:
        found = self._open.get(task)
        if found is not None:
            self._open.move_to_end(task)
            return found
        if len(self._open) >= self.MAX_OPEN:
            _, (fd_sets, fd_sigs, _) = self._open.popitem(last=False)
            os.close(fd_sets)
            os.close(fd_sigs)
        base = self.dir / f"{task:05d}"
        found = (
            os.open(base.with_suffix(".shingles.u64"), os.O_RDONLY),
            os.open(base.with_suffix(".sig.u32"), os.O_RDONLY),
            np.load(base.with_suffix(".offsets.npy")),
        )
        self._open[task] = found
        return found

    def shingles(self, doc: int) -> np.ndarray:
        fd, _, offsets = self._files(int(doc) >> 32)
        local = int(doc) & 0xFFFF_FFFF
        start, stop = int(offsets[local]), int(offsets[local + 1])
        return np.frombuffer(os.pread(fd, (stop - start) * 8, start * 8), dtype=np.uint64)

    def signature(self, doc: int) -> np.ndarray:
        _, fd, _ = self._files(int(doc) >> 32)
        width = self.cfg.permutations * 4
        return np.frombuffer(os.pread(fd, width, (int(doc) & 0xFFFF_FFFF) * width), dtype=np.uint32)

    def similarity(self, x: int, y: int) -> float:
        """Exact Jaccard with verification on, else the signature estimate."""
        if self.cfg.verify:
            return jaccard(self.shingles(x), self.shingles(y))
        return estimated_jaccard(self.signature(x), self.signature(y))

    def close(self) -> None:
        while self._open:
            _, (fd_sets, fd_sigs, _) = self._open.popitem()
            os.close(fd_sets)
            os.close(fd_sigs)

    def __enter__(self) -> Sets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verify_task(
    bucket_dir: Path, sign_dir: Path, out: Path, partition: int, partitions: int, tasks: int, cfg: MinHashConfig
) -> dict[str, Any]:
    """The verified pairs whose first document's sign task lies in this partition's range."""
    first, stop = task_range(partition, partitions, tasks)
    lo, hi = doc_number(first, 0), doc_number(stop, 0)
    found = []
    for path in sorted(bucket_dir.glob("*.npy")):
        pairs = np.load(path, mmap_mode="r")
        if len(pairs):
            found.append(np.asarray(pairs[np.searchsorted(pairs[:, 0], lo) : np.searchsorted(pairs[:, 0], hi)]))
    pairs = np.concatenate(found) if found else np.zeros((0, 2), np.uint64)
    pairs = np.unique(pairs, axis=0) if len(pairs) else pairs  # a pair found in several bands is verified once
    with Sets(sign_dir, cfg) as sets:
        sims = np.fromiter((sets.similarity(x, y) for x, y in pairs), dtype=np.float64, count=len(pairs))
    keep = sims >= cfg.threshold if cfg.verify else np.ones(len(pairs), dtype=bool)
    edges = pa.table(
        {
            "a": pairs[keep, 0] if len(pairs) else np.zeros(0, np.uint64),
            "b": pairs[keep, 1] if len(pairs) else np.zeros(0, np.uint64),
            "jaccard": sims[keep],
        },
        schema=EDGE_SCHEMA,
    )
    write_atomically(out, lambda p: pq.write_table(edges, p))
    rejected = sims[~keep]
    return {
        "candidates": int(len(pairs)),
        "verified": int(keep.sum()),
        "rejected": int(len(rejected)),
        "max_rejected_jaccard": float(rejected.max()) if len(rejected) else None,
    }


# --- 4. components --------------------------------------------------------------------------------


def components_task(verify_dir: Path, sign_dir: Path, out: Path) -> dict[str, Any]:
    """Cluster the verified pairs; write every clustered document's cluster and keeper, sorted by task."""
    edges = pa.concat_tables(
        [pq.read_table(p, schema=EDGE_SCHEMA) for p in sorted(verify_dir.glob("*.parquet"))]
        or [EDGE_SCHEMA.empty_table()]
    )
    a, b = edges["a"].to_numpy(), edges["b"].to_numpy()
    nodes = np.unique(np.concatenate([a, b]))  # sorted document numbers, so sorted by task then local
    labels = components(np.searchsorted(nodes, a), np.searchsorted(nodes, b), len(nodes))
    # Each node's row (id, rank, preference) from its sign task's table, task by task.
    node_tasks = task_of(nodes).astype(np.int64)
    tables = []
    for task in np.unique(node_tasks):
        locals_ = (nodes[node_tasks == task] & np.uint64(0xFFFF_FFFF)).astype(np.int32)
        table = pq.read_table(sign_dir / f"{task:05d}.docs.parquet", schema=DOCS_SCHEMA)
        table = table.filter(pc.is_in(table["local"], pa.array(locals_)))
        assert table.num_rows == len(locals_), (
            f"sign task {task}: {table.num_rows} rows for {len(locals_)} clustered documents"
        )
        tables.append(table.append_column("task", pa.array(np.full(table.num_rows, task, dtype=np.int32))))
    rows = pa.concat_tables(tables) if tables else DOCS_SCHEMA.append(pa.field("task", pa.int32())).empty_table()
    # ids tie-break by their rank in sorted order: a fixed-width string array would cost the
    # longest id's width for every node
    id_order = np.empty(rows.num_rows, dtype=np.int64)
    id_order[pc.sort_indices(rows["id"]).to_numpy()] = np.arange(rows.num_rows)
    keepers = choose_keepers(labels, rows["rank"].to_numpy(), rows["preference"].to_numpy(), id_order)
    # Clusters are numbered in the order of their keepers' document numbers: the same for any worker count.
    cluster_keepers = np.unique(keepers)
    cluster = np.searchsorted(cluster_keepers, keepers)
    table = pa.table(
        {
            "task": rows["task"],
            "ordinal": rows["ordinal"],
            "doc": nodes,
            "id": rows["id"],
            "cluster": cluster.astype(np.int64),
            "kept": keepers == np.arange(len(nodes)),
            "keeper": nodes[keepers],
            "kept_id": rows["id"].take(pa.array(keepers)),
        },
        schema=ASSIGN_SCHEMA,
    )
    write_atomically(out, lambda p: pq.write_table(table, p, row_group_size=65536))
    sizes = np.bincount(cluster) if len(cluster) else np.zeros(0, np.int64)
    return {
        "edges": int(len(a)),
        "clusters": int(len(cluster_keepers)),
        "clustered_docs": int(len(nodes)),
        "largest_cluster": int(sizes.max()) if len(sizes) else 0,
    }


# --- the decision the write phase applies --------------------------------------------------------

CHAINED = "; below the threshold to the kept copy: joined its cluster through other members"


@dataclass(frozen=True)
class NearDecision:
    """What the write phase does with one clustered document: keep it, or remove it as a near
    duplicate of `kept_id` with the ledger row's value (its Jaccard to the kept copy), threshold and note."""

    cluster: int
    kept: bool
    jaccard_to_kept: float  # 1.0 for the kept copy; exact with verification on, else the signature estimate
    threshold: float
    note: str | None  # None for the kept copy
    kept_id: str


def decide(cluster: int, kept: bool, similarity: float, kept_id: str, cfg: MinHashConfig) -> NearDecision:
    """The rule for one clustered document, given its similarity to its cluster's keeper.

    subtle: with verification on, a removed member may be below the threshold to the kept copy
    when it is above it to another member (clusters are connected components): its note says so.
    Without verification every candidate is a duplicate, so no member is noted as chained."""
    if kept:
        return NearDecision(cluster, True, 1.0, cfg.threshold, None, kept_id)
    note = f"cluster {cluster}" + (CHAINED if cfg.verify and similarity < cfg.threshold else "")
    return NearDecision(cluster, False, similarity, cfg.threshold, note, kept_id)


def decisions_for_task(assign: Path, sign_dir: Path, task: int, cfg: MinHashConfig) -> dict[int, NearDecision]:
    """{ordinal in the filtered shard: its decision} for every clustered document of one task,
    each removed one's Jaccard to its keeper read from the sign files (the keeper's may be in
    any task)."""
    table = pq.read_table(assign, filters=[("task", "=", task)], schema=ASSIGN_SCHEMA)
    decisions: dict[int, NearDecision] = {}
    with Sets(sign_dir, cfg) as sets:
        for ordinal, doc, cluster, kept, keeper, kept_id in zip(
            *(table[c].to_pylist() for c in ("ordinal", "doc", "cluster", "kept", "keeper", "kept_id"))
        ):
            similarity = 1.0 if kept else sets.similarity(int(doc), int(keeper))
            decisions[ordinal] = decide(cluster, kept, similarity, kept_id, cfg)
    return decisions
