"""kiln.tokenize.train.run: the train-tokenizer stage on a real curated run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kiln.core.docshards import list_shards, read_shard, shard_source
from kiln.core.errors import ConfigError, FatalError
from kiln.core.manifest import MANIFEST
from kiln.core.split import is_heldout
from kiln.recipe import load_recipe
from kiln.text.tokenizer import KilnTokenizer
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.report import words
from kiln.tokenize.train import EmbeddingShape, plan_sample, spread, sweep, training_sample
from kiln.tokenize.train import run as train_tokenizer

CFG = TokenizerConfig(vocab_size=600, sample_mb=5.0, heldout_fraction=0.2, heldout_mb=5.0, min_frequency=2)


@pytest.fixture
def run_dir(curated_run, tmp_path) -> Path:
    """A private copy of the curated run, so each test may add or redo stages."""
    return Path(shutil.copytree(curated_run, tmp_path / "run"))


def curated_docs(run_dir: Path):
    return [d for s in list_shards(run_dir / "curate" / "shards") for d in read_shard(s)]


def test_train_tokenizer_report(run_dir):
    manifest = train_tokenizer(CFG, run_dir, EmbeddingShape(d_model=64, tied_embeddings=False))
    out = run_dir / "tokenizer" / "tokenizer.json"
    tok = KilnTokenizer.load(out)
    assert tok.vocab_size == 600

    docs = curated_docs(run_dir)
    train_docs = [d for d in docs if not is_heldout(d.id, CFG.heldout_fraction)]
    held = [d for d in docs if is_heldout(d.id, CFG.heldout_fraction)]
    counts = manifest["counts"]
    assert counts["vocab_size"] == 600
    assert counts["sample_docs"] == len(train_docs)  # the shares exceed the corpus: every non-held-out doc
    assert counts["sample_bytes"] == sum(len(d.text.encode()) for d in train_docs)

    report = json.loads((run_dir / "tokenizer" / "report.json").read_text())["heldout"]
    assert sorted(counts["per_source"]) == sorted(report["per_source"]) == ["code", "prose"]
    for source, r in report["per_source"].items():
        texts = [d.text for d in held if d.source == source]
        assert texts, f"no held-out {source} docs: the report would be empty"
        nbytes = sum(len(t.encode()) for t in texts)
        ntokens = sum(len(ids) for ids in tok.encode_batch(texts))
        nwords = sum(len(words(t)) for t in texts)
        assert (r["docs"], r["bytes"], r["tokens"], r["words"]) == (len(texts), nbytes, ntokens, nwords)
        assert r["bytes_per_token"] == round(nbytes / ntokens, 4) and r["tokens_per_word"] == round(ntokens / nwords, 4)
        assert r["bytes_per_token"] > 2.0  # a 600-token vocabulary still compresses English and Python
        assert (
            1.0 <= r["fertility"] < r["tokens_per_word"]
        )  # words alone, without the whitespace and punctuation between them
        assert 0 < r["split_word_fraction"] < 1
        assert counts["per_source"][source] == {
            k: r[k] for k in ("docs", "bytes", "tokens", "bytes_per_token", "tokens_per_word")
        }
    # the fixture's code has no curate language label (code steps), the docs topics were not language-checked
    assert set(report["per_language"]) == {"code", "en"}
    assert report["per_language"]["code"]["docs"] == report["per_source"]["code"]["docs"]
    assert "embedding" not in report  # priced at print time: the model's width is not the tokenizer's output
    assert "parallel" not in report  # no meta.parallel_id: no premium (tests/tokenize/test_tokenizer_languages.py)
    assert counts["heldout_bytes_per_token"] == report["all"]["bytes_per_token"]
    longest = report["longest_merges"]
    assert len(longest) == 10 and all(m["text"].strip() for m in longest)
    assert [m["bytes"] for m in longest] == sorted((m["bytes"] for m in longest), reverse=True)
    used = [m["count"] for m in report["most_used_merges"]]
    assert used == sorted(used, reverse=True) and used[0] > 100
    assert [o["path"] for o in manifest["outputs"]] == ["kiln_tokenizer.json", "report.json", "tokenizer.json"]
    assert set(manifest["upstream"]) == {"curate"}
    summary = (run_dir / "tokenizer" / "summary.txt").read_text()
    assert "held-out text by language:" in summary and "embedding parameters at d_model 64: 76,800" in summary

    # A new model width changes no tokenizer output, so the stage stays current: nothing retrains or re-encodes.
    again = train_tokenizer(CFG, run_dir, EmbeddingShape(d_model=512, tied_embeddings=True))
    assert again == manifest


def test_words_hand_worked():
    assert words("Hello, world 42x  東京 is\tnaïve") == ["Hello", " world", " 42x", " 東", "京", " is", "naïve"]


def test_words_of_languages_written_without_spaces_are_their_segmenters_words():
    assert words("您可以点击上面的按钮。", "zh") == ["您", "可以", "点击", "上面", "的", "按钮"]
    assert words("一時的に無効化する場合は、", "ja") == ["一時的", "に", "無効化", "する", "場合", "は"]
    assert words("คุณสามารถปิดใช้ CSS", "th") == ["คุณ", "สามารถ", "ปิด", "ใช้", "CSS"]
    assert words("您可以点击上面的按钮。") == words("您可以点击上面的按钮。", "zh")  # no language: its script's


def test_tokenizer_json_is_deterministic(run_dir, curated_run, tmp_path):
    done = train_tokenizer(CFG, run_dir)
    first = (run_dir / "tokenizer" / "tokenizer.json").read_bytes()
    redone = train_tokenizer(CFG, run_dir, force=True)
    assert (run_dir / "tokenizer" / "tokenizer.json").read_bytes() == first
    # Every output is the same (the training time is the manifest's, not report.json's), so the stages after it,
    # which record this fingerprint, stay current.
    assert redone["fingerprint"] == done["fingerprint"] and redone["train_seconds"] >= 0
    other = Path(shutil.copytree(curated_run, tmp_path / "other"))
    train_tokenizer(CFG, other)
    assert (other / "tokenizer" / "tokenizer.json").read_bytes() == first


def test_rerun_is_skipped_and_config_change_redoes(run_dir):
    first = train_tokenizer(CFG, run_dir)
    manifest_bytes = (run_dir / "tokenizer" / MANIFEST).read_bytes()
    assert train_tokenizer(CFG, run_dir) == first
    assert (run_dir / "tokenizer" / MANIFEST).read_bytes() == manifest_bytes
    bigger = train_tokenizer(CFG.model_copy(update={"vocab_size": 700}), run_dir)
    assert bigger["counts"]["vocab_size"] == 700
    assert KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json").vocab_size == 700


def sampled(run_dir: Path, cfg: TokenizerConfig) -> dict[str, int]:
    """Bytes per source of the documents the stage's sample takes."""
    texts = set(training_sample(run_dir, list_shards(run_dir / "curate" / "shards"), cfg).texts)
    out: dict[str, int] = {}
    for d in curated_docs(run_dir):
        if d.text in texts:
            out[d.source] = out.get(d.source, 0) + len(d.text.encode())
    return out


