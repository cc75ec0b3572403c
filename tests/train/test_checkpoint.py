"""kiln.train.checkpoint: the saved folder reloads into the same model, and bad folders fail loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from kiln.core.errors import FatalError
from kiln.model.config import ModelConfig
from kiln.model.transformer import Transformer
from kiln.model.weights import FORMAT, load_trained_model
from kiln.train.checkpoint import save_checkpoint


def make_model(tied: bool) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=16, tie_embeddings=tied)
    )


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_gives_identical_logits(tmp_path: Path, tied: bool) -> None:
    model = make_model(tied).eval()
    state = {"step": 7, "note": "anything picklable"}
    paths = save_checkpoint(tmp_path / "ckpt", model, state)
    assert [p.name for p in paths] == ["model.safetensors", "config.json", "train_state.pt"]
    assert all(p.is_file() for p in paths)

    loaded = load_trained_model(tmp_path / "ckpt")
    assert not loaded.training
    assert loaded.cfg == model.cfg
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))
    if tied:
        assert loaded.lm_head.weight is loaded.embed.weight
    assert torch.load(tmp_path / "ckpt" / "train_state.pt") == state


def test_tied_embedding_is_stored_once(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "tied", make_model(True), {})
    save_checkpoint(tmp_path / "untied", make_model(False), {})
    with safe_open(tmp_path / "tied" / "model.safetensors", "pt") as f:
        tied_keys = set(f.keys())
    with safe_open(tmp_path / "untied" / "model.safetensors", "pt") as f:
        untied_keys = set(f.keys())
    assert len(untied_keys) - len(tied_keys) == 1
    assert (tmp_path / "untied" / "model.safetensors").stat().st_size - (
        tmp_path / "tied" / "model.safetensors"
    ).stat().st_size >= 50 * 32 * 4


def test_config_json_carries_format_and_resolved_config(tmp_path: Path) -> None:
    model = make_model(False)
    save_checkpoint(tmp_path, model, {})
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["format"] == FORMAT == "kiln-checkpoint v1"
    assert ModelConfig.model_validate(meta["model"]) == model.cfg


def test_missing_checkpoint_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(FatalError, match="config.json missing.*kiln train"):
        load_trained_model(tmp_path)


def test_wrong_format_is_fatal(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, make_model(False), {})
    meta = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**meta, "format": "kiln-checkpoint v0"}))
    with pytest.raises(FatalError, match="format 'kiln-checkpoint v0', expected 'kiln-checkpoint v1'"):
        load_trained_model(tmp_path)


def test_saving_again_replaces_the_checkpoint_and_clears_leftovers(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, make_model(False), {"step": 1})
    (tmp_path / "ckpt.tmp").mkdir()  # left by a crash mid-write
    (tmp_path / "ckpt.tmp" / "model.safetensors").write_bytes(b"partial")
    save_checkpoint(folder, make_model(True), {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert torch.load(folder / "train_state.pt")["step"] == 2
    assert load_trained_model(folder).cfg.tie_embeddings
