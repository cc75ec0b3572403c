"""Word n-gram hashes of a text: the shingles of MinHash and the n-grams of decontamination.

A text is normalized (lowercased, digits folded to 0 when asked, every run of punctuation,
underscores and whitespace turned into one word break), split into words, and each word is
hashed once with xxh3-64. An n-gram's 64-bit hash then combines its n word hashes with numpy,
for all n-grams of the text at once: sum over positions j of word_hash[i + j] * MULTIPLIERS[j] (mod 2^64,
one odd constant per position, so order matters), finished by the murmur3 64-bit mixer. So the
Python work is one hash call per word, never one per n-gram.
A text with fewer than n words (but at least one) has one n-gram: all its words.
Not handled here: scripts written without spaces (Chinese, Japanese, Thai) give one word per
run of characters; character n-grams would suit them better.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import xxhash

_BREAKS = re.compile(r"[\W_]+")
# Every Unicode decimal digit (category Nd) to "0": "chapter 12" and "chapter 13" share n-grams.
_FOLD_DIGITS = {cp: "0" for cp in range(sys.maxunicode + 1) if chr(cp).isdecimal() and cp != 0x30}
# Position multipliers (odd 64-bit constants from a fixed generator): changing them changes every
# hash, so they are part of the shingle format (SHINGLE_VERSION).
MULTIPLIERS = np.random.default_rng(0x5EED_5819).integers(1, 2**63, size=64, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
SHINGLE_VERSION = "kiln-shingles v1"
MAX_N = len(MULTIPLIERS)


def words(text: str, fold_digits: bool = True) -> list[str]:
    """Normalized words: lowercase, digits folded (optional), punctuation and whitespace as breaks."""
    lowered = text.lower()
    if fold_digits:
        lowered = lowered.translate(_FOLD_DIGITS)
    return [w for w in _BREAKS.split(lowered) if w]


def word_hashes(tokens: list[str]) -> np.ndarray:
    """xxh3-64 of each word's UTF-8 bytes, as uint64."""
    return np.fromiter((xxhash.xxh3_64_intdigest(w.encode("utf-8", "surrogatepass")) for w in tokens), dtype=np.uint64, count=len(tokens))


def mix64(x: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer, elementwise (uint64 arithmetic wraps, as intended)."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def ngram_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every run of n consecutive word hashes (len - n + 1 of them; one for a shorter
    non-empty text, none for an empty one). Position j of the n-gram is weighted by K[j]."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"n-gram size {n} is outside 1..{MAX_N}")
    count = len(hashes) - n + 1
    if count <= 0:
        if len(hashes) == 0:
            return np.zeros(0, dtype=np.uint64)
        return mix64(np.array([np.sum(hashes * MULTIPLIERS[: len(hashes)], dtype=np.uint64)], dtype=np.uint64))
    acc = hashes[:count] * MULTIPLIERS[0]
    for j in range(1, n):
        acc += hashes[j : j + count] * MULTIPLIERS[j]
    return mix64(acc)


def shingle_set(text: str, n: int, fold_digits: bool = True) -> np.ndarray:
    """Sorted distinct n-gram hashes of a text (the set MinHash signs and Jaccard compares)."""
    return np.unique(ngram_hashes(word_hashes(words(text, fold_digits)), n))
