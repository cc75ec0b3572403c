"""kiln's decoder in Hugging Face terms: the transformers architecture, its config.json, and the
parameter names, both ways.

kiln's block is Llama's (pre-norm RMSNorm, rotate-half RoPE, SwiGLU, grouped-query attention,
no biases), so a kiln model is a `LlamaForCausalLM`; with `qk_norm` it is a `Qwen3ForCausalLM`
(the same block plus an RMSNorm over each head's queries and keys, one gain of head_dim per
projection, before RoPE, exactly kiln's); with `attention_bias` (biases on q, k and v, none on
o) it is a `Qwen2ForCausalLM`. All three take `head_dim` (heads of a width other than
d_model / n_heads, as Qwen3's) and `rope_scaling` (linear, or Llama 3.1's llama3 rule). Options
none of them has are refused by name: ReLU² and GELU feed-forwards (all are gated SiLU), logit
soft-capping, and qk_norm with attention_bias together (Qwen3's attention_bias puts one on o
too). The z-loss and the init settings only shape training and leave the exported math
unchanged. Imports refuse by name what kiln cannot compute: other RoPE types (YaRN, dynamic,
partial rotary), a sliding window in use, biases on o or on the feed-forward.

config.json carries the RoPE settings twice: `rope_parameters` (transformers 5) and `rope_theta`
with `rope_scaling` (transformers 4). An import reads them as transformers 5 builds the model:
`rope_scaling`, when set, over `rope_parameters` (a YaRN `rope_scaling` beside a default
`rope_parameters` is YaRN, and refused), the base from the chosen one, else `rope_theta`. Sizes
left out take transformers' defaults: head_dim hidden_size / num_attention_heads (Qwen3: 128).
The token ids of end of document (also the beginning-of-sequence id: a kiln document starts after
one) and padding come from the kiln tokenizer. Whether a tied output projection stays tied is
decided by the weights (kiln.evaluate.import_hf), not here.
Not handled here: files (kiln.evaluate.export), tokenizer files, other architectures.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from pydantic import ValidationError

from kiln.core.errors import FatalError
from kiln.model.config import ModelConfig

LLAMA, QWEN2, QWEN3 = "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
MISTRAL = "MistralForCausalLM"  # Llama's math and names; imported, and exported back under its own name
MODEL_TYPES = {LLAMA: "llama", QWEN2: "qwen2", QWEN3: "qwen3"}
IMPORTED = (*MODEL_TYPES, MISTRAL)
# The settings of each RoPE scaling kiln computes, besides its factor (kiln.model.config).
ROPE_KEYS = {"linear": (), "llama3": ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
QWEN3_HEAD_DIM = 128  # Qwen3Config's head_dim when config.json leaves it out (the others: hidden / heads)

# kiln name -> Hugging Face name, inside block i (`blocks.{i}.` <-> `model.layers.{i}.`).
BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "attn.wq.bias": "self_attn.q_proj.bias",
    "attn.wk.bias": "self_attn.k_proj.bias",
    "attn.wv.bias": "self_attn.v_proj.bias",
    "attn.q_norm.weight": "self_attn.q_norm.weight",
    "attn.k_norm.weight": "self_attn.k_norm.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
# The sizes in config.json kiln reads, each a positive integer; the optional ones may be absent or null.
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", *OPTIONAL_SIZES)


def architecture(cfg: ModelConfig) -> str:
    """The transformers class that computes what `cfg` does; FatalError naming what none has."""
    missing = []
    if cfg.activation != "swiglu":
        missing.append(
            f"model.activation={cfg.activation} (Llama and Qwen have only the gated SiLU feed-forward, swiglu)"
        )
    if cfg.logit_softcap is not None:
        missing.append(f"model.logit_softcap={cfg.logit_softcap} (no Llama-family architecture soft-caps its logits)")
    if cfg.qk_norm and cfg.attention_bias:
        missing.append(
            "model.qk_norm with model.attention_bias (Qwen3's attention_bias puts a bias on the output projection too, "
            "Qwen2 has no qk_norm)"
        )
    if missing:
        raise FatalError("this model cannot be exported to Hugging Face format: " + "; ".join(missing))
    return QWEN3 if cfg.qk_norm else QWEN2 if cfg.attention_bias else LLAMA


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """transformers' rope_parameters for cfg: the base and, where cfg scales RoPE, the scaling's settings."""
    if cfg.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    scaling = cfg.rope_scaling.model_dump()
    return {"rope_type": scaling.pop("type"), "rope_theta": cfg.rope_theta, **scaling}


def hf_config(cfg: ModelConfig, eot_id: int, pad_id: int) -> dict[str, Any]:
    """config.json for `cfg` (vocab_size resolved)."""
    arch = architecture(cfg)
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": MODEL_TYPES[arch],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_width,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope_parameters(cfg),
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    if cfg.rope_scaling is not None:  # transformers 4 reads the scaling here, the base from rope_theta
        config["rope_scaling"] = {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
    if arch == LLAMA:
        config["mlp_bias"] = False
    else:
        config |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers}
    return config


def model_config_from_hf(config: Any, where: str) -> ModelConfig:
    """The kiln ModelConfig of a Llama, Qwen2 or Qwen3 config.json; FatalError naming each setting kiln
    cannot reproduce (config: the parsed JSON, of any kind; where: the file, for the message)."""
    if not isinstance(config, dict):
        raise FatalError(
            f"{where}: a JSON {type(config).__name__}, not an object; a Hugging Face config.json is one object of "
            "settings"
        )
    for key in SIZES:
        value = config.get(key)
        if value is None and key in OPTIONAL_SIZES:
            continue
        # bool is an int to Python, and a float (1e9) is not a size transformers writes.
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FatalError(
                f"{where}: {key} is {'missing' if key not in config else json.dumps(value)}; it must be a "
                "positive integer"
            )
    try:
        return _model_config_from_hf(config, where)
    except ValidationError as e:  # a combination ModelConfig refuses: its rules, one line
        rules = "; ".join(
            ".".join(map(str, err["loc"])) + ": " * bool(err["loc"]) + str(err["msg"]).removeprefix("Value error, ")
            for err in e.errors()
        )
        raise FatalError(f"{where}: not a model kiln can build: {rules}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # a value of the wrong kind
        raise FatalError(f"{where}: not a config kiln can read ({type(e).__name__}: {e})") from None


def rope_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The RoPE settings transformers 5 builds the model from (RotaryEmbeddingConfigMixin): `rope_scaling`
    when set, else `rope_parameters`, with the base and the partial rotary factor from the top level where
    the chosen one has none, and llama3's original length from max_position_embeddings likewise."""
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("partial_rotary_factor") is not None:  # a null one is left out, as transformers does
        rope.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] == "llama3":
        rope.setdefault("original_max_position_embeddings", config.get("max_position_embeddings", 2048))
    return rope


