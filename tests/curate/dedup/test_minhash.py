"""kiln.curate.dedup.minhash: signatures against the true Jaccard, LSH bands and buckets, exact
Jaccard against Python sets, components against a breadth-first search, and the keeper rules.
Each function has one example worked by hand."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.curate.dedup import minhash
from kiln.curate.dedup.minhash import (
    BATCH_ROWS,
    MinHashConfig,
    band_keys,
    bucket_pairs,
    choose_keepers,
    components,
    estimated_jaccard,
    jaccard,
    memory_estimate,
    permutation_params,
    preference_value,
    s_curve,
    signatures,
)
from kiln.text.shingles import shingle_set

U64_MAX = 2**64 - 1


def random_hashes(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` distinct uniform 64-bit values (what shingle hashes look like), sorted."""
    values = np.unique(rng.integers(0, U64_MAX, size=count, dtype=np.uint64, endpoint=True))
    assert len(values) == count  # a 64-bit collision among a few thousand values: never in practice
    return values


def pair_with_jaccard(rng: np.random.Generator, union: int, shared: int) -> tuple[np.ndarray, np.ndarray]:
    """Two sets over `union` values sharing `shared` of them, split evenly: Jaccard shared / union."""
    values = rng.permutation(random_hashes(rng, union))
    rest = values[shared:]
    half = len(rest) // 2
    return np.sort(np.concatenate([values[:shared], rest[:half]])), np.sort(
        np.concatenate([values[:shared], rest[half:]])
    )