def test_sample_shares_follow_source_size(run_dir):
    docs = [d for d in curated_docs(run_dir) if not is_heldout(d.id, CFG.heldout_fraction)]
    size = {s: sum(len(d.text.encode()) for d in docs if d.source == s) for s in ("code", "prose")}
    largest = {s: max(len(d.text.encode()) for d in docs if d.source == s) for s in ("code", "prose")}
    got = sampled(run_dir, CFG.model_copy(update={"sample_mb": 0.1}))
    for s in ("code", "prose"):
        share = 100_000 * size[s] / sum(size.values())
        # each source stops at the first document that reaches its share, so it overshoots by at most one doc
        assert share <= got[s] < share + 1 + largest[s]


def test_source_weights_set_the_shares(run_dir):
    assert set(sampled(run_dir, CFG.model_copy(update={"source_weights": {"code": 1.0}}))) == {"code"}
    got = sampled(run_dir, CFG.model_copy(update={"sample_mb": 0.1, "source_weights": {"code": 1.0, "prose": 3.0}}))
    largest = {s: max(len(d.text.encode()) for d in curated_docs(run_dir) if d.source == s) for s in ("code", "prose")}
    assert 25_000 <= got["code"] < 25_001 + largest["code"] and 75_000 <= got["prose"] < 75_001 + largest["prose"]


