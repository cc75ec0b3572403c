"""kiln.model.weights: a checkpoint loads into any config of the same architecture, however spelt,
and a different architecture is refused with each differing key named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.core.errors import FatalError
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.model.weights import load_trained_model, load_weights_into, save_weights

BASE = ModelConfig(vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)


def test_the_same_architecture_spelt_otherwise_loads(tmp_path: Path) -> None:
    saved = build_model(BASE, 0, "cpu")
    save_weights(tmp_path / "ckpt", saved)
    # The width given exactly instead of by the default multiplier; a z-loss and another init for
    # the continued run: the same weights mean the same model.
    other = build_model(
        BASE.model_copy(
            update={"ffn_hidden": BASE.hidden, "z_loss": 1e-4, "init_std": 0.01, "init_depth_scale": "layer"}
        ),
        1,
        "cpu",
    )
    load_weights_into(other, tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), other.state_dict().values(), strict=True))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"d_model": 128}, "model.d_model: 64 in the checkpoint, 128 here"),
        ({"n_kv_heads": 4}, "model.n_kv_heads: 2 in the checkpoint, 4 here"),
        ({"qk_norm": True}, "model.qk_norm"),
    ],
)
def test_another_architecture_is_refused_by_key(tmp_path: Path, change: dict, named: str) -> None:
    save_weights(tmp_path / "ckpt", build_model(BASE, 0, "cpu"))
    with pytest.raises(FatalError, match=named):
        load_weights_into(build_model(BASE.model_copy(update=change), 0, "cpu"), tmp_path / "ckpt")


def _damage(folder: Path, how: str) -> None:
    weights, config = folder / "model.safetensors", folder / "config.json"
    if how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "garbage weights":
        weights.write_bytes(b"\x00" * 64)
    elif how == "missing weights":
        weights.unlink()
    elif how == "config not json":
        config.write_text("{not json")
    elif how == "config too big to build":  # a hand-edited layer count: refused before any tensor exists
        config.write_text(config.read_text().replace('"n_layers": 2', '"n_layers": 1000000000'))
    elif how == "config out of range":
        config.write_text(config.read_text().replace('"d_model": 64', '"d_model": -3'))
    else:  # a config that disagrees with the weights it sits beside
        config.write_text(config.read_text().replace('"d_model": 64', '"d_model": 128'))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("truncated weights", r"model.safetensors: cannot be read as safetensors \(SafetensorError"),
        ("garbage weights", r"model.safetensors: cannot be read as safetensors"),
        ("missing weights", r"model.safetensors: missing; the checkpoint folder holds only config.json"),
        ("config not json", r"config.json: not a kiln checkpoint config \(JSONDecodeError"),
        (
            "config out of range",
            r"config.json: model.d_model: Input should be greater than or equal to 8; the file is damaged",
        ),
        (
            "config too big to build",
            (
                r"config.json: a [0-9,]+-parameter model \(fp32\) needs [0-9,.]+ GB of memory and this machine has "
                r"[0-9,.]+ GB available"
            ),
        ),
        (
            "config disagrees",
            (
                r"model.safetensors: the weights do not match .*config.json \(size mismatch for .*\); the two files "
                r"are from different models"
            ),
        ),
    ],
)
def test_a_damaged_checkpoint_is_one_clear_error_naming_the_file(tmp_path: Path, how: str, message: str) -> None:
    save_weights(tmp_path / "ckpt", build_model(BASE, 0, "cpu"))
    _damage(tmp_path / "ckpt", how)
    with pytest.raises(FatalError, match=message):
        load_trained_model(tmp_path / "ckpt")
