"""kiln.core.split: the held-out decision by id hash."""

from __future__ import annotations

import math

import pytest
import xxhash

from kiln.core.split import holdout_score, is_heldout

IDS = [f"web/data/page-{i:05d}.txt" for i in range(20_000)]


def test_score_matches_reference_hash():
    for doc_id in ("web/a.txt", "code/json/__init__.py", "prose/ä€𝄞"):
        assert holdout_score(doc_id) == xxhash.xxh3_64_intdigest(doc_id.encode("utf-8")) / 2**64
        assert 0.0 <= holdout_score(doc_id) < 1.0


def test_deterministic():
    first = [is_heldout(i, 0.05) for i in IDS[:2000]]
    assert first == [is_heldout(i, 0.05) for i in IDS[:2000]]


@pytest.mark.parametrize("fraction", [0.01, 0.02, 0.1, 0.5])
def test_fraction_is_respected(fraction):
    share = sum(is_heldout(i, fraction) for i in IDS) / len(IDS)
    sigma = math.sqrt(fraction * (1 - fraction) / len(IDS))
    assert abs(share - fraction) < 5 * sigma  # 5 sigma: well under a percent for these sizes


def test_extremes():
    assert not any(is_heldout(i, 0.0) for i in IDS[:1000])
    assert all(is_heldout(i, 1.0) for i in IDS[:1000])


def test_smaller_fraction_selects_a_subset():
    small = {i for i in IDS if is_heldout(i, 0.01)}
    large = {i for i in IDS if is_heldout(i, 0.05)}
    assert small  # not vacuous
    assert small <= large
    assert len(large) > 3 * len(small)
