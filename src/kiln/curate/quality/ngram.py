"""A word n-gram language model with interpolated modified Kneser-Ney smoothing: CCNet's perplexity filter.

CCNet keeps web text by the perplexity of a KenLM model trained on Wikipedia. KenLM's trainer
(lmplz) is not on PyPI, so this is ours, in numpy: Chen & Goodman (1998) interpolated modified KN
with lmplz's conventions. Each line is a sentence `<s> w1 .. wk </s>`; the highest order counts raw
n-grams, lower orders count distinct left extensions (continuation counts), except n-grams that
start with <s>, which keep raw counts; three discounts D1, D2, D3+ per order come from that order's
count-of-counts; the unigram level interpolates with a uniform distribution over vocab + 1, the 1
being every unseen word (<unk>). Stored as lmplz writes ARPA: per order, the sorted 64-bit keys of
the seen n-grams, their interpolated log10 p, and the log10 backoff (interpolation weight) of each
n-gram as a context, so that scoring is a few table lookups per word.
Words are the normalized words of kiln.text.shingles (xxh3-64 hashes), and an n-gram's key
hashes its word hashes with its order: two different words or n-grams that share a 64-bit hash are
one to the model (about 2^-64 per pair; the model never sees words as strings).
Not handled here: pruning (every seen n-gram is kept: 22 bytes each on disk, 159 MB for the 7.4M
n-grams of 65 MB of /usr/share/doc text at order 5, a little more in memory), sentence splitting (a
line is a sentence), and scripts written without spaces (see shingles).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from kiln.core.errors import FatalError
from kiln.curate.quality.store import load_arrays, save_arrays
from kiln.text.shingles import MULTIPLIERS, mix64, text_hashes, words

FORMAT = "kiln-ngram v1"
MAX_ORDER = 16
log = logging.getLogger("kiln.curate.quality")

# Reserved word hashes: a normalized word never holds "<" or "/", so these are hashes of no word.
_BOS = np.uint64(xxhash.xxh3_64_intdigest(b"<s>"))
_EOS = np.uint64(xxhash.xxh3_64_intdigest(b"</s>"))
# One salt per order, mixed into every key: part of FORMAT, as are MULTIPLIERS and the two above.
_SALTS = np.array(
    [xxhash.xxh3_64_intdigest(f"kiln-ngram order {n}".encode()) for n in range(MAX_ORDER + 1)], dtype=np.uint64
)
_FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # lmplz --discount_fallback, for orders whose count-of-counts give none
_BATCH_CHARS = 1 << 20  # text scored per numpy pass: ~200k tokens; scoring peaks at ~85 MB (tracemalloc, order 5)
# ASCII letters and digits kept, "\n" kept, every other byte a space: the word breaks of shingles
_ASCII_WORDS = bytes(c if chr(c).isalnum() or c == 10 else 32 for c in range(128)) + bytes(range(128, 256))


def _text_lines(text: str, fold_digits: bool) -> tuple[np.ndarray, np.ndarray]:
    """The word hashes of `text` (text_hashes) and the word count of each line that has words.

    perf: one text_hashes call per text, not per line: lines of documentation and web text are
    short, and per-line calls ran at 16.6 MB/s against 23.3 MB/s here (/usr/share/doc text, 40
    bytes a line, one core). The lines' word counts come from splitting them at the same breaks:
    every ASCII byte other than a letter or digit (as in shingles), `words` for a line holding
    other characters."""
    hashes = text_hashes(text, fold_digits)
    raw_lines = text.encode("utf-8", "surrogatepass").translate(_ASCII_WORDS).split(b"\n")
    if text.isascii():
        counts = list(map(len, map(bytes.split, raw_lines)))
    else:  # "\n" is one byte in UTF-8: the byte lines and the text lines pair up
        counts = [
            len(raw.split()) if raw.isascii() else len(words(line, fold_digits))
            for raw, line in zip(raw_lines, text.split("\n"))
        ]
    lengths = np.array(counts, dtype=np.int64)
    lengths = lengths[lengths > 0]
    assert lengths.sum() == len(hashes), "line word counts disagree with kiln.text.shingles.text_hashes"
    return hashes, lengths


def _pieces(text: str, size: int) -> Iterator[str]:
    """`text` cut at line ends into pieces of about `size` characters (a longer line stays whole)."""
    start = 0
    while len(text) - start > size:
        cut = text.rfind("\n", start, start + size)
        cut = cut if cut >= 0 else text.find("\n", start + size)
        if cut < 0:
            break
        yield text[start:cut]
        start = cut + 1
    yield text[start:]


def _sentences(hashes: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lines of `lengths` words each (concatenated in `hashes`) as one token sequence `<s> w.. </s> <s> ..`
    and each token's offset within its line (0 for <s>)."""
    sizes = lengths.astype(np.int64) + 2
    ends = np.cumsum(sizes)
    starts = ends - sizes
    seq = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint64)
    is_word = np.ones(len(seq), dtype=bool)
    is_word[starts] = False
    is_word[ends - 1] = False
    seq[is_word] = hashes
    seq[starts] = _BOS
    seq[ends - 1] = _EOS
    off = (np.arange(len(seq), dtype=np.int64) - np.repeat(starts, sizes)).astype(np.int32)
    return seq, off


