"""Exact deduplication by a 128-bit hash of the normalized text, across all sources.

Shard tasks hash each kept document; this module picks, per hash, the document to keep: the
smallest id, so the result depends neither on shard order nor on the worker count. At 16 bytes
per document plus its id the table fits in memory far past the demo's size; corpus-scale
near-dedup (hash-partitioned files, MinHash) is kiln.curate.dedup's later work.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

REASON = "exact_dedup:duplicate"


def text_hash(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def find_duplicates(entries: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(hash, doc id) pairs -> {removed id: kept id}, keeping the smallest id of each hash."""
    keeper: dict[str, str] = {}
    removed: dict[str, str] = {}
    for digest, doc_id in sorted(entries, key=lambda e: e[1]):
        if digest in keeper:
            removed[doc_id] = keeper[digest]
        else:
            keeper[digest] = doc_id
    return removed
