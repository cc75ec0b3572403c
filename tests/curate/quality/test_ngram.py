"""kiln.curate.quality.ngram: interpolated modified Kneser-Ney checked by hand, against a plain-Python
reference of the definition (not the ARPA backoff form the model stores), for normalization per
context, and on real text (held-out prose beats the same words shuffled)."""

from __future__ import annotations

import math
import random
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.core.errors import FatalError
from kiln.curate.quality import ngram
from kiln.curate.quality.ngram import _BOS, _EOS, FORMAT, NGramLM, _discounts, _text_lines
from kiln.text.shingles import text_hashes

BOS, EOS = "<s>", "</s>"


# -----------------------------------------------------------------------------------------------
# a slow reference: Chen & Goodman's recursion over word tuples, with lmplz's conventions


class ReferenceKN:
    """Interpolated modified KN straight from the definition: p(w|h) = max(a(hw) - D(a(hw)), 0) / S(h)
    + gamma(h) p(w|h'), where a is the adjusted count (raw at the top order and for n-grams opening
    with <s>, distinct left extensions otherwise), S(h) = sum_w a(hw), gamma(h) = sum_w D(a(hw)) / S(h);
    p(w|h) = p(w|h') when h was never a context; the empty context interpolates with 1 / (vocab + 1)."""

    def __init__(self, lines: list[list[str]], order: int):
        self.order = order
        raw: list[Counter[tuple[str, ...]]] = [Counter() for _ in range(order + 1)]
        for words in lines:
            s = [BOS, *words, EOS]
            for i in range(1, len(s)):
                for n in range(1, min(order, i + 1) + 1):
                    raw[n][tuple(s[i - n + 1 : i + 1])] += 1
        self.adjusted: list[dict[tuple[str, ...], int]] = [{} for _ in range(order + 1)]
        for n in range(1, order + 1):
            for g, c in raw[n].items():
                if n == order or g[0] == BOS:
                    self.adjusted[n][g] = c
                else:
                    self.adjusted[n][g] = sum(1 for longer in raw[n + 1] if longer[1:] == g)
        self.discounts = [(0.0, 0.0, 0.0)] + [
            self._discounts(Counter(self.adjusted[n].values())) for n in range(1, order + 1)
        ]
        self.vocab = {g[0] for g in raw[1]}  # words and </s>; <s> is never predicted

    @staticmethod
    def _discounts(coc: Counter[int]) -> tuple[float, float, float]:
        t1, t2, t3, t4 = (coc[k] for k in (1, 2, 3, 4))
        if min(t1, t2, t3, t4) > 0:
            y = t1 / (t1 + 2 * t2)
            d = (1 - 2 * y * t2 / t1, 2 - 3 * y * t3 / t2, 3 - 4 * y * t4 / t3)
            if 0 < d[0] <= 1 and 0 < d[1] <= 2 and 0 < d[2] <= 3:
                return d
        return (0.5, 1.0, 1.5)

    def discount(self, n: int, count: int) -> float:
        return 0.0 if count == 0 else self.discounts[n][min(count, 3) - 1]

    def prob(self, word: str, context: tuple[str, ...]) -> float:
        n = len(context) + 1
        if n == 1:
            counts = self.adjusted[1]
            total = sum(counts.values())
            gamma = sum(self.discount(1, c) for c in counts.values()) / total
            c = counts.get((word,), 0)
            return (c - self.discount(1, c)) / total + gamma / (len(self.vocab) + 1)
        followers = {g: c for g, c in self.adjusted[n].items() if g[:-1] == context}
        if not followers:
            return self.prob(word, context[1:])
        total = sum(followers.values())
        gamma = sum(self.discount(n, c) for c in followers.values()) / total
        c = followers.get((*context, word), 0)
        return (c - self.discount(n, c)) / total + gamma * self.prob(word, context[1:])

    def sentence_log10(self, words: list[str]) -> float:
        s = [BOS, *words, EOS]
        return sum(math.log10(self.prob(s[i], tuple(s[max(0, i - self.order + 1) : i]))) for i in range(1, len(s)))


# -----------------------------------------------------------------------------------------------
# by hand


def test_discounts_by_hand() -> None:
    # t1..t4 = 10, 4, 2, 1: Y = 10 / (10 + 2*4) = 5/9
    # D1 = 1 - 2 Y t2/t1 = 1 - 2 (5/9)(4/10) = 5/9; D2 = 2 - 3 Y t3/t2 = 2 - 3 (5/9)(2/4) = 7/6
    # D3+ = 3 - 4 Y t4/t3 = 3 - 4 (5/9)(1/2) = 17/9
    assert _discounts(np.array([0, 10, 4, 2, 1])) == pytest.approx((5 / 9, 7 / 6, 17 / 9), abs=1e-15)
    # a zero count-of-counts, or a discount outside (0, k], gives lmplz's fallback:
    assert _discounts(np.array([0, 10, 4, 0, 1])) == (0.5, 1.0, 1.5)  # t3 = 0
    assert _discounts(np.array([0, 10, 4, 1, 5])) == (0.5, 1.0, 1.5)  # D3+ = 3 - 4 (5/9)(5/1) < 0


