"""kiln.mix.languages and mix.language_alpha: temperature over languages on a small multilingual token corpus
written with TokenShardWriter, one source per locale (en, fr, de, zh_CN and zh_TW, the last two both zh).

Each source's documents hold ids offset by the source (en 0, fr 100,000, ...), so a token says where it came
from. Checked: the worked example, language shares against n ** alpha, sources keeping their shares inside a
language, today's stream unchanged with language_alpha unset, exact resume, the manifest's counts read by
build_sampler, the dry run's language table, and the recipe hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kiln.core.errors import ConfigError
from kiln.core.manifest import config_hash
from kiln.core.tokenshards import TokenShard, TokenShardWriter
from kiln.mix.config import MixConfig
from kiln.mix.languages import language_table, target_shares, tempered
from kiln.mix.sampler import Sampler, build_sampler
from kiln.train.config import TrainConfig
from kiln.train.data_plan import format_plan, plan_data

SEQ_LEN = 16
# source -> (language, documents, offset of its ids)
CORPUS = {
    "en": ("en", 80, 0),
    "fr": ("fr", 24, 100_000),
    "de": ("de", 8, 200_000),
    "zh_CN": ("zh", 12, 300_000),
    "zh_TW": ("zh", 4, 400_000),
}


def docs_of(n: int, offset: int) -> list[list[int]]:
    return [[offset + 1000 * d + k + 1 for k in range(5 + (7 * d) % 23)] + [0] for d in range(n)]


def write_shard(prefix: Path, docs: list[list[int]]) -> TokenShard:
    writer = TokenShardWriter(prefix, vocab_size=2**20)
    for d in docs:
        writer.add(d)
    writer.close()
    return TokenShard(prefix)


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, TokenShard]:
    return {s: write_shard(tmp_path / s, docs_of(n, offset)) for s, (_, n, offset) in CORPUS.items()}


def counted(shards: dict[str, TokenShard]) -> dict[str, dict[str, int]]:
    """What the tokenize manifest says: each source's train tokens per language."""
    return {s: {CORPUS[s][0]: len(shard)} for s, shard in shards.items()}


def language_rows(sampler: Sampler, rows: int) -> dict[str, float]:
    drawn = sampler.next_rows([SEQ_LEN + 1] * rows, 0.0).source_B
    by_language: dict[str, float] = {}
    for i, s in enumerate(sampler.sources):
        by_language[CORPUS[s][0]] = by_language.get(CORPUS[s][0], 0.0) + float(np.mean(drawn == i))
    return by_language


def test_worked_example() -> None:
    # The module docstring's: en_web 600 en tokens, en_books 300 en, fr 100 fr; alpha 0.5 gives 30:10.
    table = language_table(
        ["en_web", "en_books", "fr"], {"en_web": {"en": 600}, "en_books": {"en": 300}, "fr": {"fr": 100}}
    )
    assert table.languages == ["en", "fr"] and table.tokens_L.tolist() == [900, 100]
    p = target_shares(table.tokens_L, 0.5)
    assert p == pytest.approx([0.75, 0.25])
    assert tempered(np.array([600.0, 300.0, 100.0]), table.shares_SL, p) == pytest.approx([0.5, 0.25, 0.25])
    assert target_shares(table.tokens_L, 1.0) == pytest.approx([0.9, 0.1])
    assert target_shares(table.tokens_L, 0.0) == pytest.approx([0.5, 0.5])
    # A source of two languages (web: 50 en, 150 fr) counts in both by its shares.
    mixed = language_table(["en", "web"], {"en": {"en": 100}, "web": {"en": 50, "fr": 150}})
    # Equal weights: q_en = 0.5 * 1 + 0.5 * 0.25 = 0.625, q_fr = 0.5 * 0.75 = 0.375; p = {en: 0.5, fr: 0.5}
    # (alpha 0), so en gets 0.5 * 0.5 / 0.625 = 0.4 and web 0.5 * (0.25 * 0.5 / 0.625 + 0.75 * 0.5 / 0.375) = 0.6.
    w = tempered(np.array([1.0, 1.0]), mixed.shares_SL, np.array([0.5, 0.5]))
    assert w == pytest.approx([0.4, 0.6])
    # Near p, not on it: web's rows bring its own 1:3, so en gets 0.4 + 0.6 * 0.25 = 0.55 of the tokens.
    assert w @ mixed.shares_SL == pytest.approx([0.55, 0.45])


