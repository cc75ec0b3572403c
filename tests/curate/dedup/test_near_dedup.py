"""MinHash near-dedup through the real curate stage (kiln.curate.run.run and `kiln curate`):
planted near-duplicates against a brute-force reference (every pair's exact Jaccard, then a
breadth-first search), the keeper rules across sources, chained clusters, the audit and
--explain, the same output for 1, 2, 4 workers and Ray (and for other internal batch sizes and
bucket-key ranges), and a run killed in the sign phase. Every other filter is off, so only exact
and near dedup decide what is removed."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_curate_run import audit_files, kept

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.manifest import MANIFEST
from kiln.curate import phases
from kiln.curate import run as curate_run
from kiln.curate.config import CurateConfig
from kiln.curate.dedup import minhash, near
from kiln.curate.dedup.minhash import estimated_jaccard, permutation_params, signatures
from kiln.curate.dedup.near import CHAINED, NearDecision, decide
from kiln.curate.explain import explain, explain_many
from kiln.curate.readers import InputConfig
from kiln.curate.run import key_ranges, run
from kiln.text.shingles import shingle_set

FILTERS = (
    "url_filter",
    "line_dedup",
    "language",
    "bad_words",
    "gopher_repetition",
    "gopher_quality",
    "c4",
    "fineweb",
    "code_quality",
    "pii",
    "length",
)
# Letters only: digits would fold to 0 and make words collide. 5000 words, so two random texts
# of a few hundred words share no 5-gram.
_letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
VOCAB = np.array(["".join(np.random.default_rng(i).choice(_letters, size=3 + i % 7)) for i in range(5000)])
EDITS = [
    "replacementword",
    "alternativeterm",
    "substitutedtoken",
    "differentchoice",
    "anotherwordhere",
    "swappedvocabulary",
    "freshlexeme",
    "novelinsertion",
]


def random_text(seed: int, words: int = 300) -> str:
    return " ".join(VOCAB[np.random.default_rng(10_000 + seed).integers(0, len(VOCAB), size=words)])


def edit(text: str, edits: dict[int, str]) -> str:
    """`text` with the word at each position replaced."""
    words = text.split(" ")
    for position, word in edits.items():
        words[position] = word
    return " ".join(words)


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def config(folder: Path, **overrides) -> CurateConfig:
    fields = dict(
        inputs=(InputConfig(path=str(folder)),),
        executor={"workers": 1},
        **{name: {"enabled": False} for name in FILTERS},
    )
    fields.update(overrides)
    return CurateConfig(**fields)


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def brute_jaccard(x: str, y: str, n: int = 5) -> float:
    """Jaccard of the two shingle sets, by Python sets (the reference for minhash.jaccard)."""
    sx, sy = set(shingle_set(x, n).tolist()), set(shingle_set(y, n).tolist())
    return len(sx & sy) / len(sx | sy)


def brute_clusters(texts: dict[str, str], threshold: float) -> list[set[str]]:
    """Clusters of size >= 2 of the graph 'exact Jaccard >= threshold', by breadth-first search."""
    sets = {i: set(shingle_set(t, 5).tolist()) for i, t in texts.items()}
    ids = sorted(i for i in texts if sets[i])
    near = {i: [j for j in ids if j != i and len(sets[i] & sets[j]) / len(sets[i] | sets[j]) >= threshold] for i in ids}
    seen: set[str] = set()
    clusters = []
    for start in ids:
        if start in seen:
            continue
        seen.add(start)
        group, queue = {start}, deque([start])
        while queue:
            for nxt in near[queue.popleft()]:
                if nxt not in seen:
                    seen.add(nxt)
                    group.add(nxt)
                    queue.append(nxt)
        if len(group) > 1:
            clusters.append(group)
    return clusters


# --- a corpus with planted near-duplicates, run once for several tests --------------------------


@dataclass(frozen=True)
class Planted:
    folder: Path
    run_dir: Path
    manifest: dict
    records: dict[str, dict]  # id -> record as written


def planted_corpus(folder: Path) -> dict[str, dict]:
    """16 JSONL files (16 read tasks, so 4 hash partitions), 3 unrelated texts in each, and:
    - x: a text and two one-word edits in other files (a 3-document cluster across tasks);
    - y: a text and a two-word edit in the same file;
    - z: four copies across four files, each with its own one-word edit;
    - e: one text in two files verbatim (exact dedup removes one) and an edit in a third;
    - two texts with no words at all."""
    files: dict[int, list[dict]] = {f: [] for f in range(16)}

    def add(file: int, doc_id: str, text: str, source: str = "web") -> None:
        files[file].append({"id": doc_id, "text": text, "source": source})

    for f in range(16):
        for i in range(3):
            add(f, f"solo-{f:02d}-{i}", random_text(100 * f + i))
    x, y, z, e = (random_text(5000 + k) for k in range(4))
    add(0, "x-base", x)
    add(5, "x-edit1", edit(x, {150: EDITS[0]}))
    add(11, "x-edit2", edit(x, {10: EDITS[1]}))
    add(3, "y-base", y)
    add(3, "y-edit", edit(y, {40: EDITS[2], 200: EDITS[3]}))
    for k, f in enumerate((1, 7, 13, 15)):
        add(f, f"z-{k}", edit(z, {30 * k + 5: EDITS[4 + k]}))
    add(2, "e-copy1", e)
    add(9, "e-copy2", e)
    add(10, "e-edit", edit(e, {299: EDITS[0]}))
    add(4, "punct-1", "!!! ... ??? --- ***")
    add(6, "punct-2", "(( )) [[ ]] ~~ ~~")
    for f, records in files.items():
        write_jsonl(folder / f"part-{f:02d}.jsonl", records)
    return {r["id"]: r for records in files.values() for r in records}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Planted:
    root = tmp_path_factory.mktemp("planted")
    records = planted_corpus(root / "in")
    manifest = run(config(root / "in"), root / "run")
    return Planted(root / "in", root / "run", manifest, records)


def test_planted_clusters_equal_brute_force(planted):
    stage = planted.run_dir / "curate"
    texts = {i: r["text"] for i, r in planted.records.items() if i != "e-copy2"}  # e-copy2 went to exact dedup
    expected = brute_clusters(texts, 0.8)
    assert sorted(map(sorted, expected)) == [
        ["e-copy1", "e-edit"],
        ["x-base", "x-edit1", "x-edit2"],
        ["y-base", "y-edit"],
        ["z-0", "z-1", "z-2", "z-3"],
    ]

    clusters = rows(stage / "clusters.parquet")
    got: dict[int, set[str]] = {}
    for row in clusters:
        got.setdefault(row["cluster"], set()).add(row["id"])
    assert sorted(map(sorted, got.values())) == sorted(map(sorted, expected))
    removed = {r["id"]: r for r in rows(stage / "removed.parquet")}
    for group in expected:
        # one keeper: the longest text (all from one source), then the smallest id
        keeper = min(group, key=lambda i: (-len(texts[i].encode()), i))
        members = [r for r in clusters if r["id"] in group]
        assert [r["id"] for r in members if r["kept"]] == [keeper]
        for r in members:
            # the recorded Jaccard is the exact one, to the kept copy
            assert r["jaccard_to_kept"] == (1.0 if r["kept"] else brute_jaccard(texts[r["id"]], texts[keeper]))
            if not r["kept"]:
                assert r["jaccard_to_kept"] >= 0.8
                assert removed[r["id"]] == {
                    "id": r["id"],
                    "source": "web",
                    "step": "minhash_dedup",
                    "reason": "minhash_dedup:near_duplicate",
                    "value": r["jaccard_to_kept"],
                    "threshold": 0.8,
                    "note": f"cluster {r['cluster']}",
                    "kept_id": keeper,
                }
    assert removed["e-copy2"]["reason"] == "exact_dedup:duplicate" and removed["e-copy2"]["kept_id"] == "e-copy1"
    # everything else is kept, its text unchanged
    docs = kept(stage)
    assert set(docs) == set(planted.records) - set(removed)
    assert all(docs[i] == planted.records[i]["text"] for i in docs)
    # clusters.parquet is ordered by cluster, the keeper first
    assert [(r["cluster"], not r["kept"], r["id"]) for r in clusters] == sorted(
        (r["cluster"], not r["kept"], r["id"]) for r in clusters
    )


def test_accounting_and_manifest_counts(planted):
    stage = planted.run_dir / "curate"
    counts = planted.manifest["counts"]
    clusters = rows(stage / "clusters.parquet")
    near = counts["minhash"]
    assert (
        counts["docs_in"]
        == len(planted.records)
        == counts["docs_out"] + sum(counts["removed"].values()) + counts["quarantined"]
    )
    assert counts["removed"] == {"exact_dedup:duplicate": 1, "minhash_dedup:near_duplicate": 7}
    assert counts["quarantined"] == 0 and counts["docs_out"] == len(kept(stage))
    # documents that survived exact dedup: signed, or without words
    assert near["signed"] + near["no_words"] == len(planted.records) - 1 and near["no_words"] == 2
    assert near["clustered_docs"] == len(clusters) == 11 and near["clusters"] == sum(r["kept"] for r in clusters) == 4
    assert near["largest_cluster"] == 4
    assert near["verified"] <= near["candidates"] <= near["bucket_pairs"]
    assert near["verified"] + near["rejected"] == near["candidates"]
    assert near["verified"] >= near["clustered_docs"] - near["clusters"]  # a spanning forest at least
    assert near["shingles"] == sum(len(shingle_set(r["text"], 5)) for i, r in planted.records.items() if i != "e-copy2")
    web = counts["per_source"]["web"]["funnel"]
    assert web["minhash_dedup"]["docs"] == counts["docs_out"] and web["exact_dedup"]["docs"] == counts["docs_out"] + 7


def test_wordless_documents_pass_untouched(planted):
    docs = kept(planted.run_dir / "curate")
    assert docs["punct-1"] == "!!! ... ??? --- ***" and docs["punct-2"] == "(( )) [[ ]] ~~ ~~"
    assert not {"punct-1", "punct-2"} & {r["id"] for r in rows(planted.run_dir / "curate" / "clusters.parquet")}


def test_explain_shows_the_cluster_of_a_near_duplicate(planted, capsys):
    args = [
        "curate",
        "--recipe",
        "demo",
        "--set",
        f"name={planted.run_dir.name}",
        "--set",
        f"runs_dir={planted.run_dir.parent}",
        "--explain",
    ]
    members = [r for r in rows(planted.run_dir / "curate" / "clusters.parquet") if r["id"].startswith("x-")]
    [keeper] = [r["id"] for r in members if r["kept"]]
    removed = sorted(r["id"] for r in members if not r["kept"])
    text = {i: planted.records[i]["text"] for i in ("x-base", "x-edit1", "x-edit2")}
    capsys.readouterr()
    assert main([*args, removed[0]]) == 0
    out = capsys.readouterr().out
    assert f"{removed[0]} (source web) was removed by step minhash_dedup: minhash_dedup:near_duplicate" in out
    assert (
        f"measured {brute_jaccard(text[removed[0]], text[keeper]):.4g}, threshold 0.8" in out
        and f"kept instead: {keeper}" in out
    )
    lines = out.splitlines()
    at = lines.index(f"  cluster {members[0]['cluster']}: 3 documents (Jaccard of shingle sets to the kept one)")
    assert lines[at + 1].split() == ["kept", keeper, "1.000"]  # the keeper first, then by id
    assert [line.split() for line in lines[at + 2 : at + 4]] == [
        ["removed", i, f"{brute_jaccard(text[i], text[keeper]):.3f}"] for i in removed
    ]
    assert main([*args, keeper]) == 0
    assert "was kept" in capsys.readouterr().out


def test_same_output_for_1_2_4_workers_and_ray(planted, tmp_path, ray_local):
    def outputs(stage: Path) -> tuple:
        return (
            audit_files(stage),
            (stage / "clusters.parquet").read_bytes(),
            json.loads((stage / MANIFEST).read_text())["counts"],
        )

    reference = outputs(planted.run_dir / "curate")
    assert len(reference[0]) > 10 and pq.read_metadata(planted.run_dir / "curate" / "clusters.parquet").num_rows == 11
    for name, executor in (("w2", {"workers": 2}), ("w4", {"workers": 4}), ("ray", {"kind": "ray", "workers": 2})):
        run(config(planted.folder, executor=executor), tmp_path / name)
        assert outputs(tmp_path / name / "curate") == reference, name


def test_batch_sizes_and_key_ranges_do_not_change_the_output(planted, tmp_path, monkeypatch):
    # Inline (1 worker), so the patches reach the tasks: sign batches of 3 documents (two of them
    # hold only a wordless text), 100-shingle signature products, and 4 bucket-key ranges per band.
    monkeypatch.setattr(near, "SIGN_BATCH", 3)
    monkeypatch.setattr(minhash, "BATCH_ROWS", 100)
    monkeypatch.setattr(curate_run, "key_ranges", lambda docs: 4)
    calls = []

    def bucket_task(sign_dir, out, band, sub, subs, cfg):
        calls.append((band, sub, subs))
        return near.bucket_task(sign_dir, out, band, sub, subs, cfg)

    monkeypatch.setattr(phases, "bucket_task", bucket_task)
    manifest = run(config(planted.folder), tmp_path / "run")
    assert sorted(calls) == [(band, sub, 4) for band in range(14) for sub in range(4)]
    stage, reference = tmp_path / "run" / "curate", planted.run_dir / "curate"
    assert audit_files(stage) == audit_files(reference)
    assert (stage / "clusters.parquet").read_bytes() == (reference / "clusters.parquet").read_bytes()
    counts, expected = manifest["counts"]["minhash"], planted.manifest["counts"]["minhash"]
    assert {k: v for k, v in counts.items() if k != "memory_estimate_mb"} == {
        k: v for k, v in expected.items() if k != "memory_estimate_mb"
    }


def test_key_ranges_are_a_power_of_two_sized_by_documents():
    # 16 bytes a document, about 4 copies, 256 MB a bucket task: 4M documents fit one range
    assert [key_ranges(n) for n in (0, 1, 4_000_000, 4_000_001, 8_000_000, 9_000_000, 100_000_000)] == [
        1,
        1,
        1,
        2,
        2,
        4,
        32,
    ]


# --- small corpora, one rule each -------------------------------------------------------------------


def test_identical_documents_go_to_exact_dedup_else_to_minhash_with_jaccard_1(tmp_path):
    text = random_text(1)
    write_jsonl(
        tmp_path / "in" / "a.jsonl",
        [{"id": "b-copy", "text": text, "source": "web"}, {"id": "other", "text": random_text(2), "source": "web"}],
    )
    write_jsonl(tmp_path / "in" / "b.jsonl", [{"id": "a-copy", "text": text, "source": "web"}])
    write_jsonl(
        tmp_path / "in" / "c.jsonl", [{"id": "c-copy", "text": text, "source": "web"}]
    )  # a task left with nothing to sign
    manifest = run(config(tmp_path / "in"), tmp_path / "exact")
    assert sorted(
        (r["id"], r["reason"], r["kept_id"]) for r in rows(tmp_path / "exact" / "curate" / "removed.parquet")
    ) == [
        ("b-copy", "exact_dedup:duplicate", "a-copy"),
        ("c-copy", "exact_dedup:duplicate", "a-copy"),
    ]
    assert (
        rows(tmp_path / "exact" / "curate" / "clusters.parquet") == [] and manifest["counts"]["minhash"]["signed"] == 2
    )

    manifest = run(config(tmp_path / "in", exact_dedup={"enabled": False}), tmp_path / "near")
    removed = sorted(
        (r["id"], r["step"], r["reason"], r["value"], r["threshold"], r["kept_id"])
        for r in rows(tmp_path / "near" / "curate" / "removed.parquet")
    )
    assert removed == [
        (i, "minhash_dedup", "minhash_dedup:near_duplicate", 1.0, 0.8, "a-copy") for i in ("b-copy", "c-copy")
    ]
    clusters = sorted(
        (r["id"], r["kept"], r["jaccard_to_kept"]) for r in rows(tmp_path / "near" / "curate" / "clusters.parquet")
    )
    assert clusters == [("a-copy", True, 1.0), ("b-copy", False, 1.0), ("c-copy", False, 1.0)]
    assert set(kept(tmp_path / "near" / "curate")) == {"a-copy", "other"}
    assert "exact_dedup" not in manifest["counts"]["per_source"]["web"]["funnel"]


def test_unrelated_documents_are_all_kept(tmp_path):
    write_jsonl(
        tmp_path / "in" / "a.jsonl", [{"id": f"d{i}", "text": random_text(i), "source": "web"} for i in range(12)]
    )
    write_jsonl(
        tmp_path / "in" / "b.jsonl",
        [{"id": "dots", "text": "...", "source": "web"}, {"id": "bangs", "text": "!!", "source": "web"}],
    )  # no words in the task
    manifest = run(config(tmp_path / "in"), tmp_path / "run")
    near = manifest["counts"]["minhash"]
    assert (near["signed"], near["no_words"], near["verified"], near["clusters"], near["clustered_docs"]) == (
        12,
        2,
        0,
        0,
        0,
    )
    assert manifest["counts"]["removed"] == {} and len(kept(tmp_path / "run" / "curate")) == 14
    assert rows(tmp_path / "run" / "curate" / "clusters.parquet") == []


def three_copies(folder: Path) -> None:
    """One text in three sources: books the shortest (best score), news 5 words longer (no score),
    web 10 words longer (worst score). Pairwise Jaccard 0.97-0.98; ids sort news < books < web."""
    base, tail = random_text(7), random_text(8, words=10)
    write_jsonl(folder / "books.jsonl", [{"id": "copy-b", "text": base, "source": "books", "meta": {"quality": 0.9}}])
    write_jsonl(
        folder / "news.jsonl", [{"id": "copy-a", "text": base + " " + " ".join(tail.split()[:5]), "source": "news"}]
    )
    write_jsonl(
        folder / "web.jsonl", [{"id": "copy-c", "text": base + " " + tail, "source": "web", "meta": {"quality": 0.2}}]
    )


@pytest.mark.parametrize(
    ("overrides", "keeper"),
    [
        ({}, "copy-c"),  # longest by default
        ({"minhash_dedup": {"prefer": "shortest"}}, "copy-b"),
        ({"minhash_dedup": {"prefer": "none"}}, "copy-a"),  # smallest id
        ({"minhash_dedup": {"prefer": "meta:quality"}}, "copy-b"),  # highest score; the copy without one ranks last
        ({"minhash_dedup": {"source_priority": ["news"]}}, "copy-a"),  # source first, though not the longest
        (
            {"exact_dedup": {"source_priority": ["books", "web"]}},
            "copy-b",
        ),  # exact dedup's priority when minhash has none
        (
            {"exact_dedup": {"source_priority": ["books"]}, "minhash_dedup": {"source_priority": ["web", "books"]}},
            "copy-c",
        ),
        (
            {"minhash_dedup": {"source_priority": ["archive"], "prefer": "shortest"}},
            "copy-b",
        ),  # unlisted sources tie on rank
        (
            {"minhash_dedup": {"source_priority": ["web"], "prefer": "shortest"}},
            "copy-c",
        ),  # the listed source beats the shorter copies
    ],
)
def test_keeper_across_sources(tmp_path, overrides, keeper):
    three_copies(tmp_path / "in")
    run(config(tmp_path / "in", **overrides), tmp_path / "run")
    stage = tmp_path / "run" / "curate"
    assert set(kept(stage)) == {keeper}
    removed = rows(stage / "removed.parquet")
    assert sorted(r["id"] for r in removed) == sorted({"copy-a", "copy-b", "copy-c"} - {keeper})
    assert all(r["kept_id"] == keeper and r["reason"] == "minhash_dedup:near_duplicate" for r in removed)
    assert {r["source"] for r in removed} == {"books", "news", "web"} - {
        {"copy-a": "news", "copy-b": "books", "copy-c": "web"}[keeper]
    }


def chain(folder: Path) -> dict[str, str]:
    """a -> b -> c, three word edits each step, 200 words: 196 shingles, 15 replaced per step.
    J(a, b) = J(b, c) = 181 / 211 = 0.858 (over 0.8), J(a, c) = 166 / 226 = 0.735 (under)."""
    a = random_text(3, words=200)
    b = edit(a, {20: EDITS[0], 60: EDITS[1], 100: EDITS[2]})
    c = edit(b, {140: EDITS[3], 170: EDITS[4], 190: EDITS[5]})
    texts = {"a": a, "b": b, "c": c}
    write_jsonl(folder / "x.jsonl", [{"id": k, "text": v, "source": "web"} for k, v in texts.items()])
    return texts


def test_decide_by_hand():
    # The write phase applies these decisions as given: keeper, removal, value, threshold and note.
    cfg = minhash.MinHashConfig(threshold=0.8)
    assert decide(3, True, 1.0, "a", cfg) == NearDecision(3, True, 1.0, 0.8, None, "a")
    assert decide(3, False, 0.85, "a", cfg) == NearDecision(3, False, 0.85, 0.8, "cluster 3", "a")
    # below the threshold to the keeper: in the cluster through another member, and noted so
    assert decide(3, False, 0.7, "a", cfg) == NearDecision(3, False, 0.7, 0.8, f"cluster 3{CHAINED}", "a")
    # without verification every candidate is a duplicate: an estimate below the threshold is not chaining
    assert decide(3, False, 0.7, "a", minhash.MinHashConfig(threshold=0.8, verify=False)).note == "cluster 3"


def test_chained_cluster_keeps_one_and_notes_the_member_below_threshold(tmp_path):
    texts = chain(tmp_path / "in")
    assert brute_jaccard(texts["a"], texts["b"]) == 181 / 211 and brute_jaccard(texts["b"], texts["c"]) == 181 / 211
    assert brute_jaccard(texts["a"], texts["c"]) == 166 / 226
    # 20 bands of 5 rows: the a-c pair (0.735) almost surely becomes a candidate, and verification rejects it
    manifest = run(config(tmp_path / "in", minhash_dedup={"prefer": "none", "bands": 20, "rows": 5}), tmp_path / "run")
    stage = tmp_path / "run" / "curate"
    clusters = {r["id"]: r for r in rows(stage / "clusters.parquet")}
    assert {i: (r["kept"], r["jaccard_to_kept"]) for i, r in clusters.items()} == {
        "a": (True, 1.0),
        "b": (False, 181 / 211),
        "c": (False, 166 / 226),
    }
    removed = {r["id"]: r for r in rows(stage / "removed.parquet")}
    cluster = clusters["a"]["cluster"]
    assert removed["b"]["note"] == f"cluster {cluster}" and removed["b"]["kept_id"] == "a"
    assert (
        removed["c"]["note"] == f"cluster {cluster}{CHAINED}"
        and removed["c"]["value"] == 166 / 226 < removed["c"]["threshold"] == 0.8
    )
    assert set(kept(stage)) == {"a"}
    near = manifest["counts"]["minhash"]
    assert (near["candidates"], near["verified"], near["rejected"], near["max_rejected_jaccard"]) == (
        3,
        2,
        1,
        166 / 226,
    )


def test_without_verification_every_candidate_is_a_duplicate_at_its_signature_estimate(tmp_path):
    texts = chain(tmp_path / "in")
    cfg = config(tmp_path / "in", minhash_dedup={"prefer": "none", "bands": 20, "rows": 5, "verify": False})
    manifest = run(cfg, tmp_path / "run")
    near = manifest["counts"]["minhash"]
    assert near["candidates"] == near["verified"] == 3 and near["rejected"] == 0
    # the recorded similarity is the signature estimate, computed here from the shingle sets
    a, b = permutation_params(100, cfg.minhash_dedup.seed)
    sigs = dict(zip(texts, signatures([shingle_set(t, 5) for t in texts.values()], a, b)))
    clusters = {r["id"]: r["jaccard_to_kept"] for r in rows(tmp_path / "run" / "curate" / "clusters.parquet")}
    assert clusters == {
        "a": 1.0,
        "b": estimated_jaccard(sigs["b"], sigs["a"]),
        "c": estimated_jaccard(sigs["c"], sigs["a"]),
    }


def test_without_verification_a_direct_candidate_is_not_noted_as_chained(tmp_path):
    chain(tmp_path / "in")
    manifest = run(
        config(tmp_path / "in", minhash_dedup={"prefer": "none", "bands": 20, "rows": 5, "verify": False}),
        tmp_path / "run",
    )
    assert manifest["counts"]["minhash"]["candidates"] == 3  # a-b, b-c and a-c: c is a's candidate itself
    [c] = [r for r in rows(tmp_path / "run" / "curate" / "removed.parquet") if r["id"] == "c"]
    assert c["value"] < 0.8 and c["kept_id"] == "a"
    assert CHAINED not in c["note"]


# --- kill and resume ------------------------------------------------------------------------------


@pytest.mark.slow  # kiln processes started and killed
def test_killed_in_the_sign_phase_resumes_to_the_uninterrupted_result(tmp_path, caplog):
    """SIGKILL a real `kiln curate` after some sign tasks finished, re-run it, compare with a whole run."""
    tasks = 16
    for f in range(tasks):  # 150 texts of 300 words a task: a sign task takes tens of milliseconds
        records = [{"id": f"t{f:02d}-{i:03d}", "text": random_text(1000 * f + i), "source": "web"} for i in range(150)]
        if f % 4 == 1:  # near-duplicates across tasks, so the resumed run has clusters to agree on
            records.append(
                {"id": f"dup-{f:02d}", "text": edit(random_text(999_999), {f: EDITS[f % len(EDITS)]}), "source": "web"}
            )
        write_jsonl(tmp_path / "in" / f"part-{f:02d}.jsonl", records)
    common = [
        "curate",
        "--input",
        str(tmp_path / "in"),
        "--set",
        f"runs_dir={tmp_path / 'runs'}",
        "--set",
        "curate.executor.workers=1",
        *(arg for name in FILTERS for arg in ("--set", f"curate.{name}.enabled=false")),
    ]
    assert main(["-q", *common, "--run", "whole"]) == 0  # the uninterrupted reference, in this process

    stage = tmp_path / "runs" / "cut" / "curate"
    partial = stage.with_name("curate.partial")  # where an unfinished run builds
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "-q", *common, "--run", "cut"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while len(list((partial / "work" / "sign").glob("*.done"))) < 2:
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (stage / MANIFEST).exists()
    signed = len(list((partial / "work" / "sign").glob("*.done")))
    assert 2 <= signed < tasks, f"killed after the sign phase ({signed} of {tasks} sign tasks done)"
    assert not list((partial / "work").glob("buckets/*.done"))

    with caplog.at_level(
        logging.INFO, logger="kiln"
    ):  # resumed in this process (a subprocess costs seconds of imports)
        assert main([*common, "--run", "cut"]) == 0
    for phase, done, total in (
        ("read", tasks, tasks),
        ("filter", tasks, tasks),
        ("dedup", 4, 4),
        ("sign", signed, tasks),
    ):
        assert f"{phase} phase: {done} of {total} tasks already finished, skipped" in caplog.text
    assert "buckets phase:" not in caplog.text  # no bucket task had finished: all run now
    whole = tmp_path / "runs" / "whole" / "curate"
    assert audit_files(stage) == audit_files(whole)
    assert (stage / "clusters.parquet").read_bytes() == (whole / "clusters.parquet").read_bytes()
    counts = json.loads((stage / MANIFEST).read_text())["counts"]
    assert counts == json.loads((whole / MANIFEST).read_text())["counts"]
    assert counts["minhash"]["clustered_docs"] == 4 and counts["removed"] == {"minhash_dedup:near_duplicate": 3}
    ids = [d.id for p in list_shards(stage / "shards") for d in read_shard(p)]
    assert len(ids) == len(set(ids)) == counts["docs_out"] == tasks * 150 + 1


def test_explain_many_answers_like_explain_from_one_reading(planted):
    stage = planted.run_dir / "curate"
    members = [r for r in rows(stage / "clusters.parquet") if r["id"].startswith("x-")]
    [keeper] = [r["id"] for r in members if r["kept"]]
    removed = sorted(r["id"] for r in members if not r["kept"])
    found = explain_many(stage, [*removed, keeper, "nope"])
    assert set(found) == {*removed, keeper}  # an id the audit files do not know is left to explain()
    assert all(found[i] == explain(stage, i) for i in removed)
    assert found[keeper].startswith(
        f"{keeper} was kept: its near-duplicate cluster keeps it\n  cluster {members[0]['cluster']}: 3 documents"
    )
