"""kiln.tokenize.train.run: the train-tokenizer stage on a real curated run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiln.core.errors import FatalError
from kiln.core.manifest import MANIFEST
from kiln.core.split import is_heldout
from kiln.curate.shards import list_shards, read_shard, shard_source
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.tokenizer import KilnTokenizer
from kiln.tokenize.train import run as train_tokenizer

CFG = TokenizerConfig(vocab_size=600, sample_mb=5.0, heldout_fraction=0.2, heldout_mb=5.0, min_frequency=2)


@pytest.fixture
def run_dir(curated_run, tmp_path) -> Path:
    """A private copy of the curated run, so each test may add or redo stages."""
    return Path(shutil.copytree(curated_run, tmp_path / "run"))


def curated_docs(run_dir: Path):
    return [d for s in list_shards(run_dir / "curate" / "shards") for d in read_shard(s)]


def test_train_tokenizer_report(run_dir):
    manifest = train_tokenizer(CFG, run_dir)
    out = run_dir / "tokenizer" / "tokenizer.json"
    tok = KilnTokenizer.load(out)
    assert tok.vocab_size == 600

    docs = curated_docs(run_dir)
    train_docs = [d for d in docs if not is_heldout(d.id, CFG.heldout_fraction)]
    held = [d for d in docs if is_heldout(d.id, CFG.heldout_fraction)]
    counts = manifest["counts"]
    assert counts["vocab_size"] == 600
    assert counts["sample_docs"] == len(train_docs)  # quotas exceed the corpus: every non-held-out doc
    assert counts["sample_bytes"] == sum(len(d.text.encode()) for d in train_docs)

    assert sorted(counts["per_source"]) == ["code", "prose"]
    for source, report in counts["per_source"].items():
        texts = [d.text for d in held if d.source == source]
        assert texts, f"no held-out {source} docs: the report would be empty"
        nbytes = sum(len(t.encode()) for t in texts)
        ntokens = sum(len(ids) for ids in tok.encode_batch(texts))
        assert report == {"docs": len(texts), "bytes": nbytes, "tokens": ntokens, "bytes_per_token": round(nbytes / ntokens, 4)}
        assert report["bytes_per_token"] > 2.0  # a 600-token vocabulary still compresses English and Python
    all_bytes = sum(r["bytes"] for r in counts["per_source"].values())
    all_tokens = sum(r["tokens"] for r in counts["per_source"].values())
    assert counts["heldout_bytes_per_token"] == round(all_bytes / all_tokens, 4)
    assert [o["path"] for o in manifest["outputs"]] == ["tokenizer.json"]
    assert set(manifest["upstream"]) == {"curate"}


def test_tokenizer_json_is_deterministic(run_dir, curated_run, tmp_path):
    train_tokenizer(CFG, run_dir)
    first = (run_dir / "tokenizer" / "tokenizer.json").read_bytes()
    train_tokenizer(CFG, run_dir, force=True)
    assert (run_dir / "tokenizer" / "tokenizer.json").read_bytes() == first
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


def test_sample_quota_is_shared_by_size(run_dir):
    manifest = train_tokenizer(CFG.model_copy(update={"sample_mb": 0.1}), run_dir)
    docs = [d for d in curated_docs(run_dir) if not is_heldout(d.id, CFG.heldout_fraction)]
    # each source stops at the first document that reaches its quota, so it overshoots by at most one doc
    largest = {s: max(len(d.text.encode()) for d in docs if d.source == s) for s in ("code", "prose")}
    assert 100_000 <= manifest["counts"]["sample_bytes"] < 100_000 + 2 + sum(largest.values())
    assert manifest["counts"]["sample_docs"] < len(docs)


def test_too_little_text_is_fatal(run_dir):
    with pytest.raises(FatalError, match="too little for vocab_size 500000"):
        train_tokenizer(CFG.model_copy(update={"vocab_size": 500_000}), run_dir)


def test_missing_curate_is_fatal(tmp_path):
    with pytest.raises(FatalError, match="run that stage first"):
        train_tokenizer(CFG, tmp_path / "empty")


def test_sources_follow_shard_names(curated_run):
    names = {shard_source(s) for s in list_shards(curated_run / "curate" / "shards")}
    assert names == {"code", "prose"}
    # ids are relative to the glob's folder (code/*.py -> code/<file>), so they do not depend on where the data lies
    assert all(d.id.startswith(f"{d.source}/") and d.id.count("/") == 1 for d in curated_docs(curated_run))
