"""Tensor parallelism through torchrun on the CPU (gloo), on the tiny preset (4 query heads, 2
key/value heads, tied embeddings): the layouts train the same model as one process with the same
global batch, 10 steps, losses within 1e-4 relative. (A state saved under tp=2 resumes as a
pipeline: tests/train/test_pipeline_parallel.py.)

Each launch is a real `torchrun --standalone -m kiln train` on a copy of the shared miniature run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from launches import TINY, assert_same_losses, assert_states_as_planned, launch
from safetensors.torch import load_file

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig
from kiln.train.tensor_parallel import check_tensor_parallel

STEPS = 10


def test_shapes_tensor_parallelism_cannot_split_are_refused_with_the_reason() -> None:
    check_tensor_parallel(ModelConfig(preset="tiny"), 2)  # 4 heads, 2 key/value heads, width 384
    with pytest.raises(ConfigError, match=r"model.n_kv_heads \(2\) is not a multiple of parallel.tp \(4\).*grouped-query attention splits only when tp divides the key/value heads"):
        check_tensor_parallel(ModelConfig(preset="tiny"), 4)
    with pytest.raises(ConfigError, match=r"model.n_heads \(4\) is not a multiple of parallel.tp \(3\)"):
        check_tensor_parallel(ModelConfig(preset="tiny", n_kv_heads=None), 3)
    with pytest.raises(ConfigError, match=r"model.qk_norm.*; model.z_loss"):
        check_tensor_parallel(ModelConfig(preset="tiny", qk_norm=True, z_loss=1e-4), 2)


@pytest.fixture(scope="module")
def single(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("single_tiny")
    return launch(tokenized_run, root, 1, steps=STEPS, model=TINY), root


@pytest.mark.slow
def test_fsdp2_with_tensor_and_sequence_parallelism_matches_one_process(single: tuple[list, Path], tokenized_run: Path, tmp_path: Path) -> None:
    # 4 processes: 2 data ranks (FSDP2) x tp 2, sequence parallel. Each data rank takes 2 of the
    # 4 micro-batches of 4 rows one process takes; the two ranks of a tp group take the same rows.
    one, one_root = single
    four = launch(tokenized_run, tmp_path, 4, "parallel.dp_shard=2", "parallel.tp=2", "parallel.sequence_parallel=true", steps=STEPS, model=TINY)
    assert_same_losses(four, one, STEPS)
    ours = load_file(tmp_path / "runs" / "run" / "train" / "checkpoint" / "model.safetensors")
    theirs = load_file(one_root / "runs" / "run" / "train" / "checkpoint" / "model.safetensors")
    assert ours.keys() == theirs.keys() and "embed.weight" in ours  # tied: stored once, whole
    assert all(torch.allclose(ours[k], theirs[k], rtol=1e-3, atol=1e-4) for k in ours)
    manifest = json.loads((tmp_path / "runs" / "run" / "train" / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["processes"] == 4 and counts["parallel"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert_states_as_planned(manifest, 0.01)

