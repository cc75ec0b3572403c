"""A fastText-style linear classifier telling reference text (positives) from raw web text (negatives).

GPT-3, LLaMA and DCLM keep the web documents a linear model over word n-grams finds reference-like.
This is that model in numpy (the `fasttext` package cannot be installed beside `fasttext-predict`):
hashed word n-grams up to `ngrams` (normalized words of kiln.text.shingles), log-scaled and
L2-normalized per document, logistic regression trained with sparse Adagrad on class-balanced
mini-batches. Deterministic: same texts, settings and seed give the same weights, bit for bit, on
one machine (numpy's SIMD log and tanh may round differently on another CPU).
Not handled here: fastText's learned embeddings and subword (character n-gram) features, more than
two classes (kiln.curate.quality.labels trains one model per class), scripts written without spaces
(one word per run of characters, as in shingles), and the data split (the caller holds out documents
and chooses negatives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.core.errors import FatalError
from kiln.curate.quality.config import ClassifierConfig
from kiln.curate.quality.store import load_arrays, save_arrays
from kiln.text.shingles import MULTIPLIERS, mix64, text_hashes

FORMAT = "kiln-quality-classifier v1"
BATCH_DOCUMENTS = 32  # documents per Adagrad step
_CHUNK_WORDS = 1 << 20  # words featurized per numpy pass (~100 MB of temporaries at ngrams=2)
_EPSILON = 1e-8  # Adagrad's guard against a zero accumulator
_TAG_SHIFT = np.uint64(62)  # the top 2 bits of a feature hash hold ngram length - 1 (ngrams <= 4)


@dataclass(frozen=True)
class _Features:
    """Sparse document vectors (CSR): document i's features are buckets/values[offsets[i]:offsets[i + 1]],
    buckets ascending within a document, values (1 + log tf) / L2 norm."""

    offsets: np.ndarray  # int64 [documents + 1]
    buckets: np.ndarray  # int32 [features] (buckets <= 2^26)
    values: np.ndarray  # float32 [features]

    @staticmethod
    def concatenate(parts: list[_Features]) -> _Features:
        starts = np.cumsum([0] + [len(p.buckets) for p in parts])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        return _Features(offsets, np.concatenate([p.buckets for p in parts]), np.concatenate([p.values for p in parts]))


def _featurize(texts: Sequence[str], ngrams: int, buckets: int, fold_digits: bool = True) -> _Features:
    """The normalized hashed-n-gram vectors of `texts`, a chunk of about a million words at a time."""
    parts: list[_Features] = []
    chunk: list[np.ndarray] = []
    words = 0
    for text in texts:
        chunk.append(text_hashes(text, fold_digits))
        words += len(chunk[-1])
        if words >= _CHUNK_WORDS:
            parts.append(_featurize_hashes(chunk, ngrams, buckets))
            chunk, words = [], 0
    if chunk or not parts:
        parts.append(_featurize_hashes(chunk, ngrams, buckets))
    return parts[0] if len(parts) == 1 else _Features.concatenate(parts)


def _featurize_hashes(per_text: list[np.ndarray], ngrams: int, buckets: int) -> _Features:
    """Featurize a batch of texts' word hashes in a few numpy passes over their concatenation."""
    documents = len(per_text)
    lengths = np.fromiter(map(len, per_text), dtype=np.int64, count=documents)
    flat = np.concatenate(per_text) if per_text else np.zeros(0, np.uint64)
    owner = np.repeat(np.arange(documents, dtype=np.int64), lengths)  # the text of each word
    keys = []
    for n in range(1, ngrams + 1):
        hashes, first_word = _gram_hashes(flat, owner, n)
        # owner * buckets + bucket < 2^63: buckets <= 2^26 and a chunk holds far fewer than 2^37 texts
        keys.append(owner[first_word] * buckets + (hashes % np.uint64(buckets)).astype(np.int64))
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    # perf: one sort of (text, bucket) keys counts term frequencies for the whole batch. On 5 MB of
    # /usr/share/doc text (766k words) this function takes 60 ms, the sort 10 ms of it; hashing the
    # words (text_hashes) takes 135 ms, so scoring runs at ~22 MB/s a core (numpy 2.4, Xeon).
    key.sort()
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    tf = np.diff(np.append(starts, len(key)))
    key = key[starts]
    doc = key // buckets
    values = 1.0 + np.log(tf)  # log-scaled tf: a word said ten times weighs 3.3, not 10
    # subtle: np.bincount sums in index order, so norms and scores never depend on threads or BLAS.
    norm = np.sqrt(np.bincount(doc, weights=values * values, minlength=documents))
    values /= norm[doc]  # every document present here has at least one feature, so norm > 0
    offsets = np.concatenate(([0], np.cumsum(np.bincount(doc, minlength=documents))))
    return _Features(offsets.astype(np.int64), (key - doc * buckets).astype(np.int32), values.astype(np.float32))