def test_hand_worked_bigram_model() -> None:
    # Corpus, order 2:  <s> a b </s> | <s> a </s> | <s> b a </s> | <s> c </s>
    # Bigrams (top order: raw counts): <s>a 2, ab 1, b</s> 1, a</s> 2, <s>b 1, ba 1, <s>c 1, c</s> 1
    #   count-of-counts t1 = 6, t2 = 2, t3 = 0: fallback discounts D1 = 0.5, D2 = 1, D3+ = 1.5
    # Unigrams (continuation counts: distinct words before): a {<s>, b} 2, b {a, <s>} 2, c {<s>} 1,
    #   </s> {b, a, c} 3; vocab 4. t4 = 0: fallback again.
    #   S = 8; taken = D2 + D2 + D1 + D3+ = 1 + 1 + 0.5 + 1.5 = 4; gamma = 4/8 = 0.5; uniform 0.5/(4+1) = 0.1
    #   p(a) = p(b) = (2-1)/8 + 0.1 = 0.225; p(c) = 0.5/8 + 0.1 = 0.1625; p(</s>) = 1.5/8 + 0.1 = 0.2875
    #   p(<unk>) = 0.1; the five sum to 1.
    # Context <s>: a 2, b 1, c 1; S = 4, taken = 1 + 0.5 + 0.5 = 2, gamma = 0.5
    #   p(a|<s>) = 1/4 + 0.5 * 0.225 = 0.3625; p(b|<s>) = 0.5/4 + 0.5 * 0.225 = 0.2375
    #   p(</s>|<s>) = 0.5 * 0.2875 = 0.14375 (unseen bigram: gamma times the unigram)
    #   p(d|<s>) = 0.5 * 0.1 = 0.05 (unseen word)
    # Context a: b 1, </s> 2; S = 3, taken = 0.5 + 1 = 1.5, gamma = 0.5
    #   p(b|a) = 0.5/3 + 0.5 * 0.225 = 0.2791666...; p(</s>|a) = 1/3 + 0.5 * 0.2875 = 0.4770833...
    # Context b: </s> 1, a 1; S = 2, taken = 1, gamma = 0.5: p(</s>|b) = 0.5/2 + 0.5 * 0.2875 = 0.39375
    model = NGramLM.train(["a b\na", "b a", "c"], order=2)
    assert model.stats["vocab"] == 4 and model.stats["ngrams"] == [4, 8]
    assert model.stats["discounts"] == [[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]]
    cases = {
        "a b": 0.3625 * (0.5 / 3 + 0.5 * 0.225) * 0.39375,  # p(a|<s>) p(b|a) p(</s>|b)
        "a": 0.3625 * (1 / 3 + 0.5 * 0.2875),  # p(a|<s>) p(</s>|a)
        "b": 0.2375 * 0.39375,  # p(b|<s>) p(</s>|b)
        "d": 0.05 * 0.2875,  # p(<unk>|<s>) p(</s>|<unk>): the unseen context backs off with weight 1
        "a a": 0.3625 * (0.5 * 0.225) * (1 / 3 + 0.5 * 0.2875),  # p(a|a) = gamma(a) p(a): unseen bigram
    }
    log10_sum, tokens = model.score(list(cases))
    np.testing.assert_allclose(log10_sum, np.log10(list(cases.values())), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(tokens, [3, 2, 2, 2, 3])
    assert model.perplexities(["a b"])[0] == pytest.approx(cases["a b"] ** (-1 / 3), abs=1e-12)


# -----------------------------------------------------------------------------------------------
# against the reference

VOCAB = list("abcdefgh")


def _model_and_reference(lines: list[list[str]], order: int) -> tuple[NGramLM, ReferenceKN]:
    return NGramLM.train(["\n".join(" ".join(w) for w in lines)], order=order), ReferenceKN(lines, order)


@settings(max_examples=30, deadline=None)
@given(
    lines=st.lists(st.lists(st.sampled_from(VOCAB[:6]), min_size=1, max_size=7), min_size=1, max_size=6),
    order=st.integers(1, 4),
    tests=st.lists(st.lists(st.sampled_from(VOCAB[:6] + ["zz"]), min_size=1, max_size=8), min_size=1, max_size=5),
)
def test_matches_reference_on_random_corpora(lines: list[list[str]], order: int, tests: list[list[str]]) -> None:
    model, ref = _model_and_reference(lines, order)
    texts = [" ".join(t) for t in tests] + ["\n".join(" ".join(w) for w in lines)]
    log10_sum, tokens = model.score(texts)
    expected = [ref.sentence_log10(t) for t in tests] + [sum(ref.sentence_log10(w) for w in lines)]
    np.testing.assert_allclose(log10_sum, expected, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(tokens, [len(t) + 1 for t in tests] + [sum(len(w) + 1 for w in lines)])


def test_matches_reference_where_discounts_come_from_counts() -> None:
    # Zipf-distributed words, enough of them that every order's t1..t4 are positive (the unigrams'
    # continuation counts too): the discounts come from the formula, not the fallback.
    rng = random.Random(7)
    words = [a + b for a in "abc" for b in "abcdefghijklmnopqrst"]  # 60
    weights = [1 / rank for rank in range(1, len(words) + 1)]
    lines = [rng.choices(words, weights, k=rng.randint(1, 9)) for _ in range(100)]
    model, ref = _model_and_reference(lines, 3)
    assert all(d != [0.5, 1.0, 1.5] for d in model.stats["discounts"])
    np.testing.assert_allclose(model.stats["discounts"], ref.discounts[1:], rtol=0, atol=1e-12)
    tests = [rng.choices([*words, "zz"], k=rng.randint(1, 10)) for _ in range(40)]
    log10_sum, _ = model.score([" ".join(t) for t in tests])
    np.testing.assert_allclose(log10_sum, [ref.sentence_log10(t) for t in tests], rtol=0, atol=1e-9)


# -----------------------------------------------------------------------------------------------
# normalization: every context's distribution sums to 1


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_context_sums_to_one(order: int) -> None:
    rng = random.Random(order)
    lines = [[rng.choice(VOCAB[: rng.randint(2, 8)]) for _ in range(rng.randint(1, 7))] for _ in range(60)]
    model, ref = _model_and_reference(lines, order)
    words = sorted(ref.vocab)
    unseen = ["zz", "yy", "xx"][: max(order - 1, 1)]  # distinct unseen words pad a context
    contexts = {()} | {g[:-1] for n in range(2, order + 1) for g in ref.adjusted[n]}
    for context in sorted(contexts):
        # a token sequence whose last word has exactly `context` before it in the model's view: a
        # context opening with <s> starts the line; another is preceded by unseen words, whose
        # longer contexts are unseen (backoff weight 1), so p is the order len(context) + 1 one
        prefix = list(context) if context[:1] == (BOS,) else [BOS, *unseen[: order - 1 - len(context)], *context]
        probs = []
        for word in [*words, "qq"]:  # qq: an unseen word, <unk>'s mass
            tokens = np.array([_token_hash(t) for t in [*prefix, word]], dtype=np.uint64)
            probs.append(10.0 ** model._log10_probs(tokens, np.arange(len(tokens), dtype=np.int32))[-1])
        assert sum(probs) == pytest.approx(1.0, abs=1e-9), context
        # and each is the reference's p(w | context)
        np.testing.assert_allclose(probs[:-1], [ref.prob(w, context) for w in words], rtol=0, atol=1e-12)


def _token_hash(token: str) -> np.uint64:
    return {BOS: _BOS, EOS: _EOS}.get(token) or text_hashes(token)[0]


# -----------------------------------------------------------------------------------------------
# real text


def _prose() -> list[str]:
    from pydoc_data.topics import topics

    paragraphs = [p for _, text in sorted(topics.items()) for p in text.split("\n\n") if len(p.split()) >= 8]
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file() and not path.is_symlink():
            paragraphs += [
                p for p in path.read_text(encoding="utf-8", errors="replace").split("\n\n") if len(p.split()) >= 8
            ]
    return paragraphs


def test_heldout_text_beats_its_shuffled_words() -> None:
    paragraphs = _prose()
    if len(paragraphs) < 200:
        pytest.skip("too little local prose (pydoc_data, /usr/share/common-licenses)")
    train, heldout = paragraphs[0::2], paragraphs[1::2][:300]
    model = NGramLM.train(train, order=4)
    rng = random.Random(0)

    def shuffled(text: str) -> str:
        return "\n".join(" ".join(rng.sample(line.split(), len(line.split()))) for line in text.split("\n"))

    real = model.perplexities(heldout)
    mixed = model.perplexities([shuffled(p) for p in heldout])
    # measured: median perplexity 100 against 419 shuffled; shuffling raises it for 97% of the paragraphs
    assert np.median(real) * 2 < np.median(mixed)
    assert np.mean(real < mixed) > 0.9


# -----------------------------------------------------------------------------------------------
# files, edges


def test_save_load_round_trip(tmp_path: Path) -> None:
    texts = ["the cat sat on the mat\nthe dog sat on the log", "a cat and a dog"]
    model = NGramLM.train(texts, order=3)
    model.save(tmp_path / "lm.npz")
    again = NGramLM.load(tmp_path / "lm.npz")
    probe = ["the cat sat on the log", "a dog sat", "unseen words here", ""]
    for got, want in zip(again.score(probe), model.score(probe)):
        np.testing.assert_array_equal(got, want)
    assert again.stats == model.stats and again.order == 3 and again.fold_digits
    # deterministic: the same texts give the same bytes
    NGramLM.train(texts, order=3).save(tmp_path / "again.npz")
    assert (tmp_path / "lm.npz").read_bytes() == (tmp_path / "again.npz").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_load_rejects_missing_foreign_and_truncated_files(tmp_path: Path) -> None:
    with pytest.raises(FatalError, match="no n-gram model at .*missing.npz"):
        NGramLM.load(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not a model")
    with pytest.raises(FatalError, match="text.npz is not a readable n-gram model"):
        NGramLM.load(tmp_path / "text.npz")
    np.savez(tmp_path / "other.npz", format=np.array("kiln-ngram v0"), weights=np.zeros(3))
    with pytest.raises(FatalError, match=f"other.npz is 'kiln-ngram v0'.*reads '{FORMAT}'"):
        NGramLM.load(tmp_path / "other.npz")
    NGramLM.train(["a b c\nb c d"], order=2).save(tmp_path / "lm.npz")
    data = (tmp_path / "lm.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(FatalError, match="cut.npz is not a readable n-gram model"):
        NGramLM.load(tmp_path / "cut.npz")
    with zipfile.ZipFile(tmp_path / "lm.npz") as zf:
        names = zf.namelist()
    assert "keys2.npy" in names and "logbo1.npy" in names and "logbo2.npy" not in names


def test_empty_texts_unseen_words_and_order_one() -> None:
    model = NGramLM.train(["one two three\ntwo three four"], order=1)
    log10_sum, tokens = model.score(["", " \n\n ...", "two three"])
    assert tokens.tolist() == [0, 0, 3] and log10_sum[:2].tolist() == [0.0, 0.0]
    ppl = model.perplexities(["", "--", "two three", "never seen before"])
    assert np.isnan(ppl[:2]).all() and np.isfinite(ppl[2:]).all()
    assert ppl[3] > ppl[2]
    # order 1 scores a word the same in any context
    a, _ = model.score(["two three", "three two"])
    assert a[0] == pytest.approx(a[1], abs=1e-12)
    with pytest.raises(FatalError, match="no words"):
        NGramLM.train(["", "!!"], order=3)


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list("ab Z9_.-\n\r\t\x0b\x0c\u00e9\u0301\u2014\u00a0\u0130\u03a3\u0660\u4e2d")),
        max_size=60,
    ),
    fold=st.booleans(),
)
def test_line_split_is_text_hashes_per_line(text: str, fold: bool) -> None:
    # the fast path (one text_hashes call per text, word counts per line) against the definition:
    # ASCII breaks, non-ASCII letters, combining marks, Unicode digits and dashes, other line breaks
    expected = [h.tolist() for line in text.split("\n") if len(h := text_hashes(line, fold))]
    hashes, lengths = _text_lines(text, fold)
    assert [h.tolist() for h in np.split(hashes, np.cumsum(lengths)[:-1])] == (expected or [[]])


def test_long_texts_are_scored_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    # a text longer than a scoring batch is cut between lines; its score is the sum of its lines'
    model = NGramLM.train(["the cat sat\nthe dog ran\na cat ran"], order=3)
    lines = ["the cat ran", "a dog sat", " ".join(["the cat"] * 60), "the the cat"] * 20  # one line longer than a piece
    whole, _ = model.score(["\n".join(lines)])
    per_line, _ = model.score(lines)
    monkeypatch.setattr(ngram, "_BATCH_CHARS", 64)
    cut, tokens = model.score(["\n".join(lines), "a cat"])
    assert whole[0] == pytest.approx(per_line.sum(), abs=1e-9) and cut[0] == pytest.approx(whole[0], abs=1e-9)
    assert tokens.tolist() == [sum(len(line.split()) + 1 for line in lines), 3]
    assert list(ngram._pieces("ab\ncd\nef", 4)) == ["ab", "cd", "ef"] and list(ngram._pieces("abcdef\ng", 2)) == [
        "abcdef",
        "g",
    ]
