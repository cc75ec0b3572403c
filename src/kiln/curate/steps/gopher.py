"""Gopher's quality and repetition rules (Rae et al. 2021, "Scaling Language Models: Methods,
Analysis & Insights from Training Gopher", arXiv:2112.11446, appendix A.1.1 and Table A1).

GopherQuality drops documents that do not look like prose: too few or too many words, odd mean
word length, many `#` or ellipses, mostly bullet lines or lines trailing off, few words with
letters, fewer than two common English stop words. GopherRepetition drops documents that repeat
themselves: duplicated lines and paragraphs, one n-gram taking a large share of the text, many
characters inside repeated n-grams. Both read the shared split (kiln.text.segments); counts
follow datatrove's implementation of the paper (its GopherQualityFilter and
GopherRepetitionFilter) so that the two agree document for document.
Words are split in the document's language (kiln.text.segments); stop words written with an
apostrophe (French l', d') match as typed and as typeset (l’). Not handled here: the settings of
each language (kiln.curate.languages gives each language its own instance of these steps), the
paper's other filters (language ID, safe search, dedup: other steps).
"""

from __future__ import annotations

import re
from bisect import bisect_left

import numpy as np
from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.curate.steps.base import Drop, Filter
from kiln.text.segments import Segments, segments

# Gopher's stop words (the paper, A.1.1): a document needs at least two of them.
GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")


class GopherQualityConfig(Section):
    """Gopher's quality thresholds (arXiv:2112.11446, A.1.1); defaults are the paper's."""

    enabled: bool = Field(True, description="Run the Gopher quality rules.")
    min_words: int = Field(50, ge=0, description="Fewest words (tokens with a letter or digit) a document may have.")
    max_words: int = Field(100_000, ge=0, description="Most words a document may have.")
    min_mean_word_length: float = Field(3.0, ge=0, description="Smallest mean word length, in characters.")
    max_mean_word_length: float = Field(10.0, ge=0, description="Largest mean word length, in characters.")
    max_hashes_per_word: float = Field(0.1, ge=0, description="Most '#' characters per token.")
    max_ellipses_per_word: float = Field(0.1, ge=0, description="Most ellipses ('...' or '…') per token.")
    max_bullet_line_fraction: float = Field(
        0.9, ge=0, le=1, description="Largest fraction of lines starting with a bullet ('•' or '-')."
    )
    max_ellipsis_line_fraction: float = Field(
        0.3, ge=0, le=1, description="Largest fraction of lines ending in an ellipsis."
    )
    min_alpha_word_fraction: float = Field(
        0.8, ge=0, le=1, description="Smallest fraction of tokens containing a letter."
    )
    min_stop_words: int = Field(
        2, ge=0, description="Fewest distinct stop words (lowercase, exact) a document must contain."
    )
    stop_words: tuple[str, ...] = Field(GOPHER_STOP_WORDS, description="The stop words counted by min_stop_words.")


class GopherQuality(Filter):
    """Keeps documents that pass every Gopher quality rule; the reason names the first that fails."""

    name = "gopher_quality"

    def __init__(self, cfg: GopherQualityConfig):
        self.cfg = cfg
        self.stop_words = _with_curly_apostrophes(cfg.stop_words)

    def check(self, doc: Document) -> Drop | None:
        cfg = self.cfg
        seg = segments(doc)
        tokens = seg.words
        words = seg.alnum_words  # the paper's "words": punctuation-only tokens are not words
        if len(words) < cfg.min_words:
            return Drop("too_few_words", len(words), cfg.min_words)
        if len(words) > cfg.max_words:
            return Drop("too_many_words", len(words), cfg.max_words)
        mean_length = mean_word_length(words)
        if mean_length < cfg.min_mean_word_length:
            return Drop("mean_word_length", mean_length, cfg.min_mean_word_length)
        if mean_length > cfg.max_mean_word_length:
            return Drop("mean_word_length", mean_length, cfg.max_mean_word_length)
        # subtle: the per-word ratios divide by all tokens, punctuation included (as datatrove does)
        n_tokens = len(tokens) or 1
        text = doc.text
        hashes = text.count("#") / n_tokens
        if hashes > cfg.max_hashes_per_word:
            return Drop("hash_ratio", hashes, cfg.max_hashes_per_word)
        ellipses = (text.count("...") + text.count("…")) / n_tokens
        if ellipses > cfg.max_ellipses_per_word:
            return Drop("ellipsis_ratio", ellipses, cfg.max_ellipses_per_word)
        lines = seg.lines
        if lines:
            bullets = sum(1 for line in lines if line.lstrip().startswith(("•", "-"))) / len(lines)
            if bullets > cfg.max_bullet_line_fraction:
                return Drop("bullet_lines", bullets, cfg.max_bullet_line_fraction)
            trailing = sum(1 for line in lines if line.rstrip().endswith(("...", "…"))) / len(lines)
            if trailing > cfg.max_ellipsis_line_fraction:
                return Drop("ellipsis_lines", trailing, cfg.max_ellipsis_line_fraction)
        alpha = count_with_letter(words) / n_tokens
        if alpha < cfg.min_alpha_word_fraction:
            return Drop("alpha_words", alpha, cfg.min_alpha_word_fraction)
        found = len(self.stop_words.intersection(tokens))
        if found < cfg.min_stop_words:
            return Drop("too_few_stop_words", found, cfg.min_stop_words)
        return None