def reference_signature(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The definition, in Python integers: min over x of (a * (x >> 32) + b) mod 2^32."""
    return np.array(
        [min((int(ak) * (int(v) >> 32) + int(bk)) % 2**32 for v in x) for ak, bk in zip(a, b)], dtype=np.uint32
    )


# --- signatures -----------------------------------------------------------------------------------


def test_signature_hand_worked():
    # a = (1, 3), b = (0, 5); the keys are the top 32 bits of x = (7 * 2^32 + 9, 2 * 2^32): 7 and 2
    #   permutation 0: 7, 2 -> 2
    #   permutation 1: 3 * 7 + 5 = 26, 3 * 2 + 5 = 11 -> 11
    a, b = np.array([1, 3], dtype=np.uint32), np.array([0, 5], dtype=np.uint32)
    x = np.array([2 * 2**32, 7 * 2**32 + 9], dtype=np.uint64)
    assert signatures([x], a, b).tolist() == [[2, 11]]
    # the products wrap mod 2^32: with b = 2^32 - 2, key 2 maps to 0 and key 4 to 2
    a, b = np.array([1], dtype=np.uint32), np.array([2**32 - 2], dtype=np.uint32)
    assert signatures([np.array([4 * 2**32], dtype=np.uint64)], a, b).tolist() == [[2]]
    assert signatures([np.array([2 * 2**32, 4 * 2**32], dtype=np.uint64)], a, b).tolist() == [[0]]
    # a = 3, key 2^31 + 1: 3 * 2^31 + 3 wraps to 2^31 + 3
    a, b = np.array([3], dtype=np.uint32), np.array([0], dtype=np.uint32)
    assert signatures([np.array([(2**31 + 1) << 32], dtype=np.uint64)], a, b).tolist() == [[2**31 + 3]]


def test_permutation_params_are_odd_and_seeded():
    a, b = permutation_params(112, seed=1)
    assert a.dtype == b.dtype == np.uint32 and len(a) == len(b) == 112
    assert np.all(a % np.uint32(2) == 1)
    again, _ = permutation_params(112, seed=1)
    other, _ = permutation_params(112, seed=2)
    assert np.array_equal(a, again) and not np.array_equal(a, other)
    assert len(np.unique(a)) == 112


def test_signature_agreement_tracks_true_jaccard():
    rng = np.random.default_rng(7)
    a, b = permutation_params(112, seed=1)
    truth, sets = [], []
    for _ in range(300):
        union = int(rng.integers(60, 400))
        shared = int(rng.integers(0, union + 1))
        x, y = pair_with_jaccard(rng, union, shared)
        assert jaccard(x, y) == shared / union
        truth.append(shared / union)
        sets += [x, y]
    sigs = signatures(sets, a, b)
    estimate = np.array([estimated_jaccard(sigs[2 * i], sigs[2 * i + 1]) for i in range(len(truth))])
    truth_arr = np.array(truth)
    error = estimate - truth_arr
    assert abs(error.mean()) < 0.01  # unbiased: 300 pairs, standard error of the mean about 0.003
    # each estimate is a binomial fraction over 112 independent permutations: its mean squared
    # error should be J (1 - J) / 112; correlated permutations would inflate it
    ratio = np.mean(error**2) / np.mean(truth_arr * (1 - truth_arr) / 112)
    assert 0.7 < ratio < 1.5, ratio  # seeds 0-4 give 0.94-1.22; duplicated permutations would give about 2


def test_identical_sets_give_identical_signatures_in_any_order():
    rng = np.random.default_rng(3)
    a, b = permutation_params(112, seed=5)
    x = random_hashes(rng, 500)
    sigs = signatures([x, x.copy(), rng.permutation(x)], a, b)
    assert np.array_equal(sigs[0], sigs[1]) and np.array_equal(sigs[0], sigs[2])
    assert estimated_jaccard(sigs[0], sigs[1]) == 1.0
    assert sigs.dtype == np.uint32 and sigs.shape == (3, 112)


def test_batched_signatures_equal_one_by_one_and_the_definition():
    rng = np.random.default_rng(11)
    a, b = permutation_params(40, seed=3)
    sizes = [3, BATCH_ROWS + 808, 1, BATCH_ROWS, 50, 2 * BATCH_ROWS + 5, BATCH_ROWS - 1, 2]
    sets = [random_hashes(rng, n) for n in sizes]
    batched = signatures(sets, a, b)
    one_by_one = np.vstack([signatures([s], a, b) for s in sets])
    assert np.array_equal(batched, one_by_one)
    assert np.array_equal(batched, np.vstack([reference_signature(s, a, b) for s in sets]))


def test_batch_boundaries_do_not_change_signatures(monkeypatch):
    # a tiny batch size: every way a batch can end (exactly full, overfull, one huge set) occurs
    monkeypatch.setattr(minhash, "BATCH_ROWS", 5)
    rng = np.random.default_rng(12)
    a, b = permutation_params(16, seed=9)
    sets = [random_hashes(rng, int(n)) for n in rng.integers(1, 13, size=60)]
    assert np.array_equal(signatures(sets, a, b), np.vstack([reference_signature(s, a, b) for s in sets]))


def test_real_text_signature_estimates_its_jaccard():
    words = [f"w{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}{chr(97 + i // 676)}" for i in range(400)]
    original = " ".join(words)
    edited = " ".join(w if i % 40 else "changed" for i, w in enumerate(words))  # words 0, 40, ..., 360
    x, y = shingle_set(original, 5), shingle_set(edited, 5)
    # 396 five-word shingles each; word 0 lies in 1 of them, each other edited word in 5:
    # 46 shingles replaced by 46 new (distinct) ones -> (396 - 46) / (396 + 46)
    true = jaccard(x, y)
    assert len(x) == len(y) == 396 and true == 350 / 442
    a, b = permutation_params(112, seed=1)
    sigs = signatures([x, y], a, b)
    assert abs(estimated_jaccard(sigs[0], sigs[1]) - true) < 4 * math.sqrt(true * (1 - true) / 112)


# --- bands and buckets ----------------------------------------------------------------------------


def test_band_keys_are_equal_exactly_when_band_values_are():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**32, size=(1, 12), dtype=np.uint64).astype(np.uint32)
    changed = base.copy()
    changed[0, 5] ^= 1  # band 1 of (4 bands x 3 rows)
    swapped = base.copy()
    swapped[0, [3, 4]] = swapped[0, [4, 3]]  # band 1's values in another order
    keys = band_keys(np.vstack([base, changed, swapped]), bands=4, rows=3)
    assert keys.shape == (3, 4) and keys.dtype == np.uint64
    assert (keys[0] == keys[1]).tolist() == [True, False, True, True]
    assert (keys[0] == keys[2]).tolist() == [True, False, True, True]  # order within a band matters
    # the same values in two bands give two keys: the band's number is part of the key
    same = np.tile(np.array([[1, 2, 3]], dtype=np.uint32), (1, 4))
    assert len(np.unique(band_keys(same, bands=4, rows=3))) == 4
    # columns past bands x rows are ignored
    longer = np.hstack([base, np.array([[99]], dtype=np.uint32)])
    assert np.array_equal(band_keys(longer, 4, 3), keys[:1])


def test_band_keys_collide_only_on_equal_values_exhaustively():
    # values in {0, 1, 2}, 2 rows a band: many equal bands and every kind of near miss
    rng = np.random.default_rng(4)
    sigs = rng.integers(0, 3, size=(60, 6)).astype(np.uint32)
    keys = band_keys(sigs, bands=3, rows=2)
    values = sigs.reshape(60, 3, 2)
    for band in range(3):
        same_values = (values[:, None, band, :] == values[None, :, band, :]).all(axis=2)
        assert np.array_equal(keys[:, None, band] == keys[None, :, band], same_values)


def as_pairs(array: np.ndarray) -> set[tuple[int, int]]:
    return {(int(x), int(y)) for x, y in array}


def test_bucket_pairs_hand_worked():
    keys = np.array([7, 7, 9, 5, 5, 5, 3], dtype=np.uint64)
    docs = np.array([10, 2, 4, 8, 6, 1, 11], dtype=np.uint64)
    # bucket 7 = {2, 10}: one pair; bucket 5 = {1, 6, 8}: all three pairs; 9 and 3 alone: none
    got = bucket_pairs(keys, docs, max_bucket_pairs=32)
    assert got.dtype == np.uint64 and got.shape == (4, 2)
    assert as_pairs(got) == {(2, 10), (1, 6), (1, 8), (6, 8)}


def test_big_bucket_links_first_and_next():
    keys = np.full(5, 42, dtype=np.uint64)
    docs = np.array([50, 40, 30, 20, 10], dtype=np.uint64)
    # five members over max_bucket_pairs=4: each to the first (10) and to the next in order
    first_and_chain = {(10, 20), (10, 30), (10, 40), (10, 50), (20, 30), (30, 40), (40, 50)}
    got = bucket_pairs(keys, docs, max_bucket_pairs=4)
    assert len(got) == 7 and as_pairs(got) == first_and_chain
    # at the limit (5 <= 5), all 10 pairs
    assert as_pairs(bucket_pairs(keys, docs, max_bucket_pairs=5)) == {
        (x, y) for x in (10, 20, 30, 40, 50) for y in (10, 20, 30, 40, 50) if x < y
    }


def test_bucket_pairs_of_fewer_than_two_documents():
    for n in (0, 1):
        got = bucket_pairs(np.zeros(n, np.uint64), np.arange(n, dtype=np.uint64), 32)
        assert got.shape == (0, 2) and got.dtype == np.uint64
    assert len(bucket_pairs(np.array([1, 2, 3], np.uint64), np.array([0, 1, 2], np.uint64), 32)) == 0


def bfs_labels(edges: list[tuple[int, int]], nodes: int) -> list[int]:
    """Each node's smallest connected node, by breadth-first search."""
    neighbours: list[list[int]] = [[] for _ in range(nodes)]
    for x, y in edges:
        neighbours[x].append(y)
        neighbours[y].append(x)
    labels = [-1] * nodes
    for start in range(nodes):  # in increasing order, so a component's first node is its smallest
        if labels[start] >= 0:
            continue
        labels[start], queue = start, deque([start])
        while queue:
            for nxt in neighbours[queue.popleft()]:
                if labels[nxt] < 0:
                    labels[nxt] = start
                    queue.append(nxt)
    return labels


@settings(max_examples=150, deadline=None)
@given(
    members=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 2**64 - 1)), max_size=60, unique_by=lambda m: m[1]),
    limit=st.integers(2, 6),
)
def test_bucket_pairs_connect_each_bucket_and_nothing_else(members, limit):
    keys = np.array([k for k, _ in members], dtype=np.uint64)
    docs = np.array([d for _, d in members], dtype=np.uint64)
    pairs = bucket_pairs(keys, docs, limit)
    key_of = dict(zip(docs.tolist(), keys.tolist()))
    assert all(x < y and key_of[x] == key_of[y] for x, y in pairs.tolist())
    # the pairs connect every bucket into one component, and a small bucket into a clique
    index = {d: i for i, d in enumerate(docs.tolist())}
    labels = bfs_labels([(index[x], index[y]) for x, y in pairs.tolist()], len(docs))
    assert all((labels[i] == labels[j]) == (keys[i] == keys[j]) for i in range(len(docs)) for j in range(len(docs)))
    sizes = {k: int((keys == k).sum()) for k in set(keys.tolist())}
    expected_small = {
        (min(x, y), max(x, y))
        for x in docs.tolist()
        for y in docs.tolist()
        if x != y and key_of[x] == key_of[y] and sizes[key_of[x]] <= limit
    }
    assert {p for p in as_pairs(pairs) if sizes[key_of[p[0]]] <= limit} == expected_small


