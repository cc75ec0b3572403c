"""Language balance of the tokenizer's training sample: temperature sampling over languages.

The sample is drawn by source first (train.py). Each language L then holds n_L of its bytes,
and with `tokenizer.language_alpha` = a it is given the share p_L = n_L^a / sum_K n_K^a of the
same total: a = 1 keeps the natural mix, a = 0.3 (XLM-R, mT5) lifts the small languages, a = 0
gives every language the same share. Worked: n = {en: 900, th: 100}, a = 0.5 gives weights 30
and 10, so p = {en: 0.75, th: 0.25}: en keeps 750 of its bytes and th's 100 are taken 2.5 times.
A language whose share grows repeats its documents: all of them once per whole multiple of n_L,
then documents in the order of a hash of their id until the rest is filled; one whose share
shrinks keeps documents in that order until it is filled. The result depends on the documents
alone, not on the order they were read, and a language overshoots its share by less than one
document. a = 1 returns the sample as it was drawn, in its order, so a recipe that sets it trains
the same tokenizer as one that does not.
Not handled here: a language is given no text the sample lacks (up-weighting repeats documents:
more weight on its words, not more of them; raise sample_mb for more), choosing the language of a
document (report.language_of), drawing the sample (train.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash


@dataclass(frozen=True)
class SampledDoc:
    id: str
    language: str
    text: str
    bytes: int  # UTF-8


def order_score(doc_id: str) -> float:
    """Uniform in [0, 1) per id; its own hash seed, apart from the held-out split's and the source sample's."""
    return xxhash.xxh3_64_intdigest(doc_id.encode("utf-8"), seed=2) / 2.0**64


def language_shares(n_bytes: dict[str, int], alpha: float) -> dict[str, float]:
    """p_L proportional to n_L ** alpha, over the languages with text (module docstring)."""
    weights = {lang: float(n) ** alpha for lang, n in n_bytes.items() if n > 0}
    total = sum(weights.values())
    return {lang: w / total for lang, w in weights.items()}


def balance(docs: Sequence[SampledDoc], alpha: float) -> tuple[list[SampledDoc], dict[str, dict[str, Any]]]:
    """The sample with each language at its share (module docstring), and per language its documents,
    bytes and shares before and after, with the share asked (`target_share`)."""
    by_language: dict[str, list[SampledDoc]] = {}
    for d in docs:
        by_language.setdefault(d.language, []).append(d)
    before = {lang: sum(d.bytes for d in group) for lang, group in by_language.items()}
    total = sum(before.values())
    shares = language_shares(before, alpha)
    if alpha == 1:
        # subtle: p_L * total / n_L is 1 only up to rounding, which could drop or add a document; a = 1 is the sample.
        out, chosen = list(docs), by_language
    else:
        out, chosen = [], {}
        for lang in sorted(by_language):
            group, n = by_language[lang], before[lang]
            if n == 0:  # only empty documents: nothing to weigh
                chosen[lang] = list(group)
            else:
                target = shares[lang] * total
                copies = int(target // n)
                picked = list(group) * copies
                rest, used = target - copies * n, 0
                for d in sorted(group, key=lambda d: (order_score(d.id), d.id)):
                    if used >= rest:
                        break
                    picked.append(d)
                    used += d.bytes
                chosen[lang] = picked
            out += chosen[lang]
    after = {lang: sum(d.bytes for d in group) for lang, group in chosen.items()}
    total_after = sum(after.values())
    stats = {
        lang: {
            "docs_before": len(by_language[lang]),
            "bytes_before": before[lang],
            "share_before": round(before[lang] / total, 4) if total else None,
            "target_share": round(shares.get(lang, 0.0), 4),
            "docs_after": len(chosen[lang]),
            "bytes_after": after[lang],
            "share_after": round(after[lang] / total_after, 4) if total_after else None,
        }
        for lang in sorted(by_language, key=lambda k: (-before[k], k))
    }
    return out, stats
