"""Flex attention with a block mask computes what SDPA with the dense mask computes, rule by rule."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from kiln.core.errors import FatalError
from kiln.core.manifest import hashed_settings
from kiln.model.attention import AttentionRule, leading
from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.train.config import TrainConfig
from kiln.train.distributed import apply_compile
from kiln.train.parts import attention_kernel

# 300 positions: two whole 128-position blocks and a partial third (flex pads the last block).
T = 300


def documents(rows: int, T: int, seed: int) -> torch.Tensor:
    """(rows, T) int64 document index per position: documents of 20 to 140 positions."""
    g = torch.Generator().manual_seed(seed)
    return torch.cumsum(torch.rand(rows, T, generator=g) < 1 / 80, dim=1)


def rules(B: int) -> dict[str, AttentionRule]:
    doc_BT = documents(B, T, seed=4)
    prefix_BT = leading(torch.tensor([40, 170]), T)
    return {
        "causal within documents": AttentionRule("causal", doc_ids_BT=doc_BT),
        "full within documents": AttentionRule("full", doc_ids_BT=doc_BT),
        "prefix": AttentionRule("prefix", prefix_BT=prefix_BT),
        "prefix within documents": AttentionRule("prefix", prefix_BT=prefix_BT, doc_ids_BT=doc_BT),
    }


# On the CPU flex attention runs unfused (PyTorch warns so): the GPU compiles it.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", list(rules(2)))
def test_flex_and_the_dense_mask_give_the_same_logits(name: str) -> None:
    # GQA (4 query heads over 2 key/value heads): flex reads each group's K/V head, SDPA gets them copied per head.
    cfg = ModelConfig(vocab_size=101, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=T)
    model = build_model(cfg, seed=0, device="cpu").eval()
    ids_BT = torch.randint(0, 101, (2, T), generator=torch.Generator().manual_seed(1))
    rule = rules(2)[name]
    with torch.no_grad():  # PyTorch has no flex attention backward on the CPU; the GPU check covers gradients
        dense = model(ids_BT, rule=rule)
        flex = model(ids_BT, rule=AttentionRule(rule.kind, rule.prefix_BT, rule.doc_ids_BT, kernel="flex"))
    assert torch.allclose(flex, dense, atol=1e-5, rtol=1e-5), (flex - dense).abs().max()


def test_the_block_mask_skips_blocks_outside_every_document() -> None:
    # Worked by hand: 512 positions, four documents of 128 (one per 128 x 128 block). Causal within
    # documents, a query sees only keys of its own block: the 4 diagonal blocks of 16, none of them
    # whole (each is lower-triangular), so flex computes 4 blocks where the dense mask computes 16.
    doc_BT = torch.arange(512).div(128, rounding_mode="floor")[None]
    mask = AttentionRule("causal", doc_ids_BT=doc_BT, kernel="flex").block_mask(512, torch.device("cpu"))
    assert mask.kv_num_blocks.tolist() == [[[1, 1, 1, 1]]]  # per query block: one block of keys, partly masked
    assert mask.full_kv_num_blocks.tolist() == [[[0, 0, 0, 0]]]
    assert mask.kv_indices[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    # Full attention within the same documents: each diagonal block is whole (no mask inside it).
    whole = AttentionRule("full", doc_ids_BT=doc_BT, kernel="flex").block_mask(512, torch.device("cpu"))
    assert whole.kv_num_blocks.tolist() == [[[0, 0, 0, 0]]] and whole.full_kv_num_blocks.tolist() == [[[1, 1, 1, 1]]]


def test_plain_rules_keep_the_sdpa_fast_paths_under_flex() -> None:
    # No mask to apply: SDPA's causal and unmasked kernels stay in use whatever the kernel.
    cpu = torch.device("cpu")
    assert AttentionRule("causal", kernel="flex").sdpa_kwargs(8, cpu) == {"is_causal": True}
    assert AttentionRule("full", kernel="flex").sdpa_kwargs(8, cpu) == {}
    masked = AttentionRule("causal", doc_ids_BT=torch.zeros(1, 8, dtype=torch.long), kernel="flex")
    assert set(masked.sdpa_kwargs(8, cpu)) == {"block_mask"}


def test_the_trainer_takes_flex_on_cuda_in_compiled_blocks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert attention_kernel(None, cpu, compiled=True) == "sdpa"
    assert attention_kernel(None, cuda, compiled=False) == "sdpa"  # uncompiled, flex would compute every score
    assert attention_kernel("sdpa", cuda, compiled=True) == "sdpa"
    for capability, kernel in (((9, 0), "flex"), ((7, 0), "sdpa")):  # an H100; a V100 has no flex kernels
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert attention_kernel(None, cuda, compiled=True) == kernel
    with pytest.raises(FatalError, match=r"train\.attention_kernel=flex trains on CUDA only .* device is cpu"):
        attention_kernel("flex", cpu, compiled=True)
    with pytest.raises(ValidationError, match=r"attention_kernel flex trains on CUDA only .* precision\.device is cpu"):
        TrainConfig.model_validate({"attention_kernel": "flex", "precision": {"device": "cpu"}})
    with pytest.raises(ValidationError, match=r"attention_kernel flex runs inside the compiled blocks"):
        TrainConfig.model_validate({"attention_kernel": "flex", "compile": False})
    # Left unset it is not hashed: runs trained before it existed stay current.
    assert "attention_kernel" not in hashed_settings({"train": TrainConfig()})["train"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["causal within documents", "prefix within documents"])
def test_flex_gradients_on_cuda_follow_the_dense_mask(name: str) -> None:
    # Compiled blocks, as the trainer runs flex; QK-norm's fp32 gains give fp32 queries and keys under autocast.
    cfg = ModelConfig(vocab_size=101, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=T, qk_norm=True)
    rule = rules(2)[name]
    grads = []
    for kernel in ("sdpa", "flex"):
        model = build_model(cfg, seed=0, device="cuda")
        apply_compile(model)
        ids_BT = torch.randint(0, 101, (2, T), generator=torch.Generator().manual_seed(1)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids_BT, rule=AttentionRule(rule.kind, rule.prefix_BT, rule.doc_ids_BT, kernel=kernel))
        logits.float().square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    dense, flex = grads
    assert (flex - dense).abs().max() <= 2e-2 * dense.abs().max()