def test_lsh_candidate_rate_follows_the_s_curve():
    # 400 pairs of Jaccard exactly 0.8 and 400 of 0.5: the fraction sharing a band key
    rng = np.random.default_rng(21)
    a, b = permutation_params(112, seed=1)
    for similarity, shared, union in ((0.8, 200, 250), (0.5, 100, 200)):
        sets = [s for _ in range(400) for s in pair_with_jaccard(rng, union, shared)]
        keys = band_keys(signatures(sets, a, b), 14, 8)
        found = np.mean([(keys[2 * i] == keys[2 * i + 1]).any() for i in range(400)])
        expected = s_curve(similarity, 14, 8)
        assert abs(found - expected) < 4 * math.sqrt(expected * (1 - expected) / 400), (similarity, found, expected)


# --- Jaccard --------------------------------------------------------------------------------------


def u64(values) -> np.ndarray:
    return np.array(sorted(values), dtype=np.uint64)


def test_jaccard_hand_worked():
    # {1, 2, 3, 4} and {3, 4, 5}: 2 shared of 5 -> 0.4
    assert jaccard(u64([1, 2, 3, 4]), u64([3, 4, 5])) == 0.4
    assert jaccard(u64([3, 4, 5]), u64([1, 2, 3, 4])) == 0.4
    assert jaccard(u64([10, 11]), u64([1, 2])) == 0.0  # every value past the other's end
    assert jaccard(u64([]), u64([1])) == 0.0 and jaccard(u64([]), u64([])) == 0.0
    assert jaccard(u64([U64_MAX]), u64([0, U64_MAX])) == 0.5


