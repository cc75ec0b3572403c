"""Shared by the trainer's tests: one real miniature run, curated, with a tokenizer and token
shards, built once per session (about 3 s on 2 cores).

The run: the stdlib email package as source `code`, the system's license texts as `legal`, a
512-token BPE, token shards with a 20% validation split. Tests that train work on copies
of its upstream stages, so the shared run is never written to.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
from basic_curation import ONLY_BASIC_STEPS

from kiln.curate.config import CurateConfig, InputConfig
from kiln.curate.run import run as curate
from kiln.tokenize.config import TokenizeConfig, TokenizerConfig
from kiln.tokenize.encode import run as encode
from kiln.tokenize.train import run as train_tokenizer


def build_tokenized_run(root: Path) -> Path:
    """Curate, train a tokenizer and tokenize real text under root; returns the run directory."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    (root / "data" / "code").mkdir(parents=True)
    for p in sorted((stdlib / "email").glob("*.py")):
        shutil.copy(p, root / "data" / "code" / p.name)
    (root / "data" / "legal").mkdir()
    licenses = Path("/usr/share/common-licenses")
    legal = (
        sorted(p for p in licenses.iterdir() if p.is_file())
        if licenses.is_dir()
        else sorted((stdlib / "http").glob("*.py"))
    )
    for p in legal:
        shutil.copy(p, root / "data" / "legal" / p.name)
    inputs = (
        InputConfig(source="code", format="text", path=str(root / "data" / "code" / "*.py")),
        InputConfig(source="legal", format="text", path=str(root / "data" / "legal" / "*")),
    )
    run_dir = root / "run"
    curate(CurateConfig(inputs=inputs, executor={"workers": 1}, **ONLY_BASIC_STEPS), run_dir)
    train_tokenizer(TokenizerConfig(vocab_size=512, sample_mb=0.3), run_dir)
    counts = encode(TokenizeConfig(val_fraction=0.2), run_dir)["counts"]
    for source, splits in counts["per_source"].items():
        assert splits["train"]["tokens"] > 10_000 and splits["val"]["tokens"] > 1_000, (source, splits)
    return run_dir


@pytest.fixture(scope="session")
def tokenized_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenized_run(tmp_path_factory.mktemp("kiln_tokenized"))
