"""Exact deduplication of normalized text across all sources, as a hash-partitioned map phase.

Each filter task records, for every document it keeps, the 128-bit xxh3 hash of its folded text
(kiln.curate.dedup.forms: width variants and CJK punctuation folded; ASCII text as it is), the
rank of its source in the priority list, and its id, into one file per partition (the hash's
top bits pick the partition). One task per partition then groups equal hashes and keeps, per
group, the document of the highest-priority source, then the smallest id; the others become
(task, ordinal, kept id) rows that the write phase applies. So no process holds more than one
partition, and the result depends neither on shard order nor on the worker count.
Not handled here: near duplicates (MinHash, a later step).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pydantic import Field

from kiln.core.atomic import write_atomically
from kiln.core.config import Section
from kiln.curate.dedup.forms import folded_utf8

HASH_SCHEMA = pa.schema(
    [
        ("h1", pa.uint64()),
        ("h2", pa.uint64()),
        ("rank", pa.int32()),
        ("source", pa.string()),
        ("id", pa.string()),
        ("task", pa.int32()),
        ("ordinal", pa.int64()),
    ]
)
REMOVAL_SCHEMA = pa.schema(
    [("task", pa.int32()), ("ordinal", pa.int64()), ("id", pa.string()), ("kept_id", pa.string())]
)


class ExactDedupConfig(Section):
    enabled: bool = Field(
        default=True, description="Remove documents whose normalized text equals another's, across all sources."
    )
    source_priority: tuple[str, ...] = Field(
        default=(),
        description=(
            "Sources in order of preference: a duplicate group keeps its copy from the earliest listed source; "
            "unlisted sources come after, alphabetically; ties keep the smallest id."
        ),
    )


def text_hash(text: str) -> tuple[int, int]:
    """The 128-bit xxh3 of the text's dedup key (forms.fold, DEDUP_KEY_VERSION), as two 64-bit halves."""
    data = text.encode("utf-8", "surrogatepass")
    if not text.isascii():  # perf: an ASCII text's key is its bytes; it skips even the call (str.isascii is O(1))
        data = folded_utf8(text, data)
    digest = xxhash.xxh3_128_intdigest(data)
    return digest >> 64, digest & 0xFFFF_FFFF_FFFF_FFFF


def source_rank(source: str, priority: Sequence[str]) -> int:
    """Position in the priority list; unlisted sources share the rank after it (ids then decide)."""
    try:
        return priority.index(source)
    except ValueError:
        return len(priority)


def partition_of(h1: np.ndarray, partitions: int) -> np.ndarray:
    """Partition by the hash's top bits (partitions is a power of two)."""
    bits = partitions.bit_length() - 1
    return (h1 >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(len(h1), dtype=np.int64)


class HashTable:
    """Collects one task's (hash, rank, id, ordinal) rows and writes them split by partition."""

    def __init__(self, task: int, priority: Sequence[str]):
        self.task, self.priority = task, tuple(priority)
        self.h1: list[int] = []
        self.h2: list[int] = []
        self.rank: list[int] = []
        self.sources: list[str] = []
        self.ids: list[str] = []
        self.ordinal: list[int] = []

    def add(self, ordinal: int, doc_id: str, source: str, text: str) -> None:
        h1, h2 = text_hash(text)
        self.h1.append(h1)
        self.h2.append(h2)
        self.rank.append(source_rank(source, self.priority))
        self.sources.append(source)
        self.ids.append(doc_id)
        self.ordinal.append(ordinal)

    def write(self, folder: Path, partitions: int) -> None:
        h1 = np.array(self.h1, dtype=np.uint64)
        part = partition_of(h1, partitions)
        table = pa.table(
            {
                "h1": h1,
                "h2": np.array(self.h2, dtype=np.uint64),
                "rank": np.array(self.rank, dtype=np.int32),
                "source": self.sources,
                "id": self.ids,
                "task": np.full(len(h1), self.task, dtype=np.int32),
                "ordinal": np.array(self.ordinal, dtype=np.int64),
            },
            schema=HASH_SCHEMA,
        )
        for p in range(partitions):
            # one folder per partition: a dedup task lists only its own files, however many tasks there are
            out = partition_dir(folder, p) / f"{self.task:05d}.parquet"
            out.parent.mkdir(exist_ok=True)
            rows = table.filter(pa.array(part == p))
            write_atomically(out, lambda tmp, rows=rows: pq.write_table(rows, tmp))


def partition_dir(folder: Path, partition: int) -> Path:
    return folder / f"p{partition:04d}"


def find_duplicates(table: pa.Table) -> pa.Table:
    """Rows of one partition -> removal rows: every member of an equal-hash group but its keeper."""
    if table.num_rows == 0:
        return REMOVAL_SCHEMA.empty_table()
    h1, h2 = table["h1"].to_numpy(), table["h2"].to_numpy()
    rank, ids = table["rank"].to_numpy(), np.array(table["id"].to_pylist(), dtype=object)
    sources = np.array(table["source"].to_pylist(), dtype=str)
    # lexsort keys go last-to-first: group by (h1, h2), then best rank, then source name (for
    # sources outside the priority list), then smallest id first.
    order = np.lexsort((ids.astype(str), sources, rank, h2, h1))
    h1, h2, ids = h1[order], h2[order], ids[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    keeper_pos = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    dup = ~starts
    return pa.table(
        {
            "task": table["task"].to_numpy()[order][dup],
            "ordinal": table["ordinal"].to_numpy()[order][dup],
            "id": list(ids[dup]),
            "kept_id": list(ids[keeper_pos[dup]]),
        },
        schema=REMOVAL_SCHEMA,
    )


def dedup_partition(folder: Path, partition: int, out: Path) -> int:
    """Read partition `partition` of every task's hash file, write its removal rows; returns their number."""
    files = sorted(partition_dir(folder, partition).glob("*.parquet"))
    table = (
        pa.concat_tables([pq.read_table(f, schema=HASH_SCHEMA) for f in files]) if files else HASH_SCHEMA.empty_table()
    )
    removals = find_duplicates(table)
    write_atomically(out, lambda tmp: pq.write_table(removals, tmp))
    return removals.num_rows


def removals_for_task(folder: Path, task: int) -> dict[int, str]:
    """{ordinal: kept id} of the documents task `task` must drop, from every partition's removals."""
    found: dict[int, str] = {}
    for f in sorted(folder.glob("*.parquet")):
        table = pq.read_table(f, filters=[("task", "=", task)])
        found.update(zip(table["ordinal"].to_pylist(), table["kept_id"].to_pylist()))
    return found