@pytest.mark.parametrize("alpha", [1.0, 0.3, 0.0])
def test_language_shares_follow_n_to_the_alpha(corpus: dict[str, TokenShard], alpha: float) -> None:
    n = {"en": len(corpus["en"]), "fr": len(corpus["fr"]), "de": len(corpus["de"])}
    n["zh"] = len(corpus["zh_CN"]) + len(corpus["zh_TW"])
    expected = {lang: v**alpha / sum(m**alpha for m in n.values()) for lang, v in n.items()}
    sampler = Sampler(corpus, MixConfig(language_alpha=alpha), SEQ_LEN, languages=counted(corpus))
    weights = dict(zip(sampler.sources, sampler.weights_at(0.0), strict=True))
    by_language = {lang: sum(w for s, w in weights.items() if CORPUS[s][0] == lang) for lang in n}
    assert by_language == pytest.approx(expected, abs=1e-12)
    # zh_CN and zh_TW keep their shares of zh (their tokens, mix.weights being unset).
    assert weights["zh_CN"] / weights["zh_TW"] == pytest.approx(len(corpus["zh_CN"]) / len(corpus["zh_TW"]))
    # The rows drawn follow them within sampling error (3,000 rows: a standard error under 0.01).
    assert language_rows(sampler, 3000) == pytest.approx(expected, abs=0.025)


def test_recipe_weights_share_a_language_among_its_sources(corpus: dict[str, TokenShard]) -> None:
    cfg = MixConfig(weights={"en": 1, "fr": 1, "de": 1, "zh_CN": 1, "zh_TW": 3}, language_alpha=0.0)
    sampler = Sampler(corpus, cfg, SEQ_LEN, languages=counted(corpus))
    w = dict(zip(sampler.sources, sampler.weights_at(0.5), strict=True))
    assert w["en"] == w["fr"] == w["de"] == pytest.approx(0.25)
    assert (w["zh_CN"], w["zh_TW"]) == pytest.approx((0.0625, 0.1875))


def stream_digest(sampler: Sampler, steps: int = 30) -> str:
    h = hashlib.sha256()
    for step in range(steps):
        rows = sampler.next_rows([SEQ_LEN + 1] * 4, step / steps)
        for t in rows.tokens:
            h.update(np.asarray(t, dtype=np.int64).tobytes())
        h.update(rows.source_B.tobytes())
    return h.hexdigest()[:16]


def test_without_language_alpha_the_stream_is_todays(tmp_path: Path) -> None:
    # The digests were taken with the sampler before mix.language_alpha existed: same rows, same sources.
    shards = {
        "en": write_shard(tmp_path / "en", docs_of(40, 0)),
        "fr": write_shard(tmp_path / "fr", docs_of(12, 100_000)),
        "de": write_shard(tmp_path / "de", docs_of(6, 200_000)),
    }
    languages = {s: {s: len(shard)} for s, shard in shards.items()}
    scheduled = {"en": 1, "fr": [[0, 1], [0.5, 3]], "de": 2}
    for weights, digest in ((None, "8fa05923327f3e99"), (scheduled, "46ef5886f6052eea")):
        cfg = MixConfig(lanes=4, weights=weights)
        assert stream_digest(Sampler(shards, cfg, SEQ_LEN)) == digest
        assert stream_digest(Sampler(shards, cfg, SEQ_LEN, languages=languages)) == digest


def test_resume_with_language_alpha_continues_the_stream_exactly(corpus: dict[str, TokenShard]) -> None:
    cfg = MixConfig(language_alpha=0.3, lanes=4, weights={s: [[0, 1], [1, 2]] for s in CORPUS})
    whole = Sampler(corpus, cfg, SEQ_LEN, languages=counted(corpus))
    uninterrupted = [whole.next_rows([SEQ_LEN + 1] * 8, step / 10).tokens for step in range(10)]
    first = Sampler(corpus, cfg, SEQ_LEN, languages=counted(corpus))
    head = [first.next_rows([SEQ_LEN + 1] * 8, step / 10).tokens for step in range(4)]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = Sampler(corpus, cfg, SEQ_LEN, languages=counted(corpus))
    resumed.load_state_dict(state)
    tail = [resumed.next_rows([SEQ_LEN + 1] * 8, step / 10).tokens for step in range(4, 10)]
    assert all(
        np.array_equal(a, b) for got, want in zip(head + tail, uninterrupted, strict=True) for a, b in zip(got, want)
    )


