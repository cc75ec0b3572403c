"""Named model shapes: plain data for recipes (`model.preset: tiny`) and the planner (`--preset`).

Each preset is a set of kiln.model.config.ModelConfig fields in kiln's own architecture
(RMSNorm, RoPE, SwiGLU, optional grouped-query attention, no biases), so its parameter and FLOP
counts come from kiln.model.config like any recipe's model. The vocabulary listed is the
published one, used when the planner counts a preset; a recipe's model takes its tokenizer's.
Where the original model differs (GPT-2 has learned position embeddings, biases and a 4*d
GELU MLP), the preset keeps the published width, depth, heads and vocabulary and the kiln count
lands within about 1% of the published total:
  tiny          918,656 params: the test suite's model, a few seconds per dozen steps on 2 CPU cores.
  gpt2-124m   123,551,232 params here vs 124,439,808 for GPT-2 small (Radford et al. 2019);
              SwiGLU hidden 2048 = 8/3 * 768 gives the same 8*d^2 MLP weights as 4*d GELU.
  llama-1b    1,235,814,400 params, the Llama 3.2 1B count (d=2048, 16 layers, 8 KV heads, tied).
  llama-7b    6,738,415,616 params, the Llama 2 7B count (Touvron et al. 2023, d=4096, 32 layers,
              32 heads, SwiGLU 11008, vocabulary 32000, untied); 13b and 70b likewise.
Not handled here: training recipes for these shapes (hardware, batch, schedule; see recipes/)
and shapes outside kiln's architecture (mixture of experts, encoder-decoder).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # About 1M parameters with a 1,024-token vocabulary: for tests and recipes that must run in minutes on a CPU.
    "tiny": {
        "vocab_size": 1024,
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "max_seq_len": 256,
        "tie_embeddings": True,
    },
    # The demo recipe's model (recipes/demo.yaml) with the demo tokenizer's 8192-token vocabulary.
    "demo-5m": {
        "vocab_size": 8192,
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "max_seq_len": 256,
        "tie_embeddings": True,
    },
    # GPT-2 small and medium shapes (Radford et al. 2019), tied embeddings, 1024-token context.
    "gpt2-124m": {
        "vocab_size": 50257,
        "d_model": 768,
        "n_layers": 12,
        "n_heads": 12,
        "max_seq_len": 1024,
        "tie_embeddings": True,
    },
    "gpt2-350m": {
        "vocab_size": 50257,
        "d_model": 1024,
        "n_layers": 24,
        "n_heads": 16,
        "max_seq_len": 1024,
        "tie_embeddings": True,
    },
    # Llama 3.2 1B (the released config): grouped-query attention with 8 KV heads, RoPE base 500,000, tied.
    "llama-1b": {
        "vocab_size": 128256,
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_hidden": 8192,
        "max_seq_len": 8192,
        "rope_theta": 500000.0,
        "tie_embeddings": True,
    },
    # Llama 2 shapes (Touvron et al. 2023, Table 1 and the released configs); 70B uses 8 KV heads.
    "llama-7b": {
        "vocab_size": 32000,
        "d_model": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "ffn_hidden": 11008,
        "max_seq_len": 4096,
    },
    "llama-13b": {
        "vocab_size": 32000,
        "d_model": 5120,
        "n_layers": 40,
        "n_heads": 40,
        "ffn_hidden": 13824,
        "max_seq_len": 4096,
    },
    "llama-70b": {
        "vocab_size": 32000,
        "d_model": 8192,
        "n_layers": 80,
        "n_heads": 64,
        "n_kv_heads": 8,
        "ffn_hidden": 28672,
        "max_seq_len": 4096,
    },
}