def test_sample_is_spread_across_a_source():
    shards = [Path(f"code-{i:05d}.jsonl.zst") for i in range(10)]
    assert spread(shards, 1) == [shards[5]] and spread(shards, 3) == [shards[1], shards[5], shards[8]]
    assert spread(shards, 40) == shards
    # 10 shards of ~1 MB held-in text and a 1 MB share: four shards, each document taken at rate 1/4
    cfg = TokenizerConfig(sample_mb=1.0, heldout_fraction=0.5)
    plan = plan_sample(shards, {"code": 20_000_000}, cfg)["code"]
    assert plan.shards == spread(shards, 4) and plan.rate == pytest.approx(0.25) and plan.quota == 1_000_000


def test_unknown_weighted_source_is_fatal(run_dir):
    with pytest.raises(
        FatalError,
        match=r"source_weights names \['web'\], which curate kept no text of; sources with text: \['code', 'prose'\]",
    ):
        train_tokenizer(CFG.model_copy(update={"source_weights": {"web": 1.0}}), run_dir)


def test_too_little_text_is_fatal(run_dir):
    with pytest.raises(FatalError, match="too little for vocab_size 500,000 .*lower tokenizer.vocab_size"):
        train_tokenizer(CFG.model_copy(update={"vocab_size": 500_000}), run_dir)
    with pytest.raises(FatalError, match="the training sample has 0 documents"):  # everything held out
        train_tokenizer(CFG.model_copy(update={"heldout_fraction": 0.999999}), run_dir)


def test_a_vocabulary_the_sample_cannot_fill_is_warned_about_in_the_summary(run_dir):
    manifest = train_tokenizer(CFG.model_copy(update={"vocab_size": 60_000, "min_frequency": 50}), run_dir)
    summary = (run_dir / "tokenizer" / "summary.txt").read_text()
    assert manifest["counts"]["vocab_size"] < 60_000
    assert (
        "warning: 60,000 tokens were asked (tokenizer.vocab_size) and the sample gave "
        f"{manifest['counts']['vocab_size']:,}"
    ) in summary


def test_vocab_below_bytes_and_specials_is_a_config_error():
    with pytest.raises(
        ConfigError,
        match=(
            r"tokenizer: vocab_size 300 leaves no room for merges: 256 byte tokens \+ 54 special tokens .* need at "
            r"least 311; raise vocab_size or lower sentinel_tokens/reserved_tokens"
        ),
    ):
        load_recipe("demo", ["tokenizer.vocab_size=300"])
    assert (
        load_recipe(
            "demo", ["tokenizer.vocab_size=300", "tokenizer.sentinel_tokens=0", "tokenizer.reserved_tokens=0"]
        ).tokenizer.vocab_size
        == 300
    )


def test_sweep(run_dir):
    manifest = sweep(CFG, run_dir, [700, 400], EmbeddingShape(d_model=32))
    folder = run_dir / "tokenizer-sweep"
    assert manifest["counts"]["vocab_sizes"] == [400, 700]
    bpt = manifest["counts"]["bytes_per_token"]
    assert bpt["400"] < bpt["700"]  # more merges, longer tokens
    for n in (400, 700):
        assert KilnTokenizer.load(folder / f"vocab-{n}" / "tokenizer.json").vocab_size == n
    table = (folder / "summary.txt").read_text().splitlines()
    assert any(
        line.split()
        == [
            "embedding",
            "params",
            "at",
            "32",
            "(M)",
            str(round(400 * 32 * 2 / 1e6, 2)),
            str(round(700 * 32 * 2 / 1e6, 2)),
        ]
        for line in table
    )
    assert table[0].split() == ["vocab", "size", "400", "700"]
    assert any(line.split()[:3] == ["bytes/token", "all", str(bpt["400"])] for line in table)
    assert not (run_dir / "tokenizer").exists()  # the stage's own tokenizer is not touched
    with pytest.raises(ConfigError, match="--sweep 300: .*need at least 311"):
        sweep(CFG, run_dir, [300, 400])


def test_missing_curate_is_fatal(tmp_path):
    with pytest.raises(FatalError, match="run that stage first"):
        train_tokenizer(CFG, tmp_path / "empty")


def test_sources_follow_shard_names(curated_run):
    names = {shard_source(s) for s in list_shards(curated_run / "curate" / "shards")}
    assert names == {"code", "prose"}
    # ids are relative to the glob's folder (code/*.py -> code/<file>), so they do not depend on where the data lies
    assert all(d.id.startswith(f"{d.source}/") and d.id.count("/") == 1 for d in curated_docs(curated_run))