def _with_curly_apostrophes(words: tuple[str, ...]) -> frozenset[str]:
    """The stop words, and each elided one (French l', d') also as typeset (l’, d’): both spellings are split off."""
    return frozenset(words) | {w.replace("'", "’") for w in words}


def mean_word_length(words: list[str]) -> float:
    """The mean length of `words` in characters (0 for none)."""
    return sum(map(len, words)) / len(words) if words else 0.0


# A token with no letter: digits, underscores and marks only ("1,000", "3.5").
_NO_LETTER = re.compile(r"^(?:\d|_|[^\w\n])+$", re.MULTILINE)


def count_with_letter(words: list[str]) -> int:
    """How many of `words` contain a letter."""
    # perf: one regex pass over the words joined by newlines (no word holds one), not a loop per word
    return len(words) - len(_NO_LETTER.findall("\n".join(words)))


class GopherRepetitionConfig(Section):
    """Gopher's repetition thresholds (arXiv:2112.11446, Table A1); defaults are the paper's."""

    enabled: bool = Field(True, description="Run the Gopher repetition rules.")
    max_dup_line_fraction: float = Field(
        0.30, ge=0, le=1, description="Largest fraction of non-empty lines that repeat an earlier line."
    )
    max_dup_paragraph_fraction: float = Field(
        0.30, ge=0, le=1, description="Largest fraction of paragraphs that repeat an earlier paragraph."
    )
    max_dup_line_char_fraction: float = Field(
        0.20, ge=0, le=1, description="Largest share of the text's characters in repeated lines."
    )
    max_dup_paragraph_char_fraction: float = Field(
        0.20, ge=0, le=1, description="Largest share of the text's characters in repeated paragraphs."
    )
    max_top_ngram_char_fraction: dict[int, float] = Field(
        {2: 0.20, 3: 0.18, 4: 0.16},
        description=(
            "n -> largest share of the text's characters covered by the most frequent n-gram (counting its joining "
            "spaces)."
        ),
    )
    max_dup_ngram_char_fraction: dict[int, float] = Field(
        {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10},
        description=(
            "n -> largest share of the text's characters inside repeated n-grams (each repeat counted once, left to "
            "right)."
        ),
    )


class GopherRepetition(Filter):
    """Keeps documents that do not repeat themselves past Gopher's limits; the reason names the first that fails."""

    name = "gopher_repetition"

    def __init__(self, cfg: GopherRepetitionConfig):
        self.cfg = cfg
        self.top_ngrams = sorted(cfg.max_top_ngram_char_fraction.items())
        self.dup_ngrams = sorted(cfg.max_dup_ngram_char_fraction.items())

    def check(self, doc: Document) -> Drop | None:
        cfg = self.cfg
        text = doc.text
        if not text:
            return Drop("empty")
        n_chars = len(text)
        seg = segments(doc)
        paragraphs = seg.paragraphs or [""]
        dups, dup_chars = duplicates(paragraphs)
        if dups / len(paragraphs) > cfg.max_dup_paragraph_fraction:
            return Drop("dup_paragraph_fraction", dups / len(paragraphs), cfg.max_dup_paragraph_fraction)
        if dup_chars / n_chars > cfg.max_dup_paragraph_char_fraction:
            return Drop("dup_paragraph_char_fraction", dup_chars / n_chars, cfg.max_dup_paragraph_char_fraction)
        lines = [line for line in seg.lines if line] or [""]
        dups, dup_chars = duplicates(lines)
        if dups / len(lines) > cfg.max_dup_line_fraction:
            return Drop("dup_line_fraction", dups / len(lines), cfg.max_dup_line_fraction)
        if dup_chars / n_chars > cfg.max_dup_line_char_fraction:
            return Drop("dup_line_char_fraction", dup_chars / n_chars, cfg.max_dup_line_char_fraction)
        if not (self.top_ngrams or self.dup_ngrams):
            return None
        grams = NGrams(seg)
        for n, limit in self.top_ngrams:
            share = grams.top_chars(n) / n_chars
            if share > limit:
                return Drop(f"top_{n}gram_char_fraction", share, limit)
        for n, limit in self.dup_ngrams:
            share = grams.duplicated_chars(n, limit * n_chars) / n_chars
            if share > limit:
                return Drop(f"dup_{n}gram_char_fraction", share, limit)
            if share == 0:
                break  # no n-gram repeats, so no longer one does either
        return None


