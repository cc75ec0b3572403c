"""kiln.model.presets: the planner's counts equal the model code's, built on the meta device.

Meta tensors have shapes but no storage, so a 7B (or 70B) model costs nothing to build; the
parameter count is sum(p.numel()) and the FLOPs are what torch's FlopCounterMode records for
one forward and backward pass.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from kiln.core.errors import ConfigError
from kiln.model.config import count_params, flops_per_token
from kiln.model.presets import PRESETS, get_preset
from kiln.model.transformer import Transformer


def meta_model(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(PRESETS[name])


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_count_params_equals_the_meta_models_parameters(name: str) -> None:
    assert count_params(PRESETS[name]) == sum(p.numel() for p in meta_model(name).parameters())


def test_published_sizes() -> None:
    # Llama 2 (Touvron et al. 2023): the 7B, 13B and 70B releases have exactly these counts.
    assert count_params(PRESETS["llama-7b"]) == 6_738_415_616
    assert count_params(PRESETS["llama-13b"]) == 13_015_864_320
    assert count_params(PRESETS["llama-70b"]) == 68_976_648_192
    # GPT-2 small is 124,439,808 with position embeddings and biases kiln does not have.
    assert count_params(PRESETS["gpt2-124m"]) == 123_551_232
    assert abs(count_params(PRESETS["gpt2-124m"]) / 124_439_808 - 1) < 0.01


@pytest.mark.parametrize(("name", "seq_len"), [("demo-5m", 256), ("gpt2-124m", 128), ("llama-7b", 64)])
def test_flops_per_token_equals_the_models_counted_matmul_flops(name: str, seq_len: int) -> None:
    model = meta_model(name)
    with torch.device("meta"):
        idx_BT = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(idx_BT).flatten(0, 1), idx_BT.flatten()).backward()
    # The counter sees every matmul (forward and both backward products) and SDPA's two
    # T x T products, so 6N + 12*L*T*d_attn holds exactly (PaLM, Appendix B).
    assert counter.get_total_flops() == flops_per_token(PRESETS[name], seq_len) * seq_len


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="llama-8b.*llama-7b"):
        get_preset("llama-8b")
