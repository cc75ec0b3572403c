"""The `model` recipe section and the parameter and FLOP counts derived from it.

These counts are the single source for the trainer's MFU and the planner; presets added later
must go through the same functions.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from kiln.core.config import Section


class ModelConfig(Section):
    vocab_size: int | None = Field(default=None, ge=1, description="Embedding rows; None means the trained tokenizer's vocabulary size.")
    d_model: int = Field(default=256, ge=8, description="Residual stream width.")
    n_layers: int = Field(default=4, ge=1, description="Transformer blocks.")
    n_heads: int = Field(default=4, ge=1, description="Query heads; d_model must be a multiple.")
    n_kv_heads: int | None = Field(default=None, ge=1, description="Key/value heads for grouped-query attention; None means n_heads (plain multi-head).")
    ffn_hidden: int | None = Field(default=None, ge=1, description="SwiGLU hidden width; None means 8/3 * d_model rounded up to a multiple of 64 (Llama).")
    max_seq_len: int = Field(default=256, ge=2, description="Longest sequence the RoPE tables cover (tokens).")
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base frequency.")
    norm_eps: float = Field(default=1e-5, gt=0, description="RMSNorm epsilon.")
    tie_embeddings: bool = Field(default=False, description="Share the input embedding with the output projection.")
    init_std: float = Field(default=0.02, gt=0, description="Std of the normal init; output projections of each block are scaled by 1/sqrt(2 * n_layers).")

    @model_validator(mode="after")
    def _heads(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim d_model/n_heads = {self.head_dim} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return -(-(8 * self.d_model // 3) // 64) * 64

    def resolved(self, vocab_size: int) -> ModelConfig:
        """This config with vocab_size filled in from the tokenizer."""
        return self if self.vocab_size is not None else self.model_copy(update={"vocab_size": vocab_size})


def count_params(cfg: ModelConfig, include_embeddings: bool = True) -> int:
    """Exact parameter count of kiln.model.transformer.Transformer for this config."""
    assert cfg.vocab_size is not None, "resolve vocab_size first"
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * (cfg.n_heads * hd) + 2 * d * (cfg.kv_heads * hd) + (cfg.n_heads * hd) * d
    mlp = 3 * d * cfg.hidden
    block = attn + mlp + 2 * d  # two RMSNorm gains
    body = cfg.n_layers * block + d  # final norm
    if not include_embeddings:
        return body
    emb = cfg.vocab_size * d
    return body + emb + (0 if cfg.tie_embeddings else emb)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward = 3x forward), with attention.

    6 * N (N = non-embedding matmul params plus the output projection) plus the attention
    score and value products, 6 * n_layers * seq_len * d_attn counted for the full (unmasked)
    square as in PaLM (Appendix B). The input embedding is a lookup and costs nothing.
    """
    assert cfg.vocab_size is not None, "resolve vocab_size first"
    matmul_params = count_params(cfg, include_embeddings=False) - (2 * cfg.n_layers + 1) * cfg.d_model
    matmul_params += cfg.vocab_size * cfg.d_model  # output projection, tied or not
    attn = 6 * cfg.n_layers * seq_len * cfg.n_heads * cfg.head_dim * 2
    return 6 * matmul_params + attn
