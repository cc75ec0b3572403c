"""FP8 training (train.precision.dtype=fp8, kiln.train.float8): which layers are converted, that
torchao's float8 matmuls follow bf16, that they compose with FSDP2, and where fp8 is refused.

PyTorch runs torch._scaled_mm on the CPU too (slowly: about 50 ms for a 512 x 64 x 192 product), so
one step of a tiny model shows the numbers; speed and 50-step losses are the GPU check's
(benchmarks/gpu_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from kiln.core.errors import ConfigError, FatalError
from kiln.core.manifest import hashed_settings
from kiln.model.config import ModelConfig, TrainPrecisionConfig
from kiln.model.init import build_model
from kiln.model.precision import Precision, resolve_precision
from kiln.train.config import TrainConfig
from kiln.train.distributed import apply_compile
from kiln.train.float8 import apply_float8, float8_layers
from kiln.train.mesh import check_layout
from kiln.train.parallel import ParallelConfig

# hidden 192: every block matrix is a multiple of 16, as _scaled_mm needs.
CFG = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)
TORCHRUN = Path(sys.executable).with_name("torchrun")


def batch() -> torch.Tensor:
    return torch.randint(0, 128, (4, 33), generator=torch.Generator().manual_seed(1))


def loss_of(model: torch.nn.Module, ids_BT: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits_BTV = model(ids_BT[:, :-1])
    return F.cross_entropy(logits_BTV.float().flatten(0, 1), ids_BT[:, 1:].flatten())


def grads(scaling: str | None) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(CFG, seed=0, device="cpu")
    if scaling:
        apply_float8(model, scaling)  # type: ignore[arg-type]
    loss = loss_of(model, batch())
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


def test_fp8_converts_the_blocks_linear_layers_and_keeps_the_parameter_names() -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = build_model(CFG, seed=0, device="cpu")
    names = dict(model.state_dict())
    converted = apply_float8(model, "tensorwise")
    per_block = ["attn.wk", "attn.wo", "attn.wq", "attn.wv", "mlp.w_down", "mlp.w_gate", "mlp.w_up"]
    assert converted == [f"blocks.{i}.{p}" for i in range(2) for p in per_block]
    assert {n for n, m in model.named_modules() if isinstance(m, Float8Linear)} == set(converted)
    assert type(model.lm_head) is torch.nn.Linear  # the output layer stays bf16
    # Checkpoints, resumable states and the export see the same tensors under the same names.
    assert {n: t.shape for n, t in model.state_dict().items()} == {n: t.shape for n, t in names.items()}


def test_a_layer_whose_shape_fp8_cannot_take_stays_bf16() -> None:
    odd = CFG.model_copy(update={"ffn_hidden": 200})  # 200 is not a multiple of 16
    names = float8_layers(build_model(odd, seed=0, device="cpu"))
    assert "blocks.0.attn.wq" in names and not any("mlp" in n for n in names)


def test_fp8_gradients_follow_bf16() -> None:
    bf16_loss, bf16 = grads(None)
    fp8_loss, fp8 = grads("tensorwise")
    assert fp8_loss == pytest.approx(bf16_loss, rel=1e-3)
    for name, g in bf16.items():
        # e4m3 keeps 3 mantissa bits and e5m2 (the gradients) 2: about 10% of each gradient's norm at
        # random init (measured 1.4% to 11%), all in the direction of bf16's.
        assert F.cosine_similarity(fp8[name].flatten(), g.flatten(), dim=0) >= 0.99, name
        assert fp8[name].norm() == pytest.approx(g.norm(), rel=0.05), name
    assert any(not torch.equal(fp8[n], bf16[n]) for n in bf16)  # the float8 matmuls did run


@pytest.mark.slow
def test_fp8_with_fsdp2_over_two_processes_follows_one_process(tmp_path: Path) -> None:
    _, whole = grads("tensorwise")
    out = tmp_path / "grads.pt"
    env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", Path(__file__).with_name("fp8_fsdp_worker.py"), out],
        check=True,
        env={**os.environ, **env},
        timeout=300,
    )
    sharded = torch.load(out)
    assert sharded.keys() == whole.keys()
    for name, g in whole.items():
        # Each rank scales its half of the activations by that half's own maximum: close, not equal.
        assert F.cosine_similarity(sharded[name].flatten(), g.flatten(), dim=0) >= 0.99, name
        assert sharded[name].norm() == pytest.approx(g.norm(), rel=0.05), name  # averaged over the ranks, not summed


def test_fp8_is_refused_where_there_are_no_fp8_matmuls(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match=r"dtype fp8 needs a CUDA GPU .* and device is cpu"):
        TrainConfig.model_validate({"precision": {"dtype": "fp8", "device": "cpu"}})
    cfg = TrainPrecisionConfig(dtype="fp8", fp8_scaling="rowwise")
    if not torch.cuda.is_available():
        with pytest.raises(FatalError, match=r"train\.precision\.dtype=fp8 needs a CUDA GPU .* device is cpu"):
            resolve_precision(cfg, "train")
    # A GPU before Ada (an A100 is compute capability 8.0) has no FP8 matmuls.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(FatalError, match=r"NVIDIA A100-SXM4-80GB has 8\.0; use train\.precision\.dtype=bf16"):
        resolve_precision(cfg, "train")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision(cfg, "train") == Precision(torch.device("cuda"), torch.bfloat16, "rowwise")


def test_fp8_settings_are_checked_and_left_unset_keep_the_hash() -> None:
    with pytest.raises(ValidationError, match="fp8_scaling applies with dtype fp8 only, and dtype is bf16"):
        TrainConfig.model_validate({"precision": {"dtype": "bf16", "fp8_scaling": "rowwise"}})
    # Unset, fp8_scaling is not hashed: runs trained before it existed stay current.
    assert "fp8_scaling" not in hashed_settings({"train": TrainConfig()})["train"]["precision"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_compiled_fp8_steps_on_cuda_follow_bf16(scaling: str) -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("this GPU has no FP8 matmuls")
    cfg = CFG.model_copy(update={"d_model": 256, "n_heads": 8, "n_kv_heads": 4})
    losses = {}
    for name in ("bf16", "fp8"):
        torch.compiler.reset()
        model = build_model(cfg, seed=0, device="cuda")
        if name == "fp8":
            apply_float8(model, scaling)  # type: ignore[arg-type]
        apply_compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        ids_BT = batch().repeat(8, 1).cuda()
        for _ in range(10):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits_BTV = model(ids_BT[:, :-1])
            loss = F.cross_entropy(logits_BTV.float().flatten(0, 1), ids_BT[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses[name] = loss.item()
    assert losses["fp8"] == pytest.approx(losses["bf16"], rel=0.02)


def test_fp8_with_tensor_parallelism_is_refused() -> None:
    cfg = TrainConfig.model_validate({"precision": {"dtype": "fp8"}})
    degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 2}
    with pytest.raises(ConfigError, match=r"train\.precision\.dtype=fp8 .* parallel\.tp \(2\) splits them"):
        check_layout(CFG, cfg, ParallelConfig(tp=2), degrees, torch.bfloat16)


def test_eval_and_generate_take_no_fp8() -> None:
    from kiln.evaluate.config import EvalConfig

    with pytest.raises(ValidationError, match="dtype"):
        EvalConfig.model_validate({"precision": {"dtype": "fp8"}})
