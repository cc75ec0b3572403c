"""Word n-gram hashes of a text: the shingles of MinHash and the n-grams of decontamination.

A text is normalized (lowercased, digits folded to 0 when asked, every run of punctuation,
underscores and whitespace turned into one word break; combining marks are part of words), split into words, and each
word is
hashed with xxh3-64. An n-gram's 64-bit hash then combines its n word hashes with numpy, for
all n-grams at once: sum over positions j of word_hash[i + j] * MULTIPLIERS[j] (mod 2^64, one
odd constant per position, so order matters), finished by the murmur3 64-bit mixer. So the
Python work is one dictionary lookup per word, never a call per n-gram.
Speed (one core, prose): ASCII text takes a bytes fast path (one translate, one split) and word
hashes come from a per-process cache of recent words; `shingle_sets` does the n-gram and
distinct steps for a whole batch of documents in a few numpy calls.
A text with fewer than n words (but at least one) has one n-gram: all its words.
A run of a script written without spaces (Han, kana, Thai, ...) is split into words by the segmenter
of the language that script implies (kiln.text.languages: kana Japanese, Thai Thai, else Han
Chinese; one word per character where none is installed), so a Chinese or Japanese paragraph has
word n-grams as an English one has, and an edit of a few characters changes a few of them. Given the
text's language (near dedup passes `meta.language`), a run that script alone would call Chinese, or
that is mostly Latin letters, goes to that language's segmenter when it is written without spaces:
a kanji-only run of a Japanese text (日単位) and a run such as "エラー、pkgProblemResolver" are split
as Japanese. Without a language (the n-gram model, the classifier, the decontamination index) the
words are what they were: SHINGLE_VERSION marks what those store, which this did not change.
Not handled here: a kanji-only run of a Japanese text of no stated language is split as Chinese.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np
import xxhash

from kiln.text.languages import UNSPACED_CHAR as _UNSPACED
from kiln.text.languages import language_rule, script_language, segmenter


def _breaks() -> re.Pattern[str]:
    """Word breaks: runs of characters that are neither word characters nor combining marks
    (category M: vowel signs, viramas, diacritics belong to their word: Hindi, Arabic), and
    underscores."""
    marks = []
    # perf: marks live in U+0300..U+1FFFF and in the variation selectors U+E0100..U+E01EF (Unicode
    # 15); scanning only there takes 0.05 s at import instead of 0.7 s for all code points.
    for first, stop in ((0x300, 0x20000), (0xE0000, 0xE1000)):
        start = None
        for cp in range(first, stop + 1):
            is_mark = cp < stop and unicodedata.category(chr(cp)).startswith("M")
            if is_mark and start is None:
                start = cp
            elif not is_mark and start is not None:
                marks.append(re.escape(chr(start)) + ("" if cp - 1 == start else "-" + re.escape(chr(cp - 1))))
                start = None
    return re.compile(f"[^\\w{''.join(marks)}]+|_+")


_BREAKS = _breaks()
_PLAIN_BREAKS = re.compile(r"[\W_]+")  # the same on text without combining marks
_FIRST_MARK = "\u0300"  # no combining mark comes before U+0300
_DIGITS = re.compile(r"\d")  # every Unicode decimal digit (category Nd), as str.isdecimal
# Position multipliers (odd 64-bit constants from a fixed generator): changing them changes every
# hash, so they are part of the shingle format (SHINGLE_VERSION).
MULTIPLIERS = np.random.default_rng(0x5EED_5819).integers(1, 2**63, size=64, dtype=np.uint64) * np.uint64(
    2
) + np.uint64(1)
SHINGLE_VERSION = "kiln-shingles v2"  # v2: runs of scripts without spaces are segmented into words
MAX_N = len(MULTIPLIERS)
# The ASCII fast path: letters lowercased, digits kept or folded, everything else a break. It
# splits exactly where _BREAKS does on ASCII text (\w on ASCII is letters, digits, underscore).
_ASCII = {
    fold: bytes(
        c if chr(c).isalpha() else (ord("0") if fold else c) if chr(c).isdigit() else ord(" ")
        for c in bytes(range(128)).lower()
    )
    + bytes(range(128, 256))
    for fold in (False, True)
}
_NON_ASCII = re.compile(rb"[\x80-\xff]+")
_ASCII_BREAK = re.compile(r"[\x00-/:-@\[-`{-\x7f]+")  # every ASCII character but letters and digits
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_CACHE: dict[bytes, int] = {}
_CACHE_WORDS = 1 << 20  # distinct words cached per process (~150 MB at most); cleared when full


def words(text: str, fold_digits: bool = True, language: str | None = None) -> list[str]:
    """Normalized words: lowercase, digits folded (optional), punctuation and whitespace as breaks;
    combining marks stay inside their word; runs written without spaces split as `language` (None:
    unknown) and their script say (see the module docstring)."""
    if fold_digits:
        text = _DIGITS.sub("0", text)  # "chapter 12" and "chapter 13" share n-grams
    # subtle: each word is lowercased on its own, after the split. Lowercasing is contextual (a
    # Greek capital sigma becomes final sigma at a word's end), so the whole text lowered would
    # differ from the word lowered wherever a break sits between them; text_hashes lowers words.
    out: list[str] = []
    for token in text.split():  # whitespace always breaks; most tokens need nothing more
        if not token.isascii() and _UNSPACED.search(token):  # a run of Chinese, Japanese, Thai: its words
            out += _segmented(token, language)
        elif token.isalnum():
            out.append(token.lower())
        elif token.isascii() or max(token) < _FIRST_MARK:  # perf: the plain class is 2x faster than the one with marks
            out.extend(w.lower() for w in _PLAIN_BREAKS.split(token) if w)
        else:
            out.extend(w.lower() for w in _BREAKS.split(token) if w)
    return out


def _segmented(token: str, language: str | None) -> list[str]:
    """The words of a whitespace-free token holding a script written without spaces. subtle: it is cut at
    ASCII breaks and its ASCII letters lowered before the segmenter sees it, as text_hashes hands words()
    only such pieces, already lowered: the segmenter must see the same text either way."""
    out: list[str] = []
    for piece in _ASCII_BREAK.split(token):
        if not _UNSPACED.search(piece):
            out.extend(w.lower() for w in _BREAKS.split(piece) if w)
            continue
        piece = piece.translate(_ASCII_LOWER)
        for word in _segmenter_of(piece, language)(piece):
            out.extend(w.lower() for w in _BREAKS.split(word) if w)
    return out


def _segmenter_of(piece: str, language: str | None) -> Callable[[str], list[str]]:
    """The segmenter of a run: its script's language where the script names one (kana: ja, Thai: th,
    Hangul: ko), else the text's language where that is written without spaces, else Chinese."""
    guess = script_language(piece)
    if language is not None and guess in (None, "zh"):
        kind, rule = language_rule(language)
        if kind == "segmented" and callable(rule):
            return rule
    return segmenter(guess or "zh")


