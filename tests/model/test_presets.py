"""kiln.model.presets: the planner's counts equal the model code's, built on the meta device.

Meta tensors have shapes but no storage, so a 7B (or 70B) model costs nothing to build; the
parameter count is sum(p.numel()) and the FLOPs are what torch's FlopCounterMode records for
one forward and backward pass.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch.utils.flop_counter import FlopCounterMode

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig, count_params, flops_per_token, get_preset
from kiln.model.presets import PRESETS
from kiln.model.transformer import Transformer

# Every option the presets can be overridden with, on a small shape: each changes the parameter
# set or the computation, and the counts must follow.
OPTIONS = {
    "mqa": {"n_kv_heads": 1},
    "relu2": {"activation": "relu2"},
    "gelu_wide": {"activation": "gelu", "ffn_multiplier": 6},
    "qk_norm": {"qk_norm": True},
    "untied_softcap": {"tie_embeddings": False, "logit_softcap": 30.0},
    "depth_init_rope": {"init_depth_scale": "layer", "rope_theta": 500000.0},
    "biases_wide_heads": {"attention_bias": True, "head_dim": 128, "qk_norm": True},
    "rope_llama3": {
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    },
}


def meta_model(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def counted_flops(cfg: ModelConfig, seq_len: int) -> int:
    model = meta_model(cfg)
    with torch.device("meta"):
        idx_BT = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(idx_BT).flatten(0, 1), idx_BT.flatten()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_counts_what_the_meta_model_holds_and_computes(name: str) -> None:
    cfg = get_preset(name)
    assert count_params(cfg) == sum(p.numel() for p in meta_model(cfg).parameters())
    # The counter sees every matmul (forward and both backward products) and SDPA's two
    # T x T products, so 6N + 12*L*T*d_attn holds exactly (PaLM, Appendix B).
    assert counted_flops(cfg, 16) == flops_per_token(cfg, 16) * 16


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_option_keeps_the_counts_exact(option: str) -> None:
    cfg = ModelConfig(preset="tiny", vocab_size=1024, **OPTIONS[option])
    assert count_params(cfg) == sum(p.numel() for p in meta_model(cfg).parameters())
    assert counted_flops(cfg, 32) == flops_per_token(cfg, 32) * 32


def test_published_sizes() -> None:
    # Llama 2 (Touvron et al. 2023): the 7B, 13B and 70B releases have exactly these counts;
    # Llama 3.2 1B likewise.
    assert count_params(get_preset("llama-1b")) == 1_235_814_400
    assert count_params(get_preset("llama-7b")) == 6_738_415_616
    assert count_params(get_preset("llama-13b")) == 13_015_864_320
    assert count_params(get_preset("llama-70b")) == 68_976_648_192
    # GPT-2 small is 124,439,808 with position embeddings and biases kiln does not have.
    assert count_params(get_preset("gpt2-124m")) == 123_551_232
    assert abs(count_params(get_preset("gpt2-124m")) / 124_439_808 - 1) < 0.01
    assert 0.8e6 < count_params(get_preset("tiny")) < 1.2e6


def test_a_preset_is_overridden_key_by_key_and_takes_the_tokenizers_vocabulary() -> None:
    cfg = ModelConfig.model_validate({"preset": "llama-7b", "n_layers": 2, "n_kv_heads": 8})
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.hidden) == (4096, 2, 32, 8, 11008)
    assert cfg.vocab_size is None  # filled from the run's tokenizer (resolved())
    # The dump of a preset config validates back to itself (recipe.yaml round trip).
    assert ModelConfig.model_validate(cfg.model_dump()) == cfg


def test_a_recipe_that_sizes_the_feed_forward_block_replaces_the_presets_width() -> None:
    assert ModelConfig(preset="llama-1b", ffn_multiplier=3.0).hidden == 6144  # 3 * 2048, not the preset's 8192
    assert ModelConfig(preset="llama-7b", ffn_multiplier=3.0).hidden == 12288
    assert ModelConfig(preset="llama-7b", activation="gelu").hidden == 4 * 4096  # a plain MLP's default width
    assert ModelConfig(preset="llama-7b").hidden == 11008


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="llama-8b.*llama-7b"):
        get_preset("llama-8b")
    with pytest.raises(ValidationError, match="llama-8b.*tiny"):
        ModelConfig(preset="llama-8b")
