"""Temperature over languages: source weights whose rows follow p_L proportional to n_L ** alpha.

n_L is language L's train tokens over the mixed sources, as the tokenize stage counted them from
the curated documents' meta.language (its manifest: tokens per source per language). With
mix.language_alpha = a, each language gets the share p_L = n_L^a / sum_K n_K^a of the rows (1: the
natural mix, 0.3: XLM-R's and mT5's, 0: every language alike), and inside a language the sources
keep the shares the recipe's weights give them (mix.weights, or their train tokens when None).
Source s, holding the share f_sL of its tokens in L, is weighted w'_s = w_s * sum_L f_sL * p_L / q_L,
q_L = sum_s w_s f_sL being L's share under the recipe's weights. Worked: en_web 600 en tokens,
en_books 300 en, fr 100 fr, weights by tokens, a = 0.5: p = 30:10 = {en: 0.75, fr: 0.25}; q = {en:
0.9, fr: 0.1}; so en_web 0.6 * 0.75 / 0.9 = 0.5, en_books 0.25, fr 0.25 (tests/mix/test_language_mix.py).
Exact when each source holds one language; a source of several languages spreads its weight by
their shares, so its rows bring them in its own proportions and the languages' shares come out
near p, not on it (the dry run shows the planned ones). A language whose sources a schedule has
switched off at some progress gets no rows there; the others share its p.
Legend: S sources, L languages.
Not handled here: drawing rows (kiln.mix.sampler), counting languages (kiln.tokenize.encode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kiln.core.errors import ConfigError


@dataclass(frozen=True)
class LanguageTable:
    languages: list[str]  # most train tokens first
    shares_SL: np.ndarray  # float64: each source's train tokens in each language, over its own
    tokens_L: np.ndarray  # float64: each language's train tokens over the sources


def language_table(sources: Sequence[str], counts: Mapping[str, Mapping[str, int]]) -> LanguageTable:
    """The table of `sources` (in order) from counts: source -> {language: train tokens}."""
    totals = {lang: 0 for s in sources for lang in counts[s]}
    for s in sources:
        for lang, n in counts[s].items():
            totals[lang] += n
    languages = sorted((lang for lang, n in totals.items() if n > 0), key=lambda lang: (-totals[lang], lang))
    tokens_SL = np.array([[counts[s].get(lang, 0) for lang in languages] for s in sources], dtype=np.float64)
    tokens_SL = tokens_SL.reshape(len(sources), len(languages))
    empty = [s for s, n in zip(sources, tokens_SL.sum(axis=1), strict=True) if n <= 0]
    if empty:
        raise ConfigError(
            f"mix.language_alpha: the tokenize manifest counts no train tokens in any language for {empty}; rerun "
            "`kiln tokenize --force`"
        )
    return LanguageTable(languages, tokens_SL / tokens_SL.sum(axis=1, keepdims=True), tokens_SL.sum(axis=0))


def target_shares(tokens_L: np.ndarray, alpha: float) -> np.ndarray:
    """p_L proportional to n_L ** alpha (languages without tokens get 0)."""
    w = np.where(tokens_L > 0, tokens_L**alpha, 0.0)  # subtle: 0 ** 0 is 1, and a language without tokens gets 0
    return w / w.sum()


def tempered(w_S: np.ndarray, shares_SL: np.ndarray, target_L: np.ndarray) -> np.ndarray:
    """Source weights (summing to 1) whose languages follow target_L, each source keeping its share of its language.

    A language none of the weighted sources reaches (q_L = 0) gets nothing: the others share its part.
    """
    mass_L = w_S @ shares_SL / w_S.sum()  # q_L: the languages' shares under the recipe's weights
    live = mass_L > 0
    p_L = np.where(live, target_L, 0.0)
    p_L = p_L / p_L.sum()
    ratio_L = np.divide(p_L, mass_L, out=np.zeros_like(p_L), where=live)
    return w_S / w_S.sum() * (shares_SL @ ratio_L)
