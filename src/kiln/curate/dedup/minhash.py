"""MinHash near-duplicate detection: signatures, LSH bands, candidate pairs, Jaccard, clusters.

The math of near-dedup, on numpy arrays; kiln.curate.dedup.near runs it as map phases over files.
- Signature: for each of `bands * rows` permutations k, the minimum over a document's shingle
  hashes of (a_k * x + b_k) mod 2^32 (a_k odd), where x is the top 32 bits of the shingle's
  64-bit hash. The shingle hashes are already mixed values, so this multiply-add family behaves
  as a min-wise hash here; tests check that signature agreement tracks the true Jaccard with
  binomial spread (as the 64-bit products did: same bias and spread on random sets at Jaccard
  0.5-0.9, at half the memory traffic). Computed for many documents at once: one (permutations
  x shingles) product, then a segmented minimum (np.minimum.reduceat).
- Bands: the signature splits into `bands` runs of `rows` values; each run hashes to a 64-bit
  bucket key. Two documents sharing any band's key are a candidate pair. The chance that a pair
  of Jaccard s becomes a candidate is 1 - (1 - s^rows)^bands (the S-curve).
- Verification: the exact Jaccard of two documents' shingle sets (sorted uint64 arrays).
- Clusters: connected components of the verified pairs (union-find by hooking roots onto the
  smaller root and pointer jumping, all in numpy), then one keeper per cluster: best source
  rank, then the preference value (smaller is better: minus the length for `longest`), then the
  smallest id.
Not handled here: reading documents, files and phases (kiln.curate.dedup.near).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.text.shingles import MAX_N, MULTIPLIERS, mix64

PROCESS_BASE_MB = 120  # a worker before any data: Python, numpy, pyarrow (measured: 100-110 MB RSS)
BATCH_ROWS = 8192  # shingles per (permutations x shingles) product: 112 x 8192 x 8 B = 7 MB


class MinHashConfig(Section):
    NOT_HASHED = frozenset()
    enabled: bool = Field(
        default=True, description="Remove near-duplicates (MinHash LSH), across all sources, after exact dedup."
    )
    ngram: int = Field(default=5, ge=1, le=MAX_N, description="Shingle size in normalized words (FineWeb: 5).")
    bands: int = Field(default=14, ge=1, description="LSH bands (FineWeb: 14 bands of 8 rows, 112 permutations).")
    rows: int = Field(default=8, ge=1, description="Signature values per band; bands x rows permutations in all.")
    threshold: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Jaccard similarity of shingle sets at or above which two documents are near-duplicates.",
    )
    verify: bool = Field(
        default=True,
        description=(
            "Check every candidate pair's exact Jaccard against the threshold (rejects LSH false positives; stores "
            "shingle sets on disk, 8 bytes per shingle). Off: every candidate pair is a duplicate."
        ),
    )
    seed: int = Field(
        default=1, ge=0, description="Seed of the permutations; changing it changes which pairs LSH proposes."
    )
    fold_digits: bool = Field(
        default=True,
        description=(
            "Fold every digit to 0 before shingling, so documents differing only in numbers are near-duplicates."
        ),
    )
    source_priority: tuple[str, ...] | None = Field(
        default=None,
        description=(
            "Sources in order of preference for the kept copy of a cluster; None uses exact_dedup.source_priority."
        ),
    )
    prefer: str = Field(
        default="longest",
        description=(
            "After source priority, which copy to keep: longest, shortest, none (smallest id), or meta:FIELD (highest "
            "numeric meta value, e.g. a quality score; missing counts lowest)."
        ),
    )
    max_bucket_pairs: int = Field(
        default=32,
        ge=2,
        description=(
            "A bucket with up to this many documents proposes all its pairs; a bigger one links each member to the "
            "first and to the next (fewer verifications; a pair of members linked only through rejected links is "
            "missed)."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> MinHashConfig:
        if self.prefer not in ("longest", "shortest", "none") and not (
            self.prefer.startswith("meta:") and len(self.prefer) > 5
        ):
            raise ValueError(f"prefer={self.prefer!r}: use longest, shortest, none or meta:FIELD")
        return self

    @property
    def permutations(self) -> int:
        return self.bands * self.rows


def s_curve(similarity: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """Probability that a pair with this Jaccard shares at least one band: 1 - (1 - s^r)^b."""
    return 1 - (1 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


def permutation_params(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of the `count` permutations as uint32: a odd, both uniform."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**31, size=count, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = rng.integers(0, 2**32, size=count, dtype=np.uint32)
    return a, b


def signatures(sets: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(documents, permutations) uint32 signatures of non-empty shingle sets."""
    lengths = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    values = np.concatenate(sets) if sets else np.zeros(0, np.uint64)
    return signatures_flat(values, np.concatenate(([0], np.cumsum(lengths))), a, b)


