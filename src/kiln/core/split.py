"""Which documents are held out for validation.

The decision hashes the document id, so it is the same in every stage, every run and every
worker count, and a smaller fraction always selects a subset of a larger one: the tokenizer's
held-out text and the tokenize stage's validation split agree when their fractions agree.
"""

from __future__ import annotations

import xxhash

_SCALE = float(2**64)


def holdout_score(doc_id: str) -> float:
    """Uniform in [0, 1), fixed per document id."""
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8")) / _SCALE


def is_heldout(doc_id: str, fraction: float) -> bool:
    return holdout_score(doc_id) < fraction
