"""The `model` recipe section and the parameter and FLOP counts derived from it; the sections of
the code that runs a model: its device and precision, and how validation loss is scored.

A recipe names a shape (`model.preset: tiny`, kiln.model.presets) and overrides any field of
it; the vocabulary comes from the run's tokenizer unless `model.vocab_size` is given. These
counts are the single source for the trainer's MFU and the planner; tests/model checks them
against `sum(p.numel())` and torch's FLOP counter for every preset.
`PrecisionConfig` (what kiln.model.precision resolves) and `ScoringConfig` (what
kiln.model.perplexity scores with) live here, not beside that code, because it imports torch: the
recipe imports every section, and `kiln curate`, `kiln tokenize` and `--help` never import torch.
Not handled here: mixture-of-experts layers, biases other than attention_bias's, learned position embeddings,
RoPE scalings other than linear and llama3 (YaRN, dynamic NTK).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.core.config import Section
from kiln.core.errors import ConfigError
from kiln.model.presets import PRESETS

# Activations of the feed-forward block. SwiGLU is gated (three matrices); ReLU squared
# (Primer, So et al. 2021) and GELU are plain two-matrix MLPs.
GATED = {"swiglu": True, "relu2": False, "gelu": False}
# Hidden width / d_model when neither ffn_hidden nor ffn_multiplier is given: 8/3 keeps a gated
# MLP at the 8*d^2 weights of a 4*d plain one (Llama), 4 is the plain MLP's usual width.
DEFAULT_MULTIPLIER = {"swiglu": 8 / 3, "relu2": 4.0, "gelu": 4.0}
FFN_ROUND_TO = 64


class LinearRopeScaling(BaseModel):
    """Every RoPE inverse frequency divided by `factor` (position interpolation, Chen et al. 2023)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["linear"]
    factor: float = Field(gt=0)