def test_language_alpha_is_part_of_the_mixtures_identity() -> None:
    unset = config_hash({"mix": MixConfig()})
    assert config_hash({"mix": MixConfig(language_alpha=None)}) == unset  # recipes without it keep their hash
    assert (
        len(
            {
                unset,
                config_hash({"mix": MixConfig(language_alpha=0.3)}),
                config_hash({"mix": MixConfig(language_alpha=0.5)}),
            }
        )
        == 3
    )
    with pytest.raises(ValueError, match="language_alpha"):
        MixConfig(language_alpha=1.5)


def test_sources_whose_languages_were_not_counted_stop_before_training(corpus: dict[str, TokenShard]) -> None:
    with pytest.raises(ConfigError, match=r"does not count the languages of \['de'.*kiln tokenize --force"):
        Sampler(corpus, MixConfig(language_alpha=0.3), SEQ_LEN, languages={"en": {"en": 10}, "fr": {"fr": 5}})


def write_tokenize_stage(folder: Path) -> None:
    """Train and validation shards per source and the manifest's per-language counts, as the tokenize stage
    writes them (the manifest's other fields left out)."""
    per_source = {}
    for source, (language, n, offset) in CORPUS.items():
        (folder / source).mkdir(parents=True)
        train = write_shard(folder / source / "train", docs_of(n, offset))
        val = write_shard(folder / source / "val", docs_of(max(n // 8, 1), offset + 90_000))
        per_source[source] = {
            split: {"docs": shard.n_docs, "tokens": len(shard), "languages": {language: {"tokens": len(shard)}}}
            for split, shard in (("train", train), ("val", val))
        }
    (folder / "manifest.json").write_text(json.dumps({"outputs": [], "counts": {"per_source": per_source}}))


def test_build_sampler_reads_the_languages_and_the_dry_run_shows_them(tmp_path: Path) -> None:
    write_tokenize_stage(tmp_path / "tokenize")
    sampler = build_sampler(tmp_path / "tokenize", MixConfig(language_alpha=0.3), SEQ_LEN)
    assert sampler.languages == counted({s: TokenShard(tmp_path / "tokenize" / s / "train") for s in CORPUS})
    assert build_sampler(tmp_path / "tokenize", MixConfig(language_alpha=0.3), SEQ_LEN, "val").target_L is None
    cfg = TrainConfig(steps=40, seq_len=SEQ_LEN, micro_batch_size=8, schedule={"warmup_steps": 2})
    plan = plan_data(cfg, sampler)
    languages = plan["languages"]
    assert list(languages) == ["en", "fr", "zh", "de"]  # most train tokens first
    n = np.array([languages[lang]["train_tokens"] for lang in languages], dtype=np.float64)
    assert [languages[lang]["share"] for lang in languages] == pytest.approx(
        (n**0.3 / (n**0.3).sum()).tolist(), abs=1e-3
    )
    assert languages["de"]["epochs"] == pytest.approx(
        languages["de"]["tokens"] / languages["de"]["train_tokens"], abs=1e-3
    )
    text = format_plan(plan)
    assert "languages: natural share of the train tokens, weighted share of the tokens read" in text
    de = languages["de"]
    assert (
        f"  {'de':<12} {de['natural_share']:>9.3f} {de['share']:>9.3f} {de['tokens']:>14,} {de['epochs']:>8.3f}" in text
    )
    # Without language_alpha the table still shows what the source weights make of the languages.
    natural = plan_data(cfg, build_sampler(tmp_path / "tokenize", MixConfig(), SEQ_LEN))["languages"]
    assert all(v["share"] == pytest.approx(v["natural_share"], abs=1e-3) for v in natural.values())
