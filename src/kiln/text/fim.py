"""Fill-in-the-middle: a document cut at two character positions and rearranged around markers.

FIM (Bavarian et al. 2022) teaches a left-to-right model to write a middle given what comes
before and after it. The text is cut at two uniformly drawn character positions into prefix,
middle and suffix, each encoded on its own, and laid out with the tokenizer's markers:
  psm  <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle
  spm  <|fim_suffix|> suffix <|fim_prefix|> prefix <|fim_middle|> middle
so the middle always comes last and is learned as a continuation. Cuts are at characters, never
inside a UTF-8 sequence, and `restore` rebuilds the original ids' text exactly. The decision for
a document (whether, which layout, where) is drawn from a generator seeded by the FIM seed and
the document id: the same in every run and for every worker count.
Not handled here: which documents are eligible (kiln.tokenize.encode applies it to the train
split of the configured sources), or training on it (plain next-token prediction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import xxhash


@dataclass(frozen=True)
class FimCut:
    layout: Literal["psm", "spm"]
    prefix: str
    middle: str
    suffix: str


def draw_cut(text: str, doc_id: str, seed: int, rate: float, spm_rate: float) -> FimCut | None:
    """The document's FIM cut, or None when it stays as it is (probability 1 - rate)."""
    rng = np.random.default_rng([seed, xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"))])
    apply, spm, a, b = rng.random(), rng.random(), rng.integers(0, len(text) + 1), rng.integers(0, len(text) + 1)
    if apply >= rate:
        return None
    lo, hi = int(min(a, b)), int(max(a, b))
    return FimCut("spm" if spm < spm_rate else "psm", text[:lo], text[lo:hi], text[hi:])


def fim_ids(
    cut: FimCut, encode: Callable[[str], list[int]], prefix_id: int, middle_id: int, suffix_id: int
) -> list[int]:
    """The ids of the rearranged document (without end-of-document)."""
    pre, mid, suf = encode(cut.prefix), encode(cut.middle), encode(cut.suffix)
    if cut.layout == "psm":
        return [prefix_id, *pre, suffix_id, *suf, middle_id, *mid]
    return [suffix_id, *suf, prefix_id, *pre, middle_id, *mid]


def restore(ids: Sequence[int], prefix_id: int, middle_id: int, suffix_id: int) -> list[int]:
    """The ids in reading order (prefix, middle, suffix) from either layout; their decode is the original text."""
    ids = list(ids)
    p, m, s = ids.index(prefix_id), ids.index(middle_id), ids.index(suffix_id)
    if p < s:  # psm
        pre, suf, mid = ids[p + 1 : s], ids[s + 1 : m], ids[m + 1 :]
    else:  # spm
        suf, pre, mid = ids[s + 1 : p], ids[p + 1 : m], ids[m + 1 :]
    return [*pre, *mid, *suf]
