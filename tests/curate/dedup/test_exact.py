"""kiln.curate.dedup.exact: groups by hash, keeps by source priority then smallest id, partition by partition."""

from __future__ import annotations

import pyarrow.parquet as pq

from kiln.curate.dedup.exact import (
    HashTable,
    dedup_partition,
    find_duplicates,
    partition_dir,
    removals_for_task,
    source_rank,
    text_hash,
)


def table_of(rows, priority=(), task=0):
    t = HashTable(task, priority)
    for ordinal, (doc_id, source, text) in enumerate(rows):
        t.add(ordinal, doc_id, source, text)
    return t


def run_partitions(tables, folder, partitions):
    filt, dedup = folder / "filter", folder / "dedup"
    filt.mkdir()
    dedup.mkdir()
    for t in tables:
        t.write(filt, partitions)
    return sum(dedup_partition(filt, p, dedup / f"{p:05d}.parquet") for p in range(partitions)), dedup


def test_text_hash_is_128_bits_in_two_words():
    h1, h2 = text_hash("abc")
    assert 0 <= h1 < 2**64 and 0 <= h2 < 2**64 and text_hash("abc") == (h1, h2) and text_hash("abd") != (h1, h2)


def test_source_rank():
    assert [source_rank(s, ("books", "web")) for s in ("books", "web", "code")] == [0, 1, 2]


def test_keeps_priority_source_then_smallest_id(tmp_path):
    rows = [
        ("web/b", "web", "same"),
        ("books/z", "books", "same"),
        ("web/a", "web", "same"),
        ("web/c", "web", "other"),
        ("code/x", "code", "solo"),
    ]
    removed = find_duplicates(pq.read_table(_write(table_of(rows, ("books",)), tmp_path)))
    assert sorted(zip(removed["id"].to_pylist(), removed["kept_id"].to_pylist())) == [
        ("web/a", "books/z"),
        ("web/b", "books/z"),
    ]
    # without a priority, the smallest source name wins, then the smallest id
    removed = find_duplicates(pq.read_table(_write(table_of(rows), tmp_path)))
    assert sorted(zip(removed["id"].to_pylist(), removed["kept_id"].to_pylist())) == [
        ("web/a", "books/z"),
        ("web/b", "books/z"),
    ]
    removed = find_duplicates(pq.read_table(_write(table_of(rows, ("web",)), tmp_path)))
    assert sorted(zip(removed["id"].to_pylist(), removed["kept_id"].to_pylist())) == [
        ("books/z", "web/a"),
        ("web/b", "web/a"),
    ]


def _write(table: HashTable, folder):
    for f in folder.rglob("*.parquet"):
        f.unlink()
    table.write(folder, 1)
    return partition_dir(folder, 0) / f"{table.task:05d}.parquet"


def test_partitions_give_the_same_removals_as_one(tmp_path):
    texts = [f"text {i % 37}" for i in range(300)]
    tables = [table_of([(f"s/{t}-{i}", "s", text) for i, text in enumerate(texts[t::3])], task=t) for t in range(3)]
    results = []
    for partitions in (1, 4, 16):
        folder = tmp_path / f"p{partitions}"
        folder.mkdir()
        n, dedup = run_partitions(tables, folder, partitions)
        assert n == 300 - 37
        results.append({t: removals_for_task(dedup, t) for t in range(3)})
    assert results[0] == results[1] == results[2]
    # every text keeps exactly its smallest id
    kept = {texts[t::3][i] for t in range(3) for i in range(len(texts[t::3])) if i not in results[0][t]}
    assert len(kept) == 37
