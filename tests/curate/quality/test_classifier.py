import glob
import math
import os
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.curate.quality import classifier as clf_module
from kiln.curate.quality.classifier import FORMAT, HashedClassifier, _featurize, _gram_hashes, evaluate
from kiln.curate.quality.config import ClassifierConfig
from kiln.text.shingles import text_hashes

CFG = ClassifierConfig()


def rows(feats) -> list[dict[int, float]]:
    """Each document's features as {bucket: value}."""
    return [
        dict(zip(feats.buckets[a:b].tolist(), feats.values[a:b].tolist()))
        for a, b in zip(feats.offsets[:-1], feats.offsets[1:])
    ]


def split(pos: list[str], neg: list[str], seed: int = 0) -> tuple[list[str], list[str], list[str], np.ndarray]:
    """80% of each class to train on, the rest held out (texts and labels)."""
    rng = random.Random(seed)
    pos, neg = rng.sample(pos, len(pos)), rng.sample(neg, len(neg))
    p, n = int(0.8 * len(pos)), int(0.8 * len(neg))
    return pos[:p], neg[:n], pos[p:] + neg[n:], np.r_[np.ones(len(pos) - p), np.zeros(len(neg) - n)]


def assert_separates(pos: list[str], neg: list[str]) -> dict[str, float]:
    train_pos, train_neg, heldout, labels = split(pos, neg)
    model = HashedClassifier.train(train_pos, train_neg, CFG)
    report = evaluate(labels, model.scores(heldout))
    assert report["auc"] > 0.95 and report["precision"] > 0.9 and report["recall"] > 0.9, report
    return report


# --- synthetic sources --------------------------------------------------------------------------

VOCAB = [a + b + c for a in "bdfgkmnprst" for b in "aeiou" for c in "lmnprst"][
    :300
]  # letters only: digits would fold to 0


def markov_docs(seed: int, count: int) -> list[str]:
    """Documents from a fixed Markov chain over VOCAB: each word has 3 likely successors."""
    chain = random.Random(42)
    successors = {w: chain.sample(VOCAB, 3) for w in VOCAB}
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        words = [rng.choice(VOCAB)]
        for _ in range(rng.randint(30, 80)):
            words.append(rng.choice(successors[words[-1]]) if rng.random() < 0.8 else rng.choice(VOCAB))
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def shuffled(docs: list[str], seed: int) -> list[str]:
    """The same words per document in a random order: unigram counts identical, bigrams not."""
    rng = random.Random(seed)
    return [" ".join(rng.sample(d.rstrip(".").split(), len(d.split()))) for d in docs]


def test_separates_two_word_distributions():
    # One Zipf distribution over VOCAB, and the same with 10 words of its top 50 swapped for
    # others: 20 to 60 words a document, a close call for unigram counts (held-out AUC 0.997).
    rng = random.Random(0)
    ranks_a = rng.sample(VOCAB, len(VOCAB))
    ranks_b = ranks_a[:]
    for _ in range(10):
        i, j = rng.randrange(50), rng.randrange(len(VOCAB))
        ranks_b[i], ranks_b[j] = ranks_b[j], ranks_b[i]
    zipf = [1 / (r + 1) for r in range(len(VOCAB))]

    def docs(ranks: list[str]) -> list[str]:
        return [" ".join(rng.choices(ranks, zipf, k=rng.randint(20, 60))) for _ in range(500)]

    assert_separates(docs(ranks_a), docs(ranks_b))


def test_bigrams_separate_what_unigrams_cannot():
    # A document and its word-shuffled twin have the same unigram vector, exactly.
    pos = markov_docs(1, 600)
    neg = shuffled(markov_docs(2, 600), 3)
    assert_separates(pos, neg)
    train_pos, train_neg, heldout, labels = split(pos, neg)
    unigram = HashedClassifier.train(train_pos, train_neg, ClassifierConfig(ngrams=1))
    assert abs(evaluate(labels, unigram.scores(heldout))["auc"] - 0.5) < 0.1


def paragraphs(text: str) -> list[str]:
    return [p for p in (" ".join(x.split()) for x in text.split("\n\n")) if len(p.split()) >= 20]