class Llama3RopeScaling(BaseModel):
    """Llama 3.1's rule: wavelengths longer than original_max_position_embeddings / low_freq_factor
    divided by `factor`, shorter than original / high_freq_factor kept, a smooth blend between."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["llama3"]
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)

    @model_validator(mode="after")
    def _factors(self) -> Llama3RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"rope_scaling.high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                f"({self.low_freq_factor}): the blend divides by their difference"
            )
        return self


RopeScaling = Annotated[LinearRopeScaling | Llama3RopeScaling, Field(discriminator="type")]


class ModelConfig(Section):
    preset: str | None = Field(
        default=None,
        description=(
            "A named shape from kiln.model.presets (tiny, demo-5m, gpt2-124m, gpt2-350m, llama-1b, llama-7b, "
            "llama-13b, llama-70b); the other keys override it. Its vocabulary is not taken: that comes from the "
            "tokenizer."
        ),
    )
    vocab_size: int | None = Field(
        default=None, ge=1, description="Embedding rows; None means the trained tokenizer's vocabulary size."
    )
    d_model: int = Field(default=256, ge=8, description="Residual stream width.")
    n_layers: int = Field(default=4, ge=1, description="Transformer blocks.")
    n_heads: int = Field(
        default=4, ge=1, description="Query heads; d_model must be a multiple unless head_dim is given."
    )
    head_dim: int | None = Field(
        default=None,
        ge=2,
        description=(
            "Width of each attention head (even, for RoPE); None means d_model // n_heads (the config's "
            "`head_width`). Qwen3 uses heads wider than d_model / n_heads."
        ),
    )
    n_kv_heads: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Key/value heads: None means n_heads (multi-head), 1 is multi-query, anything between grouped-query; must "
            "divide n_heads."
        ),
    )
    activation: Literal["swiglu", "relu2", "gelu"] = Field(
        default="swiglu",
        description=(
            "Feed-forward activation: swiglu (gated, three matrices), relu2 (ReLU squared) or gelu (two matrices each)."
        ),
    )
    ffn_multiplier: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Feed-forward hidden width as a multiple of d_model, rounded up to a multiple of 64; None means 8/3 for "
            "swiglu and 4 otherwise."
        ),
    )
    ffn_hidden: int | None = Field(
        default=None, ge=1, description="Feed-forward hidden width exactly (overrides ffn_multiplier)."
    )
    max_seq_len: int = Field(default=256, ge=2, description="Longest sequence the RoPE tables cover (tokens).")
    rope_theta: float = Field(default=10000.0, gt=0, description="RoPE base frequency.")
    rope_scaling: RopeScaling | None = Field(
        default=None,
        description=(
            "RoPE inverse frequencies rescaled as transformers does: {type: linear, factor} divides them all by "
            "factor; {type: llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings} is "
            "Llama 3.1's rule. None is plain RoPE."
        ),
    )
    norm_eps: float = Field(default=1e-5, gt=0, description="RMSNorm epsilon.")
    tie_embeddings: bool = Field(default=False, description="Share the input embedding with the output projection.")
    attention_bias: bool = Field(
        default=False,
        description="Biases on the query, key and value projections (Qwen2 has them; the output projection has none).",
    )
    qk_norm: bool = Field(
        default=False,
        description=(
            "RMSNorm on each head's queries and keys before RoPE (one gain vector of head_dim each per block); "
            "steadies attention logits at high learning rates."
        ),
    )
    z_loss: float = Field(
        default=0.0,
        ge=0,
        description=(
            "Coefficient of the z-loss, z_loss * mean(logsumexp(logits)^2), which keeps the softmax normaliser near 1 "
            "(PaLM uses 1e-4); 0 turns it off."
        ),
    )
    logit_softcap: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Output logits pass through cap * tanh(logits / cap) (Gemma 2 uses 30); None leaves them as they are."
        ),
    )
    init_std: float = Field(default=0.02, gt=0, description="Std of the normal init of every matrix.")
    init_depth_scale: Literal["total", "layer"] = Field(
        default="total",
        description=(
            "Residual-branch output projections scaled by 1/sqrt(2 * n_layers) (total, GPT-2) or by 1/sqrt(2 * (layer "
            "+ 1)) for each block (layer, depth-scaled)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        name = data["preset"]
        if name not in PRESETS:
            raise ValueError(f"preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
        shape = {k: v for k, v in PRESETS[name].items() if k != "vocab_size"}
        if "ffn_multiplier" in data or "activation" in data:
            shape.pop("ffn_hidden", None)  # the recipe sizes the feed-forward block itself
        return {**shape, **data}  # the recipe's own keys win

    @model_validator(mode="after")
    def _heads(self) -> ModelConfig:
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads}), or give model.head_dim"
                )
        if self.head_width % 2:
            given = f"head_dim ({self.head_dim})" if self.head_dim else f"head_dim d_model/n_heads = {self.head_width}"
            raise ValueError(f"{given} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.kv_heads})")
        if self.ffn_hidden is not None and self.ffn_multiplier is not None:
            raise ValueError(f"give ffn_hidden ({self.ffn_hidden}) or ffn_multiplier ({self.ffn_multiplier}), not both")
        return self

    @property
    def head_width(self) -> int:
        """Width of each head: head_dim, or d_model // n_heads where it is not given (None stays out of the hashed
        settings, so configs from before head_dim existed keep their stage fingerprints)."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def gated(self) -> bool:
        return GATED[self.activation]

    @property
    def hidden(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        multiplier = self.ffn_multiplier or DEFAULT_MULTIPLIER[self.activation]
        # 8/3 * d computed as 8 * d // 3 so the default is exact integer arithmetic (Llama's rule).
        width = 8 * self.d_model // 3 if multiplier == DEFAULT_MULTIPLIER["swiglu"] else int(multiplier * self.d_model)
        return -(-width // FFN_ROUND_TO) * FFN_ROUND_TO

    def resolved(self, vocab_size: int) -> ModelConfig:
        """This config with vocab_size filled in from the tokenizer."""
        return self if self.vocab_size is not None else self.model_copy(update={"vocab_size": vocab_size})


def count_params(cfg: ModelConfig, include_embeddings: bool = True) -> int:
    """Exact parameter count of kiln.model.transformer.Transformer for this config."""
    assert cfg.vocab_size is not None, "resolve vocab_size first"
    d, hd = cfg.d_model, cfg.head_width
    attn = d * (cfg.n_heads * hd) + 2 * d * (cfg.kv_heads * hd) + (cfg.n_heads * hd) * d
    mlp = (3 if cfg.gated else 2) * d * cfg.hidden
    norms = 2 * d + (2 * hd if cfg.qk_norm else 0)  # two RMSNorm gains, and the q/k norms
    body = cfg.n_layers * (attn + attention_biases(cfg) + mlp + norms) + d  # final norm
    if not include_embeddings:
        return body
    emb = cfg.vocab_size * d
    return body + emb + (0 if cfg.tie_embeddings else emb)


def attention_biases(cfg: ModelConfig) -> int:
    """Bias entries of one block's query, key and value projections (0 without attention_bias)."""
    return (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_width if cfg.attention_bias else 0


def build_bytes(cfg: ModelConfig) -> int:
    """Peak bytes of memory building Transformer(cfg) takes: its fp32 parameters, and the RoPE tables
    (max_seq_len x head_dim/2 angles, cos and sin, all float32: 12 bytes each at the peak). What
    stages check against the machine's memory before building a model."""
    return 4 * count_params(cfg) + 12 * cfg.max_seq_len * (cfg.head_width // 2)


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that take part in a matrix product per token: every block matrix and the output projection (biases
    are additions, like the norms' products not counted)."""
    assert cfg.vocab_size is not None, "resolve vocab_size first"
    per_block = 2 * cfg.d_model + (2 * cfg.head_width if cfg.qk_norm else 0) + attention_biases(cfg)
    norms = cfg.n_layers * per_block + cfg.d_model
    return (
        count_params(cfg, include_embeddings=False) - norms + cfg.vocab_size * cfg.d_model
    )  # output projection, tied or not


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward = 3x forward), with attention.

    6 * N (N = non-embedding matmul params plus the output projection) plus the attention
    score and value products, 6 * n_layers * seq_len * d_attn counted for the full (unmasked)
    square as in PaLM (Appendix B). The input embedding is a lookup and costs nothing; norms,
    activations and softmax are elementwise and not counted.
    """
    attn = 6 * cfg.n_layers * seq_len * cfg.n_heads * cfg.head_width * 2
    return 6 * matmul_params(cfg) + attn


class PrecisionConfig(Section):
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="Where the model runs; auto picks cuda when one is visible."
    )
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto",
        description=(
            "Matmul precision: bf16 or fp16 autocast (fp16 training adds dynamic loss scaling), or plain fp32; auto "
            "means bf16 on cuda, fp32 on cpu."
        ),
    )


class TrainPrecisionConfig(PrecisionConfig):
    """The trainer's precision: eval's and generate's, and fp8."""

    dtype: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = Field(  # type: ignore[assignment]
        default="auto",
        description=(
            "Matmul precision: bf16 or fp16 autocast (fp16 training adds dynamic loss scaling), fp8 (the blocks' "
            "linear layers in float8 through torchao, the rest bf16 autocast; CUDA GPUs of compute capability 8.9 "
            "or newer), or plain fp32; auto means bf16 on cuda, fp32 on cpu."
        ),
    )
    fp8_scaling: Literal["tensorwise", "rowwise"] | None = Field(
        default=None,
        description=(
            "With dtype fp8: one scale per tensor (the faster) or one per row of each operand (closer to bf16, "
            "for outliers); None means tensorwise."
        ),
    )

    @model_validator(mode="after")
    def _fp8_on_a_gpu(self) -> TrainPrecisionConfig:
        if self.dtype == "fp8" and self.device == "cpu":
            raise ValueError(
                "dtype fp8 needs a CUDA GPU with FP8 matmuls (compute capability 8.9 or newer) and device is cpu; "
                "use dtype bf16 or fp32 on the CPU"
            )
        if self.fp8_scaling is not None and self.dtype != "fp8":
            raise ValueError(f"fp8_scaling applies with dtype fp8 only, and dtype is {self.dtype}; remove it")
        return self


class ScoringConfig(Section):
    NOT_HASHED = frozenset({"batch_size"})
    seq_len: int | None = Field(
        default=None,
        ge=2,
        description=(
            "Window length for validation loss (tokens); None means the seq_len the model was (or is being) trained "
            "with."
        ),
    )
    max_tokens_per_source: int = Field(
        default=65536, ge=1, description="Validation tokens scored per source (from the start of its split)."
    )
    batch_size: int = Field(default=8, ge=1, description="Windows per forward pass.")


def get_preset(name: str) -> ModelConfig:
    """The named shape with its published vocabulary (what the planner counts), or a ConfigError listing the known
    names."""
    if name not in PRESETS:
        raise ConfigError(f"model preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return ModelConfig(preset=name, vocab_size=PRESETS[name]["vocab_size"])
