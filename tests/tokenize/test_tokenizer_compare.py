"""kiln.tokenize.compare: the run's tokenizer beside other tokenizers on the same held-out text
(`kiln train-tokenizer --compare`), checked against Hugging Face `tokenizers`' own encodings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hf_tokenizers import ROLES, build
from tokenizers import Tokenizer

from kiln.cli import main
from kiln.core.docshards import list_shards, read_shard
from kiln.core.errors import FatalError
from kiln.core.split import is_heldout
from kiln.text.hf_tokenizer import FOLDER_FILES, HfTokenizer
from kiln.tokenize.compare import labels
from kiln.tokenize.compare import run as compare
from kiln.tokenize.config import TokenizerConfig
from kiln.tokenize.report import words
from kiln.tokenize.train import run as train_tokenizer
from kiln.tokenize.train import split_key

CFG = TokenizerConfig(vocab_size=1000, heldout_fraction=0.2, sentinel_tokens=0, reserved_tokens=0)


@pytest.fixture
def run_dir(parallel_run, tmp_path) -> Path:
    return Path(shutil.copytree(parallel_run, tmp_path / "run"))


def imported_run(kind: str, where: Path) -> Path:
    """A run directory whose tokenizer/ holds a Hugging Face tokenizer of `kind` as `kiln import-hf` keeps it
    (tokenizer.json and the roles of tokenizer_config.json; transformers is not needed to write them)."""
    files = {"tokenizer.json": build(kind).to_str().encode(), "tokenizer_config.json": json.dumps(ROLES[kind]).encode()}
    assert set(files) <= set(FOLDER_FILES)
    (where / "tokenizer").mkdir(parents=True)
    HfTokenizer(files, kind).save(where / "tokenizer" / "tokenizer.json")
    return where


def test_compare_measures_each_tokenizer_on_the_same_text(run_dir, tmp_path):
    train_tokenizer(CFG, run_dir)
    sentencepiece = tmp_path / "sp" / "tokenizer.json"  # any tokenizer.json: Llama 2's layout, marks word starts
    sentencepiece.parent.mkdir()
    build("llama2", 600).save(str(sentencepiece))
    imported = imported_run("llama3", tmp_path / "imported")
    manifest = compare(CFG, run_dir, [str(sentencepiece), str(imported)])

    report = json.loads((run_dir / "tokenizer-compare" / "report.json").read_text())["tokenizers"]
    assert [e["label"] for e in report] == manifest["counts"]["tokenizers"] == ["kiln", "sp", "imported"]
    # The run's own column is its tokenizer report, measured on the same documents.
    own = json.loads((run_dir / "tokenizer" / "report.json").read_text())["heldout"]
    for key in ("all", "per_source", "per_language", "parallel"):
        assert report[0][key] == own[key]

    docs = [d for s in list_shards(run_dir / "curate" / "shards") for d in read_shard(s)]
    held = [d for d in docs if is_heldout(split_key(d), CFG.heldout_fraction)]
    # The others, recounted with `tokenizers` itself: the text alone (no bos a template adds).
    for entry, path in zip(report[1:], [sentencepiece, imported / "tokenizer" / "tokenizer.json"], strict=True):
        reference = Tokenizer.from_file(str(path))
        tokens = {d.id: len(reference.encode(d.text, add_special_tokens=False).ids) for d in held}
        assert entry["vocab_size"] == reference.get_vocab_size()
        for lang, row in entry["per_language"].items():
            mine = [d for d in held if d.meta["language"] == lang]
            n_tokens = sum(tokens[d.id] for d in mine)
            n_bytes = sum(len(d.text.encode()) for d in mine)
            n_words = sum(len(words(d.text, lang)) for d in mine)
            assert (row["tokens"], row["bytes"], row["words"]) == (n_tokens, n_bytes, n_words)
            assert row["bytes_per_token"] == round(n_bytes / n_tokens, 4)
            assert row["tokens_per_word"] == round(n_tokens / n_words, 4)
        th = [d for d in held if d.meta["language"] == "th"]
        english = sum(tokens[f"en/{d.meta['parallel_id']}"] for d in th)
        assert entry["parallel"]["per_language"]["th"]["premium"] == round(sum(tokens[d.id] for d in th) / english, 4)
    # Trained on a few English lines, the others spend more tokens on Thai than kiln's tokenizer does.
    assert all(
        e["per_language"]["th"]["bytes_per_token"] < report[0]["per_language"]["th"]["bytes_per_token"]
        for e in report[1:]
    )

    table = (run_dir / "tokenizer-compare" / "summary.txt").read_text().splitlines()
    assert table[4].split() == ["kiln", "sp", "imported"]
    row = next(line.split() for line in table if line.startswith("  bytes/token [th]"))
    assert row[2:] == [f"{e['per_language']['th']['bytes_per_token']:.3f}" for e in report]
    row = next(line.split() for line in table if line.startswith("  tokens vs en [zh]"))
    assert row[4:] == [f"{e['parallel']['per_language']['zh']['premium']:.3f}" for e in report]
    assert compare(CFG, run_dir, [str(sentencepiece), str(imported)]) == manifest  # current: nothing redone
    assert (run_dir / "tokenizer" / "manifest.json").is_file()  # and the run's own tokenizer is untouched


def test_compare_from_the_command_line(run_dir, tmp_path, capsys):
    other = Path(shutil.copytree(run_dir, tmp_path / "smaller"))  # another kiln run: its tokenizer/ is kiln's own
    train_tokenizer(CFG.model_copy(update={"vocab_size": 800}), other)
    recipe = [
        "--set",
        f"runs_dir={tmp_path}",
        "--set",
        "name=run",
        *(f"--set=tokenizer.{k}={v}" for k, v in CFG.model_dump(exclude_defaults=True).items()),
    ]
    assert main(["train-tokenizer", *recipe, "--compare", str(other)]) == 0
    out = capsys.readouterr().out
    assert "held-out text by language (vs en:" in out  # the stage's own summary, then the comparison
    assert f"  smaller: {other} (vocab 800)" in out and out.index("held-out text") < out.index("smaller:")
    entries = json.loads((run_dir / "tokenizer-compare" / "report.json").read_text())["tokenizers"]
    assert (
        entries[1]["per_language"]
        == json.loads((other / "tokenizer" / "report.json").read_text())["heldout"]["per_language"]
    )
    assert main(["train-tokenizer", *recipe, "--sweep", "600", "--compare", str(other)]) == 2
    assert "--sweep and --compare: give one at a time" in capsys.readouterr().err


def test_a_location_without_a_tokenizer_is_fatal(run_dir, tmp_path):
    with pytest.raises(FatalError, match=r"--compare .*nowhere: no tokenizer there \(looked for .*tokenizer\.json"):
        compare(CFG, run_dir, [str(tmp_path / "nowhere")])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(FatalError, match=r"bad\.json: not a tokenizer\.json `tokenizers` reads"):
        compare(CFG, run_dir, [str(bad)])


def test_labels_name_the_run_or_folder():
    assert labels(["runs/llama", "runs/qwen/tokenizer", "x/sp/tokenizer.json", "runs/b/tokenizer/tokenizer.json"]) == [
        "llama",
        "qwen",
        "sp",
        "b",
    ]
    assert labels(["a/kiln", "b/m", "c/m"]) == ["kiln-1", "m", "m-3"]