@settings(max_examples=300, deadline=None)
@given(
    x=st.sets(st.integers(0, U64_MAX), max_size=40),
    y=st.sets(st.integers(0, U64_MAX), max_size=40),
    shared=st.sets(st.integers(0, U64_MAX), max_size=20),
)
def test_jaccard_equals_python_sets(x, y, shared):
    x, y = x | shared, y | shared
    expected = len(x & y) / len(x | y) if x | y else 0.0
    assert jaccard(u64(x), u64(y)) == expected


def test_estimated_jaccard_counts_agreeing_values():
    assert estimated_jaccard(np.array([1, 2, 3, 4], np.uint32), np.array([1, 0, 3, 0], np.uint32)) == 0.5


# --- components and keepers -------------------------------------------------------------------------


def test_components_hand_worked():
    # edges 5-3, 3-1 (a chain reaching 1 through 3), 6-7; nodes 0, 2 and 4 alone
    a, b = np.array([5, 3, 6], dtype=np.uint64), np.array([3, 1, 7], dtype=np.uint64)
    assert components(a, b, 8).tolist() == [0, 1, 2, 1, 4, 1, 6, 6]
    assert components(np.zeros(0, np.uint64), np.zeros(0, np.uint64), 3).tolist() == [0, 1, 2]


def test_components_of_a_long_shuffled_path():
    rng = np.random.default_rng(2)
    order = rng.permutation(500)
    edges = rng.permutation(np.stack([order[:-1], order[1:]], axis=1))
    assert np.all(components(edges[:, 0], edges[:, 1], 500) == 0)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), nodes=st.integers(0, 40))