def test_separates_python_docs_from_licenses():
    # Real text: Python's pydoc topics (reference) against the license texts of the system.
    from pydoc_data.topics import topics

    files = sorted({os.path.realpath(p) for p in glob.glob("/usr/share/common-licenses/*")})
    licenses = sorted({p for f in files for p in paragraphs(open(f, encoding="utf-8", errors="replace").read())})
    if len(licenses) < 100:
        pytest.skip("needs /usr/share/common-licenses (Debian's base-files)")
    python = sorted({p for text in topics.values() for p in paragraphs(text)})
    assert_separates(python, licenses)


# --- evaluate -----------------------------------------------------------------------------------


def test_evaluate_by_hand():
    labels = np.array([1, 1, 0, 1, 0, 0])
    scores = np.array([0.9, 0.6, 0.6, 0.4, 0.3, 0.7])
    # At 0.5: predicted 1 1 1 0 0 1, so tp=2, fp=2, fn=1, tn=1.
    # AUC: 0.9 beats 3 negatives; 0.6 beats 0.3, ties 0.6 (1/2), loses to 0.7; 0.4 beats 0.3.
    # (3 + 1.5 + 1) / (3 * 3) = 11/18.
    assert evaluate(labels, scores) == {
        "precision": 2 / 4,
        "recall": 2 / 3,
        "f1": 4 / 7,
        "accuracy": 3 / 6,
        "auc": 11 / 18,
        "positives": 3.0,
        "negatives": 3.0,
    }
    assert evaluate(labels, scores, threshold=0.65)["precision"] == 1 / 2  # 0.9 and 0.7 predicted
    assert math.isnan(evaluate(np.ones(3), scores[:3])["auc"])  # no negatives: undefined


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=40))
def test_auc_is_the_pairwise_fraction(pairs):
    labels = np.array([label for label, _ in pairs])
    scores = np.array([score / 5 for _, score in pairs])  # few distinct values: many ties
    pos, neg = scores[labels], scores[~labels]
    report = evaluate(labels, scores)
    if not len(pos) or not len(neg):
        assert math.isnan(report["auc"])
        return
    twice_wins = sum(2 if p > n else 1 if p == n else 0 for p in pos for n in neg)
    assert report["auc"] == twice_wins / (2 * len(pos) * len(neg))


# --- features -----------------------------------------------------------------------------------


def test_features_by_hand():
    # "a b a", unigrams: tf(a)=2, tf(b)=1 -> (1 + ln 2, 1) / sqrt((1 + ln 2)^2 + 1)
    (row,) = rows(_featurize(["a b a"], 1, 1 << 20))
    (a,) = rows(_featurize(["a"], 1, 1 << 20))[0]
    norm = math.hypot(1 + math.log(2), 1)
    assert sorted(row.values()) == pytest.approx([1 / norm, (1 + math.log(2)) / norm], rel=1e-6)
    assert row[a] == pytest.approx((1 + math.log(2)) / norm, rel=1e-6)


def test_features_normalize_case_and_punctuation():
    plain, noisy, reordered = rows(
        _featurize(["new york is big", "New-York... IS (big)!", "york new is big"], 2, 1 << 20)
    )
    assert plain == noisy
    assert plain != reordered  # the bigrams differ
    assert set(rows(_featurize(["new york is big"], 1, 1 << 20))[0]) == set(
        rows(_featurize(["york new is big"], 1, 1 << 20))[0]
    )


def test_bigram_differs_from_its_unigrams():
    unigrams = set(rows(_featurize(["new york"], 1, 1 << 26))[0])
    both = set(rows(_featurize(["new york"], 2, 1 << 26))[0])
    assert len(unigrams) == 2 and len(both) == 3 and unigrams < both
    # A one-word text has no bigram (shingles would hash its word alone as the "bigram").
    assert rows(_featurize(["new"], 2, 1 << 26)) == rows(_featurize(["new"], 1, 1 << 26))
    # By construction: the top two bits of a gram's 64-bit hash are its length - 1.
    flat = text_hashes("a b c d e")
    owner = np.zeros(len(flat), np.int64)
    for n in (1, 2, 3, 4):
        hashes, _ = _gram_hashes(flat, owner, n)
        assert len(hashes) == 5 - n + 1 and (hashes >> np.uint64(62) == n - 1).all()


