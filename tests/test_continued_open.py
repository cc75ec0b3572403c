"""recipes/open-replay.yaml and recipes/continued-open.yaml at miniature size: an open model built
with transformers (its own byte-level tokenizer, bf16 shards) is imported, continued on the demo's
prose with general text replayed, and reports what it gained; with FSDP2 over 2 processes it
trains as 1 process does."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hf_tokenizers import save as save_tokenizer
from minidemo import KILN, snapshot_corpus

from kiln.cli import main
from kiln.core.layout import RunLayout
from kiln.model.weights import load_trained_model
from kiln.text.load import load_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

SMALL = ["curate.max_total_mb=0.5", "tokenize.val_fraction=0.2"]
TRAIN = [
    "train.seq_len=64",
    "train.micro_batch_size=4",
    "train.global_batch_tokens=512",
    "train.steps=12",
    "train.schedule.warmup_fraction=0.1",
    "eval.max_tokens_per_source=2048",
]


def open_model(folder: Path) -> None:
    """A random SmolLM2-shaped Llama (tied, GQA) with a GPT-2-style tokenizer, stored in bf16 shards."""
    save_tokenizer("gpt2", folder)
    config = transformers.LlamaConfig(
        vocab_size=600,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder, max_shard_size="100KB")


def stage(verb: str, recipe: str, runs: Path, *overrides: str) -> None:
    args = [verb, "--recipe", recipe, "--set", f"runs_dir={runs}"]
    for o in (*overrides, snapshot_corpus(recipe, [*SMALL, *overrides], runs.parent / "corpus")):
        args += ["--set", o]
    assert main(args) == 0, args


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """open-base imported, open-replay tokenized, continued-open tokenized: everything up to training."""
    root = tmp_path_factory.mktemp("continued-open")
    runs = root / "runs"
    open_model(root / "open-model")
    assert main(["import-hf", str(root / "open-model"), "--run", "open-base", "--set", f"runs_dir={runs}"]) == 0
    base = [f"tokenizer.from_run={runs / 'open-base'}", *SMALL]
    for verb in ("curate", "train-tokenizer", "tokenize"):
        stage(verb, "open-replay", runs, *base)
    for verb in ("curate", "train-tokenizer", "tokenize"):
        stage(verb, "continued-open", runs, *base)
    return {"root": root, "runs": runs}


def train(runs: Path, base: Path, *extra: str, nproc: int = 1) -> dict:
    """`kiln train --recipe continued-open` on `runs` (a copy of the tokenized run) through the command;
    base: the runs folder holding open-base and open-replay."""
    args = [str(KILN), "train", "--recipe", "continued-open", "--nproc", str(nproc)]
    overrides = [
        f"runs_dir={runs}",
        f"tokenizer.from_run={base / 'open-base'}",
        f"mix.replay.run={base / 'open-replay'}",
        f"train.init_from={base / 'open-base' / 'train' / 'checkpoint'}",
        *SMALL,
        *TRAIN,
    ]
    for o in (*overrides, *extra):
        args += ["--set", o]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((runs / "continued-open" / "train" / "manifest.json").read_text())


def copy_of(tokenized: dict[str, Path], dest: Path) -> Path:
    """The continued-open run up to its token shards, copied; its references stay the module's runs."""
    runs = dest / "copy" / "runs"
    shutil.copytree(tokenized["runs"] / "continued-open", runs / "continued-open")
    return runs