def word_hashes(tokens: list[str]) -> np.ndarray:
    """xxh3-64 of each word's UTF-8 bytes, as uint64."""
    return _hash_words([w.encode("utf-8", "surrogatepass") for w in tokens])


def text_hashes(text: str, fold_digits: bool = True, language: str | None = None) -> np.ndarray:
    """word_hashes(words(text, fold_digits, language)), faster: the UTF-8 bytes are split at ASCII breaks
    with one translate and one split; only tokens holding non-ASCII characters go through the
    rules of `words` (Unicode case, breaks and marks). Every ASCII character other than a letter
    or digit is a break in both, so the words are the same."""
    translated = text.encode("utf-8", "surrogatepass").translate(_ASCII[fold_digits])
    if text.isascii():
        return _hash_words(translated.split())
    # perf: only the tokens holding a non-ASCII byte go through `words`; the ASCII runs between
    # them split at C speed. After the translate every ASCII break is a space, so a token runs
    # from the space before a non-ASCII byte to the space after it.
    tokens: list[bytes] = []
    done = 0
    for run in _NON_ASCII.finditer(translated):
        if run.start() < done:
            continue  # part of the token just handled
        start = translated.rfind(b" ", 0, run.start()) + 1
        stop = translated.find(b" ", run.end())
        stop = len(translated) if stop < 0 else stop
        tokens += translated[done:start].split()
        tokens += [
            w.encode("utf-8", "surrogatepass")
            for w in words(translated[start:stop].decode("utf-8", "surrogatepass"), fold_digits, language)
        ]
        done = stop
    tokens += translated[done:].split()
    return _hash_words(tokens)