def test_components_equal_breadth_first_search(data, nodes):
    edges = (
        data.draw(st.lists(st.tuples(st.integers(0, nodes - 1), st.integers(0, nodes - 1)), max_size=60))
        if nodes
        else []
    )
    a = np.array([x for x, _ in edges], dtype=np.uint64)
    b = np.array([y for _, y in edges], dtype=np.uint64)
    assert components(a, b, nodes).tolist() == bfs_labels(edges, nodes)


def test_choose_keepers_rank_beats_length_beats_id():
    labels = np.array([0, 0, 0, 3, 3, 5])
    rank = np.array([1, 0, 0, 0, 0, 0])
    preference = np.array([-100.0, -10.0, -50.0, -5.0, -5.0, 0.0])  # minus the length for `longest`
    ids = np.array(["a", "z", "y", "q", "p", "solo"])
    # cluster 0: "a" is longest but of a worse source; of the rank-0 pair, "y" is longer
    # cluster 3: same rank and length: the smaller id "p"; cluster 5: alone, its own keeper
    assert choose_keepers(labels, rank, preference, ids).tolist() == [2, 2, 2, 4, 4, 5]
    assert choose_keepers(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, str)).tolist() == []


@pytest.mark.parametrize(
    ("prefer", "nbytes", "meta", "expected"),
    [
        ("longest", 120, {}, -120.0),
        ("shortest", 120, {}, 120.0),
        ("none", 120, {}, 0.0),
        ("meta:quality", 120, {"quality": 0.9}, -0.9),
        ("meta:quality", 120, {"quality": "0.25"}, -0.25),  # a number written as a string still counts
        ("meta:quality", 120, {}, math.inf),  # missing ranks last
        ("meta:quality", 120, {"quality": None}, math.inf),
        ("meta:quality", 120, {"quality": "high"}, math.inf),
        ("meta:quality", 120, {"quality": float("nan")}, math.inf),
    ],
)
def test_preference_value(prefer, nbytes, meta, expected):
    assert preference_value(prefer, nbytes, meta) == expected


def test_preference_orders_keepers_as_documented():
    # meta:score keeps the highest score; a document without one loses even to a score of 0
    meta = [{"score": 0.0}, {}, {"score": 3.5}, {"score": 1}]
    prefs = np.array([preference_value("meta:score", 10, m) for m in meta])
    assert choose_keepers(np.zeros(4, np.int64), np.zeros(4), prefs, np.array(["a", "b", "c", "d"])).tolist() == [2] * 4
    assert choose_keepers(np.zeros(2, np.int64), np.zeros(2), prefs[:2], np.array(["b", "a"])).tolist() == [0, 0]


# --- the S-curve and the config -------------------------------------------------------------------


def test_s_curve_values():
    # hand-worked: 0.8^8 = 0.16777216; (1 - 0.16777216)^14 = 0.07645; 1 - 0.07645 = 0.92355
    assert s_curve(0.8, 14, 8) == pytest.approx(0.92355, abs=1e-4)
    assert s_curve(0.0, 14, 8) == 0.0 and s_curve(1.0, 14, 8) == 1.0
    grid = s_curve(np.linspace(0, 1, 101), 14, 8)
    assert np.all(np.diff(grid) >= 0) and grid[50] < 0.06  # 0.5: about 5 % become candidates


def test_config_checks_prefer_and_counts_permutations():
    assert MinHashConfig().permutations == 112
    assert MinHashConfig(bands=20, rows=5).permutations == 100
    for ok in ("longest", "shortest", "none", "meta:quality"):
        MinHashConfig(prefer=ok)
    for bad in ("biggest", "meta:", "meta"):
        with pytest.raises(ValueError, match="prefer"):
            MinHashConfig(prefer=bad)


def test_memory_estimate_grows_with_documents_and_shrinks_with_tasks():
    cfg = MinHashConfig()
    small, big = memory_estimate(1_000, 4, 14, 1, cfg), memory_estimate(1_000_000, 4, 14, 1, cfg)
    assert set(small) == {"sign", "buckets", "verify", "components"}
    assert all(big[k] > small[k] > 0 for k in small)
    spread = memory_estimate(1_000_000, 64, 14 * 16, 16, cfg)
    assert spread["sign"] < big["sign"] and spread["buckets"] < big["buckets"] and spread["verify"] < big["verify"]
    assert all(v > 100 for v in small.values())  # a worker's base (Python, numpy, pyarrow) is included