def duplicates(items: list[str]) -> tuple[int, int]:
    """(items equal to an earlier item, their total characters)."""
    seen: set[str] = set()
    dups = dup_chars = 0
    for item in items:
        if item in seen:
            dups += 1
            dup_chars += len(item)
        else:
            seen.add(item)
    return dups, dup_chars


_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_STEP = np.uint64(0x9E3779B97F4A7C15)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise: a good 64-bit mix, so n-gram keys do not collide by structure."""
    h = (h ^ (h >> np.uint64(30))) * _MIX_1
    h = (h ^ (h >> np.uint64(27))) * _MIX_2
    return h ^ (h >> np.uint64(31))


class NGrams:
    """Word n-grams of one text as 64-bit keys, with the counts Gopher's repetition rules need.

    A word is a token of the shared split, and an n-gram's characters are its words' characters
    (plus the n-1 joining spaces for the most frequent n-gram, as in datatrove). Keys hash the
    word ids of the n-gram: two different n-grams share a key with probability about 2^-64 per
    pair, far below one expected collision in any corpus we curate.
    """

    def __init__(self, seg: Segments):
        words = seg.words
        vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
        # perf: map() and fromiter stay in C; a Python loop over words costs ~3x more
        self.ids = np.fromiter(map(vocab.__getitem__, words), dtype=np.uint64, count=len(words))
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.char_prefix = np.concatenate(([0], np.cumsum(lengths)))  # chars of words[i:j] = prefix[j] - prefix[i]
        self._keys: dict[int, np.ndarray] = {1: _mix(self.ids + _STEP)}
        self._groups: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # subtle: the joining spaces are in the text only where words are written with spaces; counting them in
        # Chinese, Japanese or Thai would add a character per word that the text does not have (a third more to a
        # Chinese 4-gram of 1.7-character words)
        self.joiner = 1 if seg.spaced else 0

    def keys(self, n: int) -> np.ndarray:
        """Key of the n-gram starting at each position (len(words) - n + 1 of them)."""
        if n not in self._keys:
            prev = self.keys(n - 1)
            self._keys[n] = _mix(prev[:-1] * _STEP + self._keys[1][n - 1 :])
        return self._keys[n]

    def groups(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first position of each distinct n-gram, group of each position, count of each group)."""
        if n not in self._groups:
            _, first, group, count = np.unique(self.keys(n), return_index=True, return_inverse=True, return_counts=True)
            self._groups[n] = (first, group.reshape(-1), count)
        return self._groups[n]

    def top_chars(self, n: int) -> int:
        """Characters of the most frequent n-gram times its count; ties go to the one seen first."""
        if self.ids.size < n:
            return 0
        first, _, count = self.groups(n)
        top = count.max()
        start = int(first[count == top].min())
        return int(top) * (int(self.char_prefix[start + n] - self.char_prefix[start]) + self.joiner * (n - 1))

    def duplicated_chars(self, n: int, enough: float | None = None) -> int:
        """Characters in n-grams that repeat an earlier one, scanning left to right and jumping past each repeat.

        Exact when `enough` is None. Given `enough`, only the comparison with it is exact: the
        scan stops once the total passes it, and when even counting every repeated window stays
        within it, that upper bound is returned instead.
        """
        if self.ids.size < n:
            return 0
        first, group, _ = self.groups(n)
        starts = np.arange(group.size)
        repeats = np.nonzero(first[group] != starts)[0]  # positions whose n-gram occurred before
        if repeats.size == 0:
            return 0
        prefix = self.char_prefix
        window = prefix[repeats + n] - prefix[repeats]
        bound = int(window.sum())
        if enough is not None and bound <= enough:
            return bound  # perf: an upper bound already within the limit decides the rule
        # The scan visits positions left to right; at a repeat of an n-gram it has already visited
        # it counts the window and jumps n words, so skipped positions are never "visited". Only
        # repeat positions can count; a first occurrence is visited unless a counted window covers it.
        counted: list[int] = []
        added: set[int] = set()
        next_free = total = 0
        for pos, chars in zip(repeats.tolist(), window.tolist()):
            if pos < next_free:
                continue
            g = int(group[pos])
            f = int(first[g])
            k = bisect_left(counted, f) - 1
            first_visited = k < 0 or counted[k] + n <= f
            if first_visited or g in added:
                total += chars
                counted.append(pos)
                next_free = pos + n
                if enough is not None and total > enough:
                    return total
            else:
                added.add(g)
        return total