def signatures_flat(values: np.ndarray, offsets: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """signatures() of the sets values[offsets[i]:offsets[i + 1]], without splitting them apart."""
    docs = len(offsets) - 1
    assert docs == 0 or np.diff(offsets).min() > 0, "empty shingle sets have no signature"
    keys = (values >> np.uint64(32)).astype(np.uint32)
    out = np.empty((docs, len(a)), dtype=np.uint32)
    i = 0
    while i < docs:
        # Batch documents until BATCH_ROWS shingles; a bigger document is a batch of its own,
        # reduced chunk by chunk.
        j = max(i + 1, int(np.searchsorted(offsets, offsets[i] + BATCH_ROWS, side="right")) - 1)
        if offsets[j] - offsets[i] > BATCH_ROWS:
            out[i] = _signature_of_large(keys[offsets[i] : offsets[j]], a, b)
        else:
            # perf: (permutations, rows) with the segmented minimum along the contiguous axis is
            # 3x faster than (rows, permutations) here; 32-bit products halve it again (0.44 vs
            # 0.89 ms for 8192 x 112 with 64-bit ones).
            products = np.multiply.outer(a, keys[offsets[i] : offsets[j]])  # wraps mod 2^32, as intended
            products += b[:, None]
            out[i:j] = np.minimum.reduceat(products, offsets[i:j] - offsets[i], axis=1).T
        i = j
    return out


def _signature_of_large(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    best = np.full(len(a), np.iinfo(np.uint32).max, dtype=np.uint32)
    for start in range(0, len(x), BATCH_ROWS):
        products = np.multiply.outer(x[start : start + BATCH_ROWS], a)
        products += b
        np.minimum(best, products.min(axis=0), out=best)
    return best


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) uint64 bucket keys: each band's `rows` values (and the band's number) hashed."""
    values = sigs[:, : bands * rows].reshape(len(sigs), bands, rows).astype(np.uint64)
    acc = np.broadcast_to(np.arange(bands, dtype=np.uint64) * MULTIPLIERS[rows], (len(sigs), bands)).copy()
    for r in range(rows):
        acc += values[:, :, r] * MULTIPLIERS[r]
    return mix64(acc)


def bucket_pairs(keys: np.ndarray, docs: np.ndarray, max_bucket_pairs: int) -> np.ndarray:
    """Candidate pairs (a < b, as an (n, 2) uint64 array, unsorted, maybe repeated) from documents
    and their keys in one band: all pairs within a bucket of at most `max_bucket_pairs` members,
    each member with the first and the next in a bigger one."""
    if len(keys) < 2:
        return np.zeros((0, 2), dtype=np.uint64)
    order = np.lexsort((docs, keys))
    keys, docs = keys[order], docs[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    sizes = np.diff(np.append(starts, len(keys)))
    pairs = [np.stack([docs[starts[sizes == 2]], docs[starts[sizes == 2] + 1]], axis=1)]  # the common case, vectorized
    for start, size in zip(starts[sizes > 2], sizes[sizes > 2]):
        members = docs[start : start + size]
        if size <= max_bucket_pairs:
            i, j = np.triu_indices(size, k=1)
            pairs.append(np.stack([members[i], members[j]], axis=1))
        else:
            first = np.stack([np.full(size - 1, members[0]), members[1:]], axis=1)
            chain = np.stack([members[1:-1], members[2:]], axis=1)
            pairs += [first, chain]
    return np.concatenate(pairs).astype(np.uint64)  # members are sorted within a bucket, so a < b


def jaccard(x: np.ndarray, y: np.ndarray) -> float:
    """Exact Jaccard of two sorted sets of distinct hashes."""
    if len(x) > len(y):
        x, y = y, x
    if len(x) == 0:
        return 0.0
    at = np.searchsorted(y, x)
    at[at == len(y)] = 0
    inter = int(np.count_nonzero(y[at] == x))
    return inter / (len(x) + len(y) - inter)


def estimated_jaccard(sig_x: np.ndarray, sig_y: np.ndarray) -> float:
    """Fraction of agreeing signature values: MinHash's estimate of the Jaccard."""
    return float(np.count_nonzero(sig_x == sig_y)) / len(sig_x)