def _keys(acc: np.ndarray, n: int) -> np.ndarray:
    """The key of an n-gram from acc = sum_j token[i - j] * MULTIPLIERS[j], j = 0..n-1 counted back
    from its last word, so that order n + 1 extends order n's acc with one multiply-add."""
    return mix64(acc ^ _SALTS[n])


def _discounts(count_of_counts: np.ndarray) -> tuple[float, float, float]:
    """D1, D2, D3+ of one order from t1..t4 (n-grams seen exactly 1..4 times), Chen & Goodman eq. 26:
    Y = t1 / (t1 + 2 t2), Dk = k - (k + 1) Y t(k+1) / tk. lmplz's fallback (0.5, 1, 1.5) where some
    tk is 0 or some Dk falls outside (0, k] (small or odd corpora: a Dk <= 0 could leave a context
    no mass for unseen words)."""
    t1, t2, t3, t4 = (float(x) for x in count_of_counts[1:5])
    if min(t1, t2, t3, t4) > 0:
        y = t1 / (t1 + 2 * t2)
        d = (1 - 2 * y * t2 / t1, 2 - 3 * y * t3 / t2, 3 - 4 * y * t4 / t3)
        if 0 < d[0] <= 1 and 0 < d[1] <= 2 and 0 < d[2] <= 3:
            return d
    return _FALLBACK_DISCOUNTS