def test_batches_and_chunks_do_not_change_features(monkeypatch):
    texts = ["one two three", "", "four", "five six seven eight", "!!!", "two three four"]
    alone = [row for t in texts for row in rows(_featurize([t], 2, 1 << 20))]
    assert rows(_featurize(texts, 2, 1 << 20)) == alone  # no n-gram spans two texts
    monkeypatch.setattr(clf_module, "_CHUNK_WORDS", 3)
    assert rows(_featurize(texts, 2, 1 << 20)) == alone


# --- training, scoring, files -------------------------------------------------------------------


@pytest.fixture(scope="module")
def data() -> tuple[list[str], list[str]]:
    return markov_docs(1, 200), shuffled(markov_docs(2, 200), 3)


def test_training_is_deterministic(data):
    pos, neg = data
    a = HashedClassifier.train(pos, neg, CFG, seed=7)
    b = HashedClassifier.train(pos, neg, CFG, seed=7)
    assert a.weights.dtype == np.float32 and a.weights.shape == (CFG.buckets,)
    assert np.array_equal(a.weights, b.weights) and a.bias == b.bias
    c = HashedClassifier.train(pos, neg, CFG, seed=8)
    assert not np.array_equal(a.weights, c.weights)  # the seed orders the mini-batches


def test_scores(data):
    pos, neg = data
    model = HashedClassifier.train(pos, neg, CFG)
    texts = [*pos[:5], "", "... !!!", *neg[:5]]
    scores = model.scores(texts)
    assert scores.dtype == np.float64 and ((scores >= 0) & (scores <= 1)).all()
    assert (
        scores[5] == scores[6] == pytest.approx(1 / (1 + math.exp(-model.bias)), rel=1e-12)
    )  # no words: the bias alone
    assert np.array_equal(scores, np.concatenate([model.scores([t]) for t in texts]))  # batching changes nothing
    assert model.scores([]).shape == (0,)
    with pytest.raises(FatalError, match="both classes"):
        HashedClassifier.train(pos, [], CFG)


def test_save_load_round_trip(data, tmp_path):
    pos, neg = data
    model = HashedClassifier.train(pos, neg, ClassifierConfig(ngrams=3, buckets=1 << 12), fold_digits=False)
    path = tmp_path / "classifier.npz"
    model.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["classifier.npz"]  # no temporary left behind
    loaded = HashedClassifier.load(path)
    assert (loaded.ngrams, loaded.buckets, loaded.fold_digits, loaded.bias) == (3, 1 << 12, False, model.bias)
    assert np.array_equal(loaded.weights, model.weights)
    texts = pos[:10] + neg[:10] + ["Digits 123 matter here"]
    assert np.array_equal(loaded.scores(texts), model.scores(texts))


def test_load_rejects_bad_files(data, tmp_path):
    pos, neg = data
    good = tmp_path / "good.npz"
    HashedClassifier.train(pos[:20], neg[:20], ClassifierConfig(buckets=1 << 12)).save(good)
    blob = good.read_bytes()
    cases = {
        "missing.npz": None,
        "text.npz": b"not a classifier\n",
        "truncated.npz": blob[: len(blob) // 2],
        "empty.npz": b"",
    }
    for name, content in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
    np.save(tmp_path / "array.npy", np.zeros(3))
    np.savez(tmp_path / "foreign.npz", weights=np.zeros(3))
    np.savez(tmp_path / "old.npz", format=np.array("kiln-quality-classifier v0"))
    for name in [*cases, "array.npy", "foreign.npz", "old.npz"]:
        with pytest.raises(FatalError, match="train-classifier") as info:
            HashedClassifier.load(tmp_path / name)
        assert str(tmp_path / name) in str(info.value)
    with pytest.raises(FatalError, match=FORMAT):
        HashedClassifier.load(tmp_path / "old.npz")
