"""Languages in the tokenizer stage: fertility on the language's own words, the premium on parallel text
(kiln.tokenize.report), and temperature sampling over languages (kiln.tokenize.balance, tokenizer.language_alpha)."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest
import rjieba

from kiln.core.docshards import list_shards, read_shard
from kiln.core.split import is_heldout
from kiln.text.tokenizer import KilnTokenizer
from kiln.tokenize.balance import SampledDoc, balance, language_shares
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.report import HAS_WORD, premium
from kiln.tokenize.train import run as train_tokenizer
from kiln.tokenize.train import split_key, training_sample

# Tiny: 1,000 tokens, none reserved, on the parallel run's 0.35 MB of held-in text.
CFG = TokenizerConfig(vocab_size=1000, heldout_fraction=0.2, sentinel_tokens=0, reserved_tokens=0)


@pytest.fixture
def run_dir(parallel_run, tmp_path) -> Path:
    return Path(shutil.copytree(parallel_run, tmp_path / "run"))


def heldout(run_dir: Path) -> list:
    docs = [d for s in list_shards(run_dir / "curate" / "shards") for d in read_shard(s)]
    return [d for d in docs if is_heldout(split_key(d), CFG.heldout_fraction)]


# ---- the premium, by hand ----


def test_premium_hand_worked():
    counts = [("1", "en", 4), ("1", "fr", 5), ("2", "en", 6), ("2", "fr", 9), ("2", "de", 8), ("3", "de", 7)]
    assert premium(counts) == {
        "reference": "en",
        "per_language": {
            # group 3 has no English: de is counted on group 2 alone
            "de": {"groups": 1, "tokens": 8, "reference_tokens": 6, "premium": 1.3333},
            "en": {"groups": 2, "tokens": 10, "reference_tokens": 10, "premium": 1.0},
            "fr": {"groups": 2, "tokens": 14, "reference_tokens": 10, "premium": 1.4},
        },
    }
    # two documents of one language in a group add up; no English anywhere, or English alone: no premium
    assert premium([("1", "en", 4), ("1", "fr", 3), ("1", "fr", 3)])["per_language"]["fr"]["premium"] == 1.5
    assert premium([("1", "fr", 5), ("1", "de", 8)]) is None
    assert premium([("1", "en", 5)]) is None


# ---- the report on parallel text ----


def test_report_gives_fertility_on_segmenter_words_and_the_premium(run_dir):
    train_tokenizer(CFG, run_dir)
    tok = KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json")
    report = json.loads((run_dir / "tokenizer" / "report.json").read_text())["heldout"]
    held = heldout(run_dir)
    # Translations are held out together: every held-out group has its English and its other languages.
    groups: dict[str, set[str]] = {}
    for d in held:
        groups.setdefault(d.meta["parallel_id"], set()).add(d.meta["language"])
    assert len(groups) > 30 and all({"en", "fr", "de", "ja", "zh"} <= langs for langs in groups.values())
    assert sum("th" in langs for langs in groups.values()) >= 3

    # Chinese words are rjieba's, not whitespace chunks (a Chinese sentence has no spaces: one chunk each line).
    zh = [d.text for d in held if d.meta["language"] == "zh"]
    segmented = sum(len([w for w in rjieba.cut(t) if HAS_WORD.search(w)]) for t in zh)
    tokens = sum(len(ids) for ids in tok.encode_batch(zh))
    row = report["per_language"]["zh"]
    assert row["words"] == segmented > 3 * sum(len(t.split()) for t in zh)
    assert row["tokens"] == tokens and row["tokens_per_word"] == round(tokens / segmented, 4)

    # The premium, recounted from the held-out documents: tokens over English's, group by group.
    per_doc = {d.id: len(ids) for d, ids in zip(held, tok.encode_batch([d.text for d in held]), strict=True)}
    parallel = report["parallel"]
    assert parallel["reference"] == "en" and set(parallel["per_language"]) == {"en", "fr", "de", "ja", "zh", "th"}
    for lang, got in parallel["per_language"].items():
        mine = [g for g, langs in groups.items() if lang in langs]
        ours = sum(per_doc[f"{lang}/{g}"] for g in mine)
        english = sum(per_doc[f"en/{g}"] for g in mine)
        assert got == {
            "groups": len(mine),
            "tokens": ours,
            "reference_tokens": english,
            "premium": round(ours / english, 4),
        }
    table = (run_dir / "tokenizer" / "summary.txt").read_text().splitlines()
    assert any(line.startswith("held-out text by language (vs en:") for line in table)
    th = next(line.split() for line in table if line.split()[:1] == ["th"])
    assert th[-1] == f"{parallel['per_language']['th']['premium']:.3f}"


# ---- temperature sampling over languages ----


def docs_of(sizes: dict[str, list[int]]) -> list[SampledDoc]:
    return [SampledDoc(f"{lang}/{i}", lang, "x" * n, n) for lang, ns in sizes.items() for i, n in enumerate(ns)]


def test_balance_hand_worked():
    # n = {en: 900, th: 100}, alpha 0.5: weights 30 and 10, shares 0.75 and 0.25 of 1,000 bytes.
    assert language_shares({"en": 900, "th": 100}, 0.5) == {"en": 0.75, "th": 0.25}
    docs = docs_of({"en": [100] * 9, "th": [50, 50]})
    out, stats = balance(docs, 0.5)
    taken = Counter(d.id for d in out)
    # th: both documents twice (200 bytes), then one more by id hash for the last 50
    assert sorted(c for i, c in taken.items() if i.startswith("th/")) == [2, 3]
    # en: documents by id hash until 750 bytes are reached: 8 of its 9 (overshoots by less than one document)
    assert sum(1 for i in taken if i.startswith("en/")) == 8 and max(taken[i] for i in taken if i[:3] == "en/") == 1
    assert stats["th"] == {
        "docs_before": 2,
        "bytes_before": 100,
        "share_before": 0.1,
        "target_share": 0.25,
        "docs_after": 5,
        "bytes_after": 250,
        "share_after": round(250 / 1050, 4),
    }
    assert stats["en"]["bytes_after"] == 800 and list(stats) == ["en", "th"]


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7])
def test_balanced_shares_follow_n_to_the_alpha(alpha):
    rng = random.Random(0)
    sizes = {"en": 4000, "fr": 900, "sw": 60, "th": 25}  # documents per language, 40-160 bytes each
    docs = docs_of({lang: [rng.randint(40, 160) for _ in range(n)] for lang, n in sizes.items()})
    out, stats = balance(docs, alpha)
    n = {lang: sum(d.bytes for d in docs if d.language == lang) for lang in sizes}
    weights = {lang: b**alpha for lang, b in n.items()}
    total = sum(d.bytes for d in out)
    for lang in sizes:
        expected = weights[lang] / sum(weights.values())
        got = sum(d.bytes for d in out if d.language == lang) / total
        assert got == pytest.approx(expected, abs=0.002), lang  # within about one document of 160 bytes
        assert stats[lang]["target_share"] == round(expected, 4)
    assert stats["th"]["share_after"] > stats["th"]["share_before"]
    assert abs(total - sum(n.values())) < 4 * 160  # the same total, give or take a document per language
    # Deterministic, and the same whatever order the documents came in.
    shuffled = docs[:]
    rng.shuffle(shuffled)
    assert Counter(d.id for d in balance(shuffled, alpha)[0]) == Counter(d.id for d in out)


def test_alpha_one_is_the_sample_as_drawn():
    docs = docs_of({"en": [100, 70, 30], "th": [10]})[::-1]
    out, stats = balance(docs, 1.0)
    assert out == docs and all(s["share_after"] == s["share_before"] for s in stats.values())


def test_alpha_one_trains_the_tokenizer_of_a_recipe_without_it(run_dir, tmp_path):
    shards = list_shards(run_dir / "curate" / "shards")
    plain = training_sample(run_dir, shards, CFG)
    assert plain.languages is None and plain.natural is plain.texts
    one = training_sample(run_dir, shards, CFG.model_copy(update={"language_alpha": 1.0}))
    assert one.texts == plain.texts and one.bytes == plain.bytes
    assert one.languages is not None and set(one.languages) == {"en", "fr", "de", "ja", "zh", "th"}

    train_tokenizer(CFG, run_dir)
    other = Path(shutil.copytree(run_dir, tmp_path / "other"))
    shutil.rmtree(other / "tokenizer")
    manifest = train_tokenizer(CFG.model_copy(update={"language_alpha": 1.0}), other)
    assert (other / "tokenizer" / "tokenizer.json").read_bytes() == (
        run_dir / "tokenizer" / "tokenizer.json"
    ).read_bytes()
    report = json.loads((other / "tokenizer" / "report.json").read_text())
    assert report["language_balance"]["natural_mix"] is None  # at 1 the natural mix is this tokenizer
    assert manifest["counts"]["language_alpha"] == 1.0


def test_language_alpha_lifts_the_small_language_and_lowers_its_fertility(run_dir):
    cfg = CFG.model_copy(update={"language_alpha": 0.3})
    manifest = train_tokenizer(cfg, run_dir)
    report = json.loads((run_dir / "tokenizer" / "report.json").read_text())
    shares = report["language_balance"]["per_language"]
    assert manifest["counts"]["sample_languages"] == {
        lang: {k: s[k] for k in ("bytes_before", "share_before", "bytes_after", "share_after")}
        for lang, s in shares.items()
    }
    # Thai is the smallest language (the catalogs translate about a seventh of the sentences into it; 6% here).
    weights = {lang: s["bytes_before"] ** 0.3 for lang, s in shares.items()}
    for lang, s in shares.items():
        assert s["target_share"] == round(weights[lang] / sum(weights.values()), 4)
        assert s["share_after"] == pytest.approx(s["target_share"], abs=0.005)  # a document is about 0.3% here
    assert min(shares, key=lambda lang: shares[lang]["bytes_before"]) == "th"
    assert shares["th"]["share_after"] > 1.5 * shares["th"]["share_before"]
    assert shares["th"]["docs_after"] > 2 * shares["th"]["docs_before"]  # repeated: the sample has no other Thai
    assert manifest["counts"]["sample_bytes"] == sum(s["bytes_after"] for s in shares.values())

    # The natural mix's tokenizer, measured beside this one: Thai's words cost fewer tokens after balancing.
    natural = report["language_balance"]["natural_mix"]["per_language"]
    balanced = report["heldout"]["per_language"]
    for key in ("tokens_per_word", "fertility"):
        assert balanced["th"][key] < 0.95 * natural["th"][key]
    assert balanced["th"]["bytes_per_token"] > natural["th"]["bytes_per_token"]
    assert manifest["natural_mix_train_seconds"] >= 0
    table = (run_dir / "tokenizer" / "summary.txt").read_text().splitlines()
    start = table.index("training sample by language at tokenizer.language_alpha 0.3, natural -> balanced")
    th = next(line.split() for line in table[start:] if line.split()[:1] == ["th"])
    assert th[2:5] == [f"{shares['th']['share_before']:.3f}", "->", f"{shares['th']['share_after']:.3f}"]
    assert th[5:8] == [f"{natural['th']['tokens_per_word']:.3f}", "->", f"{balanced['th']['tokens_per_word']:.3f}"]


def test_language_alpha_is_checked():
    with pytest.raises(ValueError, match="language_alpha"):
        TokenizerConfig(language_alpha=1.5)
