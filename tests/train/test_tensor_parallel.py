"""Tensor parallelism: the shapes it refuses, a tied output matrix kept tied, the q/k norms'
gains replicated and the q/k/v biases split with their rows. Training under it is tested through torchrun in
tests/train/test_pipeline_parallel.py, on the tiny preset tied and with QK-norm, each against one
process: 2 pipeline stages x tp 2, and a state saved by pipeline stages resumed under FSDP2
(dp_shard 2) x tp 2 with sequence parallelism.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig
from kiln.train.mesh import check_tensor_parallel


def test_shapes_tensor_parallelism_cannot_split_are_refused_with_the_reason() -> None:
    check_tensor_parallel(ModelConfig(preset="tiny"), 2)  # 4 heads, 2 key/value heads, width 384
    with pytest.raises(
        ConfigError,
        match=(
            r"model.n_kv_heads \(2\) is not a multiple of parallel.tp \(4\).*grouped-query attention splits only when "
            r"tp divides the key/value heads"
        ),
    ):
        check_tensor_parallel(ModelConfig(preset="tiny"), 4)
    with pytest.raises(ConfigError, match=r"model.n_heads \(4\) is not a multiple of parallel.tp \(3\)"):
        check_tensor_parallel(ModelConfig(preset="tiny", n_kv_heads=None), 3)
    check_tensor_parallel(ModelConfig(preset="tiny", qk_norm=True), 2)  # the q/k norms' gains are replicated over tp
    with pytest.raises(
        ConfigError,
        match=(
            r"parallel.tp=2 cannot split this model: model.z_loss: its log-normaliser needs every vocabulary shard's "
            r"logits"
        ),
    ):
        check_tensor_parallel(ModelConfig(preset="tiny", qk_norm=True, z_loss=1e-4), 2)


def test_a_tied_output_matrix_stays_tied_and_the_logits_are_the_models(tmp_path: Path) -> None:
    # One gloo rank: the plans make DTensors (of one shard) through the same code as with several,
    # and the tied embedding and output layer must be one parameter again afterwards. The q/k
    # norms' gains, shared by the heads each rank splits, are replicated (their gradients summed); the
    # q/k/v biases are split with their matrices' rows (ColwiseParallel's Shard(0)), each rank's heads' own.
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from kiln.model.init import build_model
    from kiln.train.tensor_parallel import apply_tensor_parallel

    cfg = ModelConfig(preset="tiny", vocab_size=256, max_seq_len=64, qk_norm=True, attention_bias=True)
    plain, split = build_model(cfg, 0, "cpu"), build_model(cfg, 0, "cpu")
    with torch.no_grad():  # biases start at zero: the same random ones in both, so they count in the comparison
        for (name, p), q in zip(plain.named_parameters(), split.parameters(), strict=True):
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
                q.copy_(p)
    ids_BT = torch.randint(0, 256, (2, 16))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        apply_tensor_parallel(split, init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)), sequence_parallel=False)
        assert split.lm_head.weight is split.embed.weight and len(list(split.parameters())) == len(
            list(plain.parameters())
        )
        gains = [p for name, p in split.named_parameters() if name.endswith(("q_norm.weight", "k_norm.weight"))]
        assert len(gains) == 2 * cfg.n_layers and all(
            isinstance(g, DTensor) and g.placements == (Replicate(),) for g in gains
        )
        biases = [p for name, p in split.named_parameters() if name.endswith(".bias")]
        assert len(biases) == 3 * cfg.n_layers and all(b.placements == (Shard(0),) for b in biases)
        torch.testing.assert_close(split(ids_BT), plain(ids_BT))
    finally:
        dist.destroy_process_group()