def _hash_words(tokens: list[bytes]) -> np.ndarray:
    cache = _CACHE
    if len(cache) > _CACHE_WORDS:
        cache.clear()
    for w in set(tokens).difference(cache):  # perf: prose repeats words; ~5x fewer hash calls
        cache[w] = xxhash.xxh3_64_intdigest(w)
    return np.fromiter(map(cache.__getitem__, tokens), dtype=np.uint64, count=len(tokens))


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


def shingle_set(text: str, n: int, fold_digits: bool = True, language: str | None = None) -> np.ndarray:
    """Sorted distinct n-gram hashes of a text (the set MinHash signs and Jaccard compares)."""
    return np.unique(ngram_hashes(text_hashes(text, fold_digits, language), n))


def shingle_sets(
    texts: list[str], n: int, fold_digits: bool = True, languages: Sequence[str | None] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """shingle_set of every text (in its language from `languages`, None: unknown), concatenated, with
    offsets (len(texts) + 1): text i's set is values[offsets[i]:offsets[i + 1]]. One pass of numpy over
    the whole batch."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"n-gram size {n} is outside 1..{MAX_N}")
    if languages is None:
        languages = [None] * len(texts)
    assert len(languages) == len(texts), "one language (or None) per text"
    per_text = [text_hashes(t, fold_digits, language) for t, language in zip(texts, languages)]
    lengths = np.fromiter(map(len, per_text), dtype=np.int64, count=len(texts))
    starts = np.concatenate(([0], np.cumsum(lengths)))
    flat = np.concatenate(per_text) if per_text else np.zeros(0, np.uint64)
    count = len(flat) - n + 1
    # n-grams of the concatenation; those that start in one text and end in the next are dropped
    acc = flat[: max(count, 0)] * MULTIPLIERS[0]
    for j in range(1, n):
        acc += flat[j : j + max(count, 0)] * MULTIPLIERS[j]
    # an n-gram starting at word p of text d is whole when p - starts[d] <= lengths[d] - n
    word_owner = np.repeat(np.arange(len(texts)), lengths)[: max(count, 0)]
    whole = np.arange(len(word_owner)) - starts[word_owner] <= lengths[word_owner] - n
    owner = word_owner[whole]
    grams = mix64(acc[whole])
    short = np.flatnonzero((lengths > 0) & (lengths < n))  # one n-gram of all their words
    if len(short):
        grams = np.concatenate([grams, np.array([ngram_hashes(per_text[i], n)[0] for i in short], dtype=np.uint64)])
        owner = np.concatenate([owner, short])
    # perf: a quicksort by value, then a stable sort by owner (a radix sort on 16 bits): 3x
    # faster than np.lexsort here; the result is the same order (by owner, then value).
    by_value = np.argsort(grams)
    order = by_value[np.argsort(owner[by_value].astype(np.uint16 if len(texts) < 1 << 16 else np.int64), kind="stable")]
    grams, owner = grams[order], owner[order]
    distinct = np.ones(len(grams), dtype=bool)
    distinct[1:] = (grams[1:] != grams[:-1]) | (owner[1:] != owner[:-1])
    grams, owner = grams[distinct], owner[distinct]
    offsets = np.concatenate(([0], np.cumsum(np.bincount(owner, minlength=len(texts)))))
    return grams, offsets