def _gram_hashes(flat: np.ndarray, owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hash of every n-gram of the concatenated word hashes `flat` that lies within one
    text (`owner`: the text of each word), and the index of its first word."""
    count = len(flat) - n + 1
    if count <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    # shingles' n-gram hash (position-weighted sum, murmur3 mixer) over the whole batch at once; an
    # n-gram is kept when its first and last words belong to the same text. Unlike shingles, a text
    # shorter than n words has no n-gram of that length.
    acc = flat[:count] * MULTIPLIERS[0]
    for j in range(1, n):
        acc += flat[j : j + count] * MULTIPLIERS[j]
    first_word = np.flatnonzero(owner[:count] == owner[n - 1 : n - 1 + count])
    # subtle: the top two bits carry n - 1, so an n-gram never has the 64-bit hash of a gram of
    # another length (in shingles a one-word text's "bigram" is its unigram).
    return (mix64(acc[first_word]) >> np.uint64(2)) | (np.uint64(n - 1) << _TAG_SHIFT), first_word


def _logits(feats: _Features, weights: np.ndarray, bias: float) -> np.ndarray:
    """bias + w . x for every document (float64; a document with no features gets the bias)."""
    documents = len(feats.offsets) - 1
    doc = np.repeat(np.arange(documents), np.diff(feats.offsets))
    products = feats.values.astype(np.float64) * weights[feats.buckets].astype(np.float64)
    return bias + np.bincount(doc, weights=products, minlength=documents)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow warning for |z| large, unlike 1 / (1 + exp(-z))


class HashedClassifier:
    """P(reference-like) = sigmoid(bias + weights . x(text)), x the hashed n-gram vector of the text."""

    def __init__(self, ngrams: int, buckets: int, fold_digits: bool, weights: np.ndarray, bias: float):
        assert weights.shape == (buckets,) and weights.dtype == np.float32, (weights.shape, weights.dtype)
        self.ngrams = ngrams
        self.buckets = buckets
        self.fold_digits = fold_digits
        self.weights = weights
        self.bias = float(bias)

    @classmethod
    def train(
        cls,
        positives: Sequence[str],
        negatives: Sequence[str],
        cfg: ClassifierConfig,
        seed: int = 0,
        fold_digits: bool = True,
    ) -> HashedClassifier:
        """Fit on reference texts (label 1) and raw texts (label 0), each class weighing half the loss."""
        if not positives or not negatives:
            raise FatalError(
                f"quality: the classifier needs both classes; got {len(positives)} reference documents and "
                f"{len(negatives)} raw ones; "
                "check quality.reference_source (or quality.reference) and curate.inputs"
            )
        labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
        return cls.fit([*positives, *negatives], labels, cfg, seed, fold_digits, balanced=True)

    @classmethod
    def fit(
        cls,
        texts: Sequence[str],
        targets: np.ndarray,
        cfg: ClassifierConfig,
        seed: int = 0,
        fold_digits: bool = True,
        balanced: bool = False,
    ) -> HashedClassifier:
        """Fit sigmoid(bias + w . x) to `targets` in [0, 1] (labels, or a scale mapped onto [0, 1]: logistic
        regression on soft targets) by `cfg.epochs` passes of Adagrad over mini-batches of BATCH_DOCUMENTS in
        an order drawn from `seed`. `balanced`: the documents of target >= 0.5 and the rest each weigh half
        the loss, whatever their counts."""
        feats = _featurize(texts, cfg.ngrams, cfg.buckets, fold_digits)
        labels = np.asarray(targets, dtype=np.float64)
        documents = len(labels)
        assert documents == len(texts) and ((labels >= 0) & (labels <= 1)).all(), "targets in [0, 1], one a text"
        high = int(np.sum(labels >= 0.5))
        # Class balance: each class weighs half the loss whatever its size (mean weight 1).
        balance = (
            np.where(labels >= 0.5, documents / (2 * max(high, 1)), documents / (2 * max(documents - high, 1)))
            if balanced
            else np.ones(documents)
        )
        weights = np.zeros(cfg.buckets, np.float32)
        squares = np.zeros(cfg.buckets, np.float32)  # Adagrad's per-bucket sum of squared gradients
        bias, bias_squares = 0.0, 0.0
        rng = np.random.default_rng(seed)
        lengths = np.diff(feats.offsets)
        for _ in range(cfg.epochs):
            # Lay the features out in this epoch's document order once, so every mini-batch is a slice.
            order = rng.permutation(documents)
            offsets = np.concatenate(([0], np.cumsum(lengths[order])))
            gather = np.arange(offsets[-1]) + np.repeat(feats.offsets[order] - offsets[:-1], lengths[order])
            buckets, values = feats.buckets[gather], feats.values[gather]  # a second copy: 8 bytes a feature
            for start in range(0, documents, BATCH_DOCUMENTS):
                docs = order[start : start + BATCH_DOCUMENTS]
                lo, hi = offsets[start], offsets[start + len(docs)]
                b, v = buckets[lo:hi], values[lo:hi].astype(np.float64)
                row = np.repeat(np.arange(len(docs)), lengths[docs])  # the batch row of each feature
                z = bias + np.bincount(row, weights=v * weights[b], minlength=len(docs))
                # d(weighted log loss)/dz, averaged over the batch
                residual = (_sigmoid(z) - labels[docs]) * balance[docs] / len(docs)
                # Sparse update: only the buckets this batch touches, each gradient summed once.
                touched, inverse = np.unique(b, return_inverse=True)
                grad = np.bincount(inverse, weights=residual[row] * v, minlength=len(touched))
                # L2 per document seen, applied lazily: only to weights a batch touches (as fastText
                # and Vowpal Wabbit do); untouched weights need no update.
                grad += cfg.l2 * weights[touched]
                squares[touched] += (grad * grad).astype(np.float32)
                weights[touched] -= (cfg.lr * grad / (np.sqrt(squares[touched], dtype=np.float64) + _EPSILON)).astype(
                    np.float32
                )
                bias_grad = float(residual.sum())
                bias_squares += bias_grad * bias_grad
                bias -= cfg.lr * bias_grad / (np.sqrt(bias_squares) + _EPSILON)
        return cls(cfg.ngrams, cfg.buckets, fold_digits, weights, bias)

    def scores(self, texts: Sequence[str]) -> np.ndarray:
        """P(reference-like) of each text, float64 in [0, 1]; a text with no words scores sigmoid(bias)."""
        feats = _featurize(texts, self.ngrams, self.buckets, self.fold_digits)
        return _sigmoid(_logits(feats, self.weights, self.bias))

    def save(self, path: Path) -> None:
        """One .npz (kiln.curate.quality.store) holding the settings, weights and bias; atomic, repeatable."""
        arrays = {
            "ngrams": np.array(self.ngrams),
            "buckets": np.array(self.buckets),
            "fold_digits": np.array(self.fold_digits),
            "weights": self.weights,
            "bias": np.array(self.bias),
        }
        save_arrays(path, FORMAT, arrays)

    @classmethod
    def load(cls, path: Path) -> HashedClassifier:
        """Read a classifier saved by `save`; FatalError when the file is missing, foreign, of another
        format or corrupt."""
        data = load_arrays(path, FORMAT, "classifier", "train it again with `kiln quality train-classifier`")
        ngrams, buckets, fold_digits = (
            data.scalar("ngrams", int),
            data.scalar("buckets", int),
            data.scalar("fold_digits", bool),
        )
        weights, bias = data["weights"], data.scalar("bias", float)
        if weights.shape != (buckets,) or weights.dtype != np.float32 or not 1 <= ngrams <= 4:
            raise data.corrupt(
                f"holds weights {weights.dtype}{list(weights.shape)} for {buckets} buckets and ngrams={ngrams}"
            )
        return cls(ngrams, buckets, fold_digits, weights, bias)


def evaluate(labels: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """precision, recall, f1, accuracy of `scores >= threshold` against `labels` (1 or True: positive);
    auc: the probability a positive outscores a negative, ties counting half (Mann-Whitney U / PN);
    positives, negatives: the counts. Precision, recall, f1 are 0 when undefined; auc is nan without
    both classes."""
    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    if labels.shape != scores.shape or labels.ndim != 1:
        raise ValueError(f"labels {labels.shape} and scores {scores.shape} must be two vectors of one length")
    predicted = scores >= threshold
    tp = int(np.sum(predicted & labels))
    fp = int(np.sum(predicted & ~labels))
    fn = int(np.sum(~predicted & labels))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0  # the harmonic mean of precision and recall
    positives, negatives = scores[labels], np.sort(scores[~labels])
    if len(positives) and len(negatives):
        # For each positive: negatives strictly below count 1, ties 1/2. Counted in integers
        # (twice the U statistic), so the result is exact up to the final division.
        below = np.searchsorted(negatives, positives, side="left")
        at_most = np.searchsorted(negatives, positives, side="right")
        auc = int(np.sum(below + at_most)) / (2 * len(positives) * len(negatives))
    else:
        auc = float("nan")
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": float(np.mean(predicted == labels)) if len(labels) else float("nan"),
        "auc": auc,
        "positives": float(len(positives)),
        "negatives": float(len(negatives)),
    }
