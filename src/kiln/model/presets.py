"""Named model shapes: plain data for the planner and for recipes (`--preset llama-7b`).

Each preset is a ModelConfig in kiln's own architecture (RMSNorm, RoPE, SwiGLU, optional
grouped-query attention, no biases), so its parameter and FLOP counts come from
kiln.model.config like any recipe's model. Where the original model differs (GPT-2 has learned
position embeddings, biases and a 4*d GELU MLP), the preset keeps the published width, depth,
heads and vocabulary and the kiln count lands within about 1% of the published total:
  gpt2-124m   123,551,232 params here vs 124,439,808 for GPT-2 small (Radford et al. 2019);
              SwiGLU hidden 2048 = 8/3 * 768 gives the same 8*d^2 MLP weights as 4*d GELU.
  llama-7b    6,738,415,616 params, the Llama 2 7B count (Touvron et al. 2023, d=4096, 32 layers,
              32 heads, SwiGLU 11008, vocabulary 32000, untied).
Not handled here: training recipes for these shapes (hardware, batch, schedule) and shapes
outside kiln's architecture (mixture of experts, encoder-decoder).
"""

from __future__ import annotations

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    # The demo recipe's model (recipes/demo.yaml) with the demo tokenizer's 8192-token vocabulary.
    "demo-5m": ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256, tie_embeddings=True),
    # GPT-2 small and medium shapes (Radford et al. 2019), tied embeddings, 1024-token context.
    "gpt2-124m": ModelConfig(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_seq_len=1024, tie_embeddings=True),
    "gpt2-350m": ModelConfig(vocab_size=50257, d_model=1024, n_layers=24, n_heads=16, max_seq_len=1024, tie_embeddings=True),
    # Llama 2 shapes (Touvron et al. 2023, Table 1 and the released configs); 70B uses 8 KV heads.
    "llama-7b": ModelConfig(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, ffn_hidden=11008, max_seq_len=4096, rope_theta=10000.0, norm_eps=1e-5),
    "llama-13b": ModelConfig(vocab_size=32000, d_model=5120, n_layers=40, n_heads=40, ffn_hidden=13824, max_seq_len=4096, norm_eps=1e-5),
    "llama-70b": ModelConfig(vocab_size=32000, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, max_seq_len=4096, norm_eps=1e-5),
}


def get_preset(name: str) -> ModelConfig:
    """The named shape, or a ConfigError listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"model preset {name!r} is unknown; choose one of {', '.join(PRESETS)}") from None
