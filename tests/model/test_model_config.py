"""kiln.model.config: parameter and FLOP counts against the real model, and config validation."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.model.transformer import Transformer

CONFIGS = {
    "untied_mha": ModelConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4),
    "tied": ModelConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=4, tie_embeddings=True),
    "gqa": ModelConfig(vocab_size=77, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2),
    "mqa_tied": ModelConfig(vocab_size=50, d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, tie_embeddings=True),
    "custom_ffn": ModelConfig(vocab_size=60, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=40),
    "demo_shape": ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, tie_embeddings=True),
    "qwen2_biases": ModelConfig(vocab_size=90, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, attention_bias=True),
    "qwen3_wide_heads": ModelConfig(
        vocab_size=90, d_model=30, n_layers=2, n_heads=3, n_kv_heads=1, head_dim=16, qk_norm=True, attention_bias=True
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_count_params_equals_the_models_parameters(name: str) -> None:
    cfg = CONFIGS[name]
    model = Transformer(cfg)
    # parameters() yields a tied weight once, which is what count_params must count.
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())
    embedding_params = model.embed.weight.numel() + (0 if cfg.tie_embeddings else model.lm_head.weight.numel())
    assert count_params(cfg, include_embeddings=False) == sum(p.numel() for p in model.parameters()) - embedding_params


def test_tied_model_counts_its_embedding_once() -> None:
    tied, untied = CONFIGS["tied"], CONFIGS["untied_mha"]
    assert count_params(untied) - count_params(tied) == 100 * 32


def test_demo_shape_params_by_hand() -> None:
    # d=256, head_dim 64, 2 kv heads: attention 256*256 + 2*256*128 + 256*256 = 196,608;
    # SwiGLU hidden ceil(682/64)*64 = 704, so 3*256*704 = 540,672; norms 2*256 = 512.
    # 4 blocks * 737,792 + final norm 256 = 2,951,424; tied embedding 8192*256 = 2,097,152.
    cfg = CONFIGS["demo_shape"]
    assert cfg.hidden == 704
    assert count_params(cfg, include_embeddings=False) == 2_951_424
    assert count_params(cfg) == 5_048_576


def test_default_ffn_hidden_is_llama_rounding() -> None:
    # 8/3 * d rounded up to a multiple of 64.
    assert ModelConfig(d_model=64, n_heads=2).hidden == 192  # 170 -> 192
    assert ModelConfig(d_model=96, n_heads=2).hidden == 256  # 256 exactly
    assert ModelConfig(d_model=64, n_heads=2, ffn_hidden=100).hidden == 100


def test_flops_per_token_by_hand() -> None:
    cfg = ModelConfig(vocab_size=100, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=32)
    # head_dim 8. Per block matmul params: wq 16*16 + wk 16*8 + wv 16*8 + wo 16*16 = 768,
    # SwiGLU 3*16*32 = 1,536; two blocks = 4,608; output projection 100*16 = 1,600.
    # N = 4,608 + 1,600 = 6,208 -> 6N = 37,248.
    # Attention (PaLM App. B): 12 * n_layers * seq_len * (n_heads * head_dim) = 12*2*8*16 = 3,072.
    # Total 37,248 + 3,072 = 40,320 FLOPs per token at seq_len 8.
    assert flops_per_token(cfg, seq_len=8) == 40_320
    # The attention term grows linearly with seq_len: +12*2*16 = 384 per extra token of context.
    assert flops_per_token(cfg, seq_len=9) - flops_per_token(cfg, seq_len=8) == 384


def test_head_dim_and_attention_biases_by_hand() -> None:
    # d=30, 3 heads of 16 (not 30/3), 1 kv head: wq 30*48 + wk 30*16 + wv 30*16 + wo 48*30 = 3,840 matrix weights,
    # biases 48 + 16 + 16 = 80, q/k norms 2*16 and block norms 2*30 = 92; SwiGLU hidden 80 -> 128: 3*30*128 = 11,520.
    cfg = CONFIGS["qwen3_wide_heads"]
    assert cfg.head_width == 16 and cfg.hidden == 128
    assert count_params(cfg, include_embeddings=False) == 2 * (3_840 + 80 + 92 + 11_520) + 30
    # The biases are additions, not matrix products: the FLOPs are those of the same model without them.
    assert flops_per_token(cfg, 8) == flops_per_token(cfg.model_copy(update={"attention_bias": False}), 8)
    # 6 * (two blocks of 15,360 matrix weights + the 90*30 output projection) + 12 * 2 layers * 8 tokens * 48.
    assert flops_per_token(cfg, 8) == 6 * (2 * 15_360 + 2_700) + 12 * 2 * 8 * 48


def test_flops_per_token_counts_output_projection_whether_tied_or_not() -> None:
    # The input embedding is a lookup; the output projection is a matmul either way.
    assert flops_per_token(CONFIGS["tied"], 16) == flops_per_token(CONFIGS["untied_mha"], 16)


def test_resolved_fills_only_a_missing_vocab() -> None:
    assert ModelConfig(d_model=32, n_heads=2).resolved(300).vocab_size == 300
    assert ModelConfig(vocab_size=512, d_model=32, n_heads=2).resolved(300).vocab_size == 512


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model (30) must be a multiple of n_heads (4), or give model.head_dim"),
        ({"d_model": 30, "n_heads": 4, "head_dim": 9}, "head_dim (9) must be even"),
        ({"d_model": 30, "n_heads": 2}, "head_dim d_model/n_heads = 15 must be even"),
        ({"d_model": 36, "n_heads": 6, "n_kv_heads": 4}, "n_heads (6) must be a multiple of n_kv_heads (4)"),
        (
            {
                "rope_scaling": {
                    "type": "llama3",
                    "factor": 8,
                    "low_freq_factor": 4,
                    "high_freq_factor": 4,
                    "original_max_position_embeddings": 64,
                }
            },
            "high_freq_factor (4.0) must exceed low_freq_factor (4.0)",
        ),
        (
            {"rope_scaling": {"type": "yarn", "factor": 4}},
            "does not match any of the expected tags: 'linear', 'llama3'",
        ),
    ],
)
def test_invalid_head_geometry_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        ModelConfig(**kwargs)


def test_unknown_key_is_rejected() -> None:
    with pytest.raises(ValidationError, match="n_layer"):
        ModelConfig(n_layer=2)