def _model_config_from_hf(config: dict[str, Any], where: str) -> ModelConfig:
    arch = (config.get("architectures") or [None])[0]
    if arch not in IMPORTED:
        raise FatalError(f"{where}: architecture {arch!r}; kiln imports {', '.join(IMPORTED)}")
    rope = rope_settings(config)
    differ = []
    rope_type = rope["rope_type"]
    if rope_type not in ("default", None, *ROPE_KEYS):
        given = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
        differ.append(f"RoPE scaling {rope_type!r} in {given} (kiln scales RoPE by {' or '.join(ROPE_KEYS)} only)")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        differ.append("partial_rotary_factor below 1 (kiln rotates every dimension of a head)")
    if config.get("hidden_act", "silu") != "silu":
        differ.append(f"hidden_act {config['hidden_act']!r} (kiln's gated feed-forward is SiLU)")
    if config.get("attention_bias") and arch != QWEN2:  # Qwen2's q/k/v biases are built in, whatever the key says
        differ.append(f"attention_bias true in {arch} (a bias on the output projection too; kiln's o has none)")
    if config.get("mlp_bias"):
        differ.append("mlp_bias true (kiln's feed-forward has no bias)")
    if config.get("use_sliding_window"):
        differ.append("use_sliding_window true (kiln attends over the whole window)")
    if arch == MISTRAL and config.get("sliding_window") is not None:
        differ.append(f"sliding_window {config['sliding_window']} (kiln attends over the whole window)")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    if arch == LLAMA and hidden % heads:  # whatever head_dim says
        differ.append(
            f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (transformers' LlamaConfig "
            "refuses it too)"
        )
    if heads % kv_heads:
        differ.append(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads} (each key/value head "
            "serves a whole group of query heads)"
        )
    if differ:
        raise FatalError(f"{where}: kiln cannot reproduce this model: " + "; ".join(differ))
    head_dim = config.get("head_dim") or (QWEN3_HEAD_DIM if arch == QWEN3 else hidden // heads)
    scaling = None
    if rope_type in ROPE_KEYS:
        scaling = {"type": rope_type, "factor": rope["factor"], **{k: rope[k] for k in ROPE_KEYS[rope_type]}}
    return ModelConfig(
        vocab_size=config["vocab_size"],
        d_model=hidden,
        n_layers=config["num_hidden_layers"],
        n_heads=heads,
        # The default width stays implicit, as in a kiln-born config: head_dim only where heads do not split d_model.
        head_dim=None if head_dim * heads == hidden else head_dim,
        n_kv_heads=kv_heads,
        ffn_hidden=config["intermediate_size"],
        max_seq_len=config.get("max_position_embeddings", 2048),
        rope_theta=float(rope["rope_theta"]),
        rope_scaling=scaling,
        norm_eps=config.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=arch == QWEN3,
        attention_bias=arch == QWEN2,
        init_std=config.get("initializer_range", 0.02),
    )


def hf_name(name: str) -> str:
    """A kiln parameter name in Hugging Face's naming."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, layer, rest = name.split(".", 2)  # blocks.{i}.<rest>
    return f"model.layers.{layer}.{BLOCK_NAMES[rest]}"


def to_hf_state(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """kiln's state dict in Hugging Face names; a tied output projection is stored once (as the embedding)."""
    return {hf_name(k): v for k, v in state.items() if not (cfg.tie_embeddings and k == "lm_head.weight")}


def from_hf_state(
    state: dict[str, torch.Tensor], cfg: ModelConfig, kiln_names: list[str], where: str
) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict in kiln's names (kiln_names: the model's parameter names, a tied
    weight once); FatalError naming missing or unexpected tensors."""
    wanted = {hf_name(k): k for k in kiln_names}
    missing = sorted(set(wanted) - set(state))
    # Buffers some exporters save (rotary inv_freq) are rebuilt from the config, not read.
    extra = sorted(
        k
        for k in set(state) - set(wanted)
        if not k.endswith("rotary_emb.inv_freq") and not (cfg.tie_embeddings and k == "lm_head.weight")
    )
    if missing or extra:
        raise FatalError(f"{where}: weights do not match the config: missing {missing[:5]}, unexpected {extra[:5]}")
    return {kiln: state[hf] for hf, kiln in wanted.items()}