def _group(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """np.unique(keys, return_index, return_inverse, return_counts), one argsort: the sorted distinct
    keys, how often each occurs, each key's distinct index, and one occurrence of each."""
    order = np.argsort(keys)
    ranked = keys[order]
    new = np.ones(len(keys), dtype=bool)
    new[1:] = ranked[1:] != ranked[:-1]
    firsts = np.flatnonzero(new)
    inverse = np.empty(len(keys), dtype=np.int32)  # int32 indices and counts: fewer than 2^31 tokens (train() checks)
    inverse[order] = np.cumsum(new, dtype=np.int32) - 1
    return ranked[firsts], np.diff(np.append(firsts, len(keys))).astype(np.int32), inverse, order[firsts]


class _Table:
    """One order's seen n-grams: sorted keys and their values, with a bucket index on the top bits
    of the (uniformly mixed) keys: a lookup reads starts[bucket], then scans the 0.5-1 keys of that
    bucket on average. perf: 31 ns a query against 279 for np.searchsorted (65 with the queries
    sorted first), one core, on the tables of 65 MB of training text (0.08-2.3M keys per order)."""

    def __init__(self, keys: np.ndarray, logp: np.ndarray, logbo: np.ndarray | None):
        # subtle: a scan stops at the first key >= the query; the next bucket's keys are all larger,
        # so only the last bucket can run off the end: one sentinel key after the keys stops it.
        self._scan = np.append(keys, np.uint64(2**64 - 1))
        self.keys, self.logp, self.logbo = self._scan[:-1], logp, logbo  # keys: a view, no second copy
        bits = max(1, len(keys).bit_length())  # 2^bits > len(keys): 0.5-1 keys per bucket
        self.shift = np.uint64(64 - bits)
        counts = np.bincount((keys >> self.shift).astype(np.intp), minlength=1 << bits)
        self.starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(
            np.uint32 if len(keys) < 1 << 32 else np.int64
        )

    def find(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index, found) per query: keys[index] == query where found."""
        index = self.starts[queries >> self.shift].astype(np.int64)
        todo = np.flatnonzero(self._scan[index] < queries)
        while len(todo):  # rounds: at most the largest bucket (~10 keys); most queries need none
            index[todo] += 1
            todo = todo[self._scan[index[todo]] < queries[todo]]
        found = (self._scan[index] == queries) & (index < len(self.keys))
        return index, found


class NGramLM:
    """An interpolated modified Kneser-Ney word n-gram model; `train` builds one, `score` uses it."""

    def __init__(self, order: int, fold_digits: bool, tables: list[_Table], log_unk: float, meta: dict[str, Any]):
        self.order = order
        self.fold_digits = fold_digits
        self._tables = tables  # tables[n - 1]: order n
        self._log_unk = log_unk  # log10 p(<unk>) with no context: gamma_1 / (vocab + 1)
        self._meta = meta  # vocab, discounts, train_words, train_lines

    # -------------------------------------------------------------------------------------------
    # training

    @classmethod
    def train(cls, texts: Iterable[str], order: int = 5, fold_digits: bool = True) -> NGramLM:
        """Count the n-grams of every line of `texts` (order 1..`order`) and smooth them. All counts
        are in memory: 65 MB of text at order 5 took 14-19 s and a 1.1-1.6 GB peak (one core)."""
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order {order} is outside 1..{MAX_ORDER}")
        hashes, lengths = _read_lines(texts, fold_digits)
        if not len(lengths):
            raise FatalError(
                "quality: the n-gram model's training text has no words; give it reference text with words in it"
            )
        seq, off = _sentences(hashes, lengths)
        del hashes
        if len(seq) >= 2**31:
            raise FatalError(
                f"quality: the n-gram model's training text has {len(seq):,} tokens, over 2^31; lower "
                "quality.lm.max_train_mb"
            )
        grams = _count(seq, off, order)
        del seq, off
        tables, log_unk, discounts, vocab = _smooth(grams, order)
        meta = {"vocab": vocab, "discounts": discounts, "train_words": int(lengths.sum()), "train_lines": len(lengths)}
        model = cls(order, fold_digits, tables, log_unk, meta)
        log.info(
            "n-gram model: order %d, %s n-grams per order from %s words in %s lines",
            order,
            model.stats["ngrams"],
            f"{meta['train_words']:,}",
            f"{meta['train_lines']:,}",
        )
        return model

    # -------------------------------------------------------------------------------------------
    # scoring

    def score(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per text: the sum of log10 probabilities over its lines and its token count. Each line is a sentence: context
        starts with <s>, every word and a closing </s> are predicted (so tokens = words + 1 per line), as KenLM scores a
        line. float64 and int64 arrays of len(texts)."""
        log10_sum = np.zeros(len(texts), dtype=np.float64)
        tokens = np.zeros(len(texts), dtype=np.int64)
        for hashes, lengths, owner in _line_batches(texts, self.fold_digits):
            seq, off = _sentences(hashes, lengths)
            logp = self._log10_probs(seq, off)
            text_of = np.repeat(owner, lengths + 2)
            predicted = off > 0
            # a text cut across batches is summed batch by batch: the same as in one batch up to
            # float rounding (~1e-15 relative)
            log10_sum += np.bincount(text_of[predicted], weights=logp[predicted], minlength=len(texts))
            tokens += np.bincount(text_of[predicted], minlength=len(texts))
        return log10_sum, tokens

    def perplexities(self, texts: Sequence[str]) -> np.ndarray:
        """10 ** (-sum log10 p / tokens) per text: CCNet's per-line, length-weighted document perplexity. NaN for a text
        with no words."""
        log10_sum, tokens = self.score(texts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(tokens > 0, 10.0 ** (-log10_sum / np.maximum(tokens, 1)), np.nan)

    def _log10_probs(self, seq: np.ndarray, off: np.ndarray) -> np.ndarray:
        """log10 p(token | up to order - 1 tokens before it in its line) at each position; NaN at <s>.

        ARPA backoff: find the longest seen n-gram ending at the position (order m), take its
        interpolated log10 p, and add the log10 backoff of every longer context (orders m + 1 ..
        order - 1, each the n-gram ending one position earlier; 0 where that context is unseen).
        Seen n-grams are suffix-closed, so order n + 1 is looked up only where order n was found.
        perf: that makes 3.3 lookups a token instead of 5 at order 5 (/usr/share/doc text held out)."""
        size, top = len(seq), self.order
        best = np.full(size, self._log_unk)  # the word is unseen: log10 p(<unk>)
        longest = np.zeros(size, dtype=np.int8)  # m: the longest seen n-gram ending here
        # backoff[n, p]: log10 backoff of the n-gram ending at p as a context (0: none); row 0 stays 0
        backoff = np.zeros((top, size), dtype=np.float64)
        at = np.arange(size)  # positions whose (n-1)-gram was found, <s> included (its backoff counts)
        acc = np.zeros(size, dtype=np.uint64)
        for n in range(1, top + 1):
            if n > 1:
                room = off[at] >= n - 1  # the n-gram stays inside its line
                at, acc = at[room], acc[room]
            acc = acc + seq[at - (n - 1)] * MULTIPLIERS[n - 1]
            table = self._tables[n - 1]
            index, found = table.find(_keys(acc, n))
            at, acc, index = at[found], acc[found], index[found]
            best[at] = table.logp[index]
            longest[at] = n
            if n < top:
                backoff[n, at] = table.logbo[index]
        cumulative = np.cumsum(backoff, axis=0)  # cumulative[j, p]: the backoffs of orders 1..j at p
        out = np.full(size, np.nan)
        pos = np.flatnonzero(off > 0)
        prev = pos - 1
        # contexts longer than the longest seen n-gram's: orders max(m, 1) .. order - 1 ending at prev
        skip = np.maximum(longest[pos], 1) - 1
        out[pos] = best[pos] + (cumulative[top - 1, prev] - cumulative[skip, prev])
        return out

    # -------------------------------------------------------------------------------------------
    # files

    def save(self, path: Path) -> None:
        """One .npz (kiln.curate.quality.store) holding the settings and the tables; atomic, and identical
        models give identical bytes."""
        arrays: dict[str, np.ndarray] = {
            "order": np.array(self.order),
            "fold_digits": np.array(self.fold_digits),
            "log_unk": np.array(self._log_unk),
            "vocab": np.array(self._meta["vocab"]),
            "train_words": np.array(self._meta["train_words"]),
            "train_lines": np.array(self._meta["train_lines"]),
            "discounts": np.array(self._meta["discounts"], dtype=np.float64),
        }
        for n, table in enumerate(self._tables, start=1):
            arrays[f"keys{n}"], arrays[f"logp{n}"] = table.keys, table.logp
            if table.logbo is not None:
                arrays[f"logbo{n}"] = table.logbo
        save_arrays(path, FORMAT, arrays)

    @classmethod
    def load(cls, path: Path) -> NGramLM:
        """Read a model saved by `save`; FatalError when the file is missing, foreign, of another
        format or corrupt."""
        data = load_arrays(path, FORMAT, "n-gram model", "train it again with `kiln quality train-lm`")
        order, fold_digits, log_unk = (
            data.scalar("order", int),
            data.scalar("fold_digits", bool),
            data.scalar("log_unk", float),
        )
        if not 1 <= order <= MAX_ORDER:
            raise data.corrupt(f"has order {order}, outside 1..{MAX_ORDER}")
        discounts = data["discounts"]
        if discounts.dtype != np.float64 or discounts.shape != (order, 3):
            raise data.corrupt(f"holds discounts {discounts.dtype}{list(discounts.shape)} for order {order}")
        meta = {
            "vocab": data.scalar("vocab", int),
            "train_words": data.scalar("train_words", int),
            "train_lines": data.scalar("train_lines", int),
            "discounts": discounts.tolist(),
        }
        parts = [
            (data[f"keys{n}"], data[f"logp{n}"], data[f"logbo{n}"] if n < order else None) for n in range(1, order + 1)
        ]
        for n, (keys, logp, logbo) in enumerate(parts, start=1):
            if (
                keys.dtype != np.uint64
                or logp.dtype != np.float64
                or logp.shape != keys.shape
                or (logbo is not None and logbo.shape != keys.shape)
                or keys.ndim != 1
            ):
                raise data.corrupt(f"holds order-{n} tables of shapes {keys.shape}, {logp.shape}")
        return cls(order, fold_digits, [_Table(*p) for p in parts], log_unk, meta)

    @property
    def stats(self) -> dict[str, Any]:
        """order, fold_digits, ngrams (distinct n-grams per order, <s> not counted), vocab (distinct
        words and </s>), discounts ([D1, D2, D3+] per order), train_words, train_lines: JSON-ready."""
        ngrams = [len(t.keys) - (1 if n == 1 else 0) for n, t in enumerate(self._tables, start=1)]
        return {"order": self.order, "fold_digits": self.fold_digits, "ngrams": ngrams, **self._meta}


# -----------------------------------------------------------------------------------------------
# helpers of train() and score()


def _read_lines(texts: Iterable[str], fold_digits: bool) -> tuple[np.ndarray, np.ndarray]:
    """All non-empty lines' word hashes, concatenated, and each line's word count."""
    hashes: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for text in texts:
        for piece in _pieces(text, _BATCH_CHARS):
            piece_hashes, piece_lengths = _text_lines(piece, fold_digits)
            hashes.append(piece_hashes)
            lengths.append(piece_lengths)
    if not lengths:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate(hashes), np.concatenate(lengths)


def _line_batches(texts: Sequence[str], fold_digits: bool) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(word hashes, words per line, text index per line) for about _BATCH_CHARS of text at a time;
    a long text is cut between lines, so memory stays bounded whatever the texts."""
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    held = 0
    for t, text in enumerate(texts):
        for piece in _pieces(text, _BATCH_CHARS):
            hashes, lengths = _text_lines(piece, fold_digits)
            parts.append((hashes, lengths, np.full(len(lengths), t, dtype=np.int64)))
            held += len(piece) + 1
            if held >= _BATCH_CHARS:
                yield _concatenate(parts)
                parts, held = [], 0
    if parts:
        yield _concatenate(parts)


def _concatenate(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    hashes, lengths, owner = zip(*parts)
    return np.concatenate(hashes), np.concatenate(lengths), np.concatenate(owner)


class _Grams:
    """One order's distinct n-grams while training: keys (sorted), raw counts, whether each starts
    with <s>, and the indices (into order n - 1) of its context and of its suffix."""

    def __init__(
        self, keys: np.ndarray, raw: np.ndarray, bos: np.ndarray, context: np.ndarray | None, suffix: np.ndarray | None
    ):
        self.keys, self.raw, self.bos, self.context, self.suffix = keys, raw, bos, context, suffix
        self.continuation: np.ndarray | None = None  # distinct left extensions; set by order n + 1


def _count(seq: np.ndarray, off: np.ndarray, top: int) -> list[_Grams]:
    """The distinct n-grams of orders 1..top of the sentences in `seq`. Order 1 includes <s> (a
    context, never predicted); an n-gram of order n >= 2 ends at a predicted token and may start at <s>."""
    grams: list[_Grams] = []
    acc = np.zeros(len(seq), dtype=np.uint64)
    prev_id = np.zeros(0, dtype=np.int32)
    for n in range(1, top + 1):
        acc[n - 1 :] += seq[: len(seq) - (n - 1)] * MULTIPLIERS[n - 1]  # perf: in place; no per-order copy
        at = np.arange(len(seq)) if n == 1 else np.flatnonzero(off >= n - 1)
        keys, raw, inverse, first = _group(_keys(acc[at], n))
        rep = at[first]  # where one occurrence of each distinct n-gram ends
        gram_id = np.full(len(seq), -1, dtype=np.int32)
        gram_id[at] = inverse
        if n == 1:
            grams.append(_Grams(keys, raw, seq[rep] == _BOS, None, None))
        else:
            # context: the (n-1)-gram ending one token earlier; suffix: the (n-1)-gram ending here
            context, suffix = prev_id[rep - 1], prev_id[rep]
            grams.append(_Grams(keys, raw, off[rep] == n - 1, context, suffix))
            grams[-2].continuation = np.bincount(suffix, minlength=len(grams[-2].keys)).astype(np.int32)
        prev_id = gram_id
    return grams


def _smooth(grams: list[_Grams], top: int) -> tuple[list[_Table], float, list[list[float]], int]:
    """Interpolated modified KN from the counts, order 1 upward (each order interpolates with the
    one below): the tables, log10 p(<unk>), the discounts and the vocabulary size. Empties `grams`
    as it goes (each order's counts are freed once the next order has used them)."""
    tables: list[_Table] = []
    discounts: list[list[float]] = []
    lower = np.zeros(0)
    log_unk = 0.0
    vocab = 0
    for n in range(1, top + 1):
        g = grams[n - 1]
        if n >= 2:  # order n - 1's keys live on in its table; its counts are done with
            grams[n - 2] = None  # type: ignore[call-overload]
        # adjusted counts: raw at the top order and for n-grams opening with <s> (nothing precedes
        # <s>, so they have no left extensions); distinct left extensions otherwise
        adjusted = g.raw if n == top else np.where(g.bos, g.raw, g.continuation)
        event = np.ones(len(adjusted), dtype=bool)
        if n == 1:
            event = ~g.bos  # <s> alone is a context only: no probability, not in the vocabulary
            adjusted = np.where(event, adjusted, 0)
        d = _discounts(np.bincount(adjusted[event], minlength=5))
        discounts.append([float(x) for x in d])
        discount = np.array((0.0, *d))[np.minimum(adjusted, 3)]
        if n == 1:
            vocab = int(event.sum())
            total = float(adjusted.sum())
            gamma = float(discount.sum()) / total  # the mass taken from seen words, given to all
            prob = (adjusted - discount) / total + gamma / (vocab + 1)
            log_unk = float(np.log10(gamma / (vocab + 1)))
        else:
            # per context h: S(h) = sum of counts, gamma(h) = (D1 N1 + D2 N2 + D3+ N3+) / S(h)
            total = np.bincount(g.context, weights=adjusted, minlength=len(tables[n - 2].keys))
            taken = np.bincount(g.context, weights=discount, minlength=len(total))
            prob = (adjusted - discount) / total[g.context] + (taken / np.maximum(total, 1))[g.context] * lower[
                g.suffix
            ]
            # the lower order's backoff: log10 gamma(h) where h is a context, 0 (weight 1) elsewhere
            seen = total > 0
            tables[n - 2].logbo[seen] = np.log10(taken[seen] / total[seen])
        logp = np.log10(np.where(event, prob, 1.0))
        logp[~event] = -np.inf  # <s>: never predicted
        tables.append(_Table(g.keys, logp, np.zeros(len(g.keys)) if n < top else None))
        lower = prob
    return tables, log_unk, discounts, vocab