@pytest.fixture(scope="module")
def one_process(tokenized: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The recipe trained on one process, on a copy of the tokenized run: its runs folder and train manifest.
    The first test reads it and the FSDP2 test compares 2 processes with it (one training, not two)."""
    copied = copy_of(tokenized, tmp_path_factory.mktemp("one-process"))
    return copied, train(copied, tokenized["runs"])


def test_the_open_model_continues_on_the_domain_with_replay_and_reports_the_change(
    tokenized: dict[str, Path], one_process: tuple[Path, dict]
) -> None:
    runs = tokenized["runs"]
    tok = load_tokenizer(RunLayout(runs / "continued-open").tokenizer_json)
    assert tok.kind == "hf" and tok.eot_id == 0
    summary = (runs / "continued-open" / "tokenize" / "summary.txt").read_text()
    assert "each document: no bos + text + <|endoftext|> (id 0)" in summary
    copied, manifest = one_process
    counts = manifest["counts"]
    change = counts["val_change"]
    assert set(change) == {"docs", "prose", "open-replay/code"}
    # The model section came from the imported checkpoint (the recipe has none).
    assert (
        json.loads((copied / "continued-open" / "train" / "checkpoint" / "config.json").read_text())["model"]["d_model"]
        == 64
    )
    assert all(c["change"] < 0 for c in change.values()), change  # a random start gains everywhere
    read = counts["tokens_by_source"]
    assert 0.1 < read["open-replay/code"] / sum(read.values()) < 0.45  # mix.replay.fraction 0.25 of 12 steps


def test_fsdp2_over_two_processes_trains_as_one_process_does(
    tokenized: dict[str, Path], one_process: tuple[Path, dict], tmp_path: Path
) -> None:
    one = one_process[1]["counts"]  # on 1 process every parallel degree is 1 (dp_shard's -1 included)
    two = train(copy_of(tokenized, tmp_path / "two"), tokenized["runs"], "parallel.dp_shard=-1", nproc=2)["counts"]
    assert two["processes"] == 2 and one["processes"] == 1
    for source, c in one["val_change"].items():
        assert two["val_change"][source]["after"] == pytest.approx(c["after"], abs=2e-3), source


def test_an_extended_open_model_continues_and_exports_with_its_new_vocabulary(
    tokenized: dict[str, Path], tmp_path: Path
) -> None:
    """extend-tokenizer on the imported run, then continued pretraining from tokenizer-extended/ (its
    tokenizer and checkpoint), exported: transformers reads the new tokens with kiln's ids and logits."""
    base = tokenized["runs"]
    runs = tmp_path / "runs"
    shutil.copytree(base / "open-base", runs / "open-base")
    terms = tmp_path / "terms.txt"
    terms.write_text("pretraining\ndataloader\n")
    assert (
        main(["extend-tokenizer", "--terms", str(terms), "--set", f"runs_dir={runs}", "--set", "name=open-base"]) == 0
    )
    extended = runs / "open-base" / "tokenizer-extended"
    shutil.copytree(base / "continued-open" / "curate", runs / "continued-open" / "curate")
    from_extended = [f"tokenizer.from_run={extended}", *SMALL]
    for verb in ("train-tokenizer", "tokenize"):
        stage(verb, "continued-open", runs, *from_extended)
    tok = load_tokenizer(RunLayout(runs / "continued-open").tokenizer_json)
    assert len(tok.encode(" pretraining")) == 1 and tok.vocab_size > 600
    args = ["train", "--recipe", "continued-open", "--set", f"runs_dir={runs}", "--set", "mix.replay=null"]
    for o in (*from_extended, f"train.init_from={extended / 'checkpoint'}", *TRAIN):
        args += ["--set", o]
    assert main(args) == 0  # in this process: a kiln subprocess would spend 4 s on imports
    assert main(["export", "--recipe", "continued-open", "--set", f"runs_dir={runs}"]) == 0
    folder = runs / "continued-open" / "export" / "hf"
    text = "Resume pretraining when the dataloader stalls."
    auto = transformers.AutoTokenizer.from_pretrained(folder, split_special_tokens=True)
    ids = tok.encode(text)
    assert auto(text, add_special_tokens=False)["input_ids"] == ids and len(auto) == tok.vocab_size
    ours = load_trained_model(RunLayout(runs / "continued-open").checkpoint)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (ours(torch.tensor([ids])) - theirs(torch.tensor([ids])).logits).abs().max().item() < 1e-6