def components(a: np.ndarray, b: np.ndarray, nodes: int) -> np.ndarray:
    """Connected components of an undirected graph on nodes 0..nodes-1: each node's label is the
    smallest node of its component."""
    parent = np.arange(nodes, dtype=np.int64)
    a, b = a.astype(np.int64), b.astype(np.int64)
    while True:
        ra, rb = parent[a], parent[b]
        differ = ra != rb
        if not differ.any():
            return parent
        lo, hi = np.minimum(ra[differ], rb[differ]), np.maximum(ra[differ], rb[differ])
        # subtle: hi and lo are roots (parent is fully compressed below), and lo < hi, so hooking
        # hi onto the smallest lo it meets can never make a cycle.
        np.minimum.at(parent, hi, lo)
        while True:  # pointer jumping until every node points at its root
            jumped = parent[parent]
            if np.array_equal(jumped, parent):
                break
            parent = jumped


def choose_keepers(labels: np.ndarray, rank: np.ndarray, preference: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Index of each node's cluster keeper: smallest (rank, preference, id) within its label; `ids`
    may be the ids themselves or their ranks in sorted order."""
    if len(labels) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((ids, preference, rank, labels))
    sorted_labels = labels[order]
    first = np.concatenate(([True], sorted_labels[1:] != sorted_labels[:-1]))
    keeper_of_group = order[first]
    group = np.cumsum(first) - 1
    keepers = np.empty(len(labels), dtype=np.int64)
    keepers[order] = keeper_of_group[group]
    return keepers


def preference_value(prefer: str, nbytes: int, meta: dict) -> float:
    """The keeper rule's value for one document; smaller is preferred."""
    if prefer == "longest":
        return -float(nbytes)
    if prefer == "shortest":
        return float(nbytes)
    if prefer == "none":
        return 0.0
    value = meta.get(prefer.removeprefix("meta:"))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.inf  # a missing or non-numeric score ranks last
    return -number if math.isfinite(number) else math.inf


def memory_estimate(
    docs: int, tasks: int, bucket_tasks: int, verify_tasks: int, cfg: MinHashConfig
) -> dict[str, float]:
    """Peak memory per process (MB) of each near-dedup phase, for `docs` documents split into
    `tasks` sign tasks, `bucket_tasks` bucket tasks and `verify_tasks` verify tasks, a worker's
    base included.
    The candidate count is bounded by one pair per document per band (a document's duplicates
    in a band chain through one bucket)."""
    mb = 1e6
    base = PROCESS_BASE_MB
    per_task_docs = docs / max(tasks, 1)
    batch = BATCH_ROWS * cfg.permutations * 8 * 2 / mb  # the product and its reduction
    sign = batch + per_task_docs * (cfg.bands * 16 * 2 + 4 * cfg.permutations + 120) / mb
    buckets = docs * cfg.bands / max(bucket_tasks, 1) * 16 * 4 / mb  # keys and docs, sorted copies, pairs
    candidates = docs * cfg.bands  # upper bound
    verify = candidates / max(verify_tasks, 1) * 16 * 3 / mb  # pairs; sets are read two at a time
    components_mb = (
        candidates * 8 * 6 / mb
    )  # edges, node ids, labels: an upper bound; near-duplicate-free corpora need far less
    return {"sign": base + sign, "buckets": base + buckets, "verify": base + verify, "components": base + components_mb}
