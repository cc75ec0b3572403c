"""A Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention.

Options from the config: ReLU-squared or GELU feed-forward instead of SwiGLU, RMSNorm on
queries and keys (qk_norm), tanh soft-capping of the output logits, depth-scaled
initialisation, heads of a width of their own (head_dim), biases on the query, key and value
projections (attention_bias, zero at init), RoPE frequencies rescaled (rope_scaling: linear,
llama3). Positions default to 0..T-1; a caller packing several documents in a row passes
`positions_BT` restarting at each document (kiln.model.batch), so each sees the rotations it
would see alone.

Only model math lives here: parallelism, activation checkpointing and torch.compile are applied
from outside (kiln.train), by wrapping or rebuilding modules, the loss lives with the trainer
(kiln.train.loss). A forward pass is three named parts, which a pipeline stage
(kiln.train.pipeline_parallel) composes from some of the model's modules as `Transformer.forward`
does from all of them: `layer_inputs` (the RoPE angles and SDPA arguments every block of a pass
shares), the blocks, `output` (final norm and output layer, or the trainer's loss head).
Attention goes through PyTorch's scaled_dot_product_attention (`ScaledDotProduct`, a module of
its own without parameters, which context parallelism wraps), which picks a flash or
memory-efficient kernel where the device has one, or through flex attention with a block mask
where the rule's kernel says so; which positions see which is the caller's AttentionRule
(kiln.model.attention; causal by default). The constructor allocates (with
PyTorch's per-layer defaults); `init_weights()` draws kiln's initial weights and fills the RoPE
tables, so a model can be built on the meta device, materialised with `to_empty(device=...)` and
initialised there (kiln.model.init).

Shape legend:
    B batch, T sequence length, D d_model, H query heads, K key/value heads,
    E head dim (head_dim, by default D / H), F feed-forward hidden, V vocabulary.
Decoding passes a KVCache (kiln.model.kv_cache): each block's attention stores its new keys
and values there and attends over all of them; the caller gives the new positions.
Not handled here: the z-loss (a loss term: kiln.train.loss reads model.z_loss), sampling.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.attention import CAUSAL, AttentionRule
from kiln.model.config import LinearRopeScaling, ModelConfig, RopeScaling
from kiln.model.kv_cache import KVCache, LayerCache

# What Transformer.forward's `head` is called with: final normed hidden states (B, T, D), output matrix (V, D), logit
# soft-cap.
Head = Callable[[torch.Tensor, torch.Tensor, float | None], Any]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # subtle: normalize in fp32 so bf16 activations do not lose the mean square's precision.
        # F.rms_norm is one fused kernel each way (the five-op version cost 2.4x as much CPU time, same values).
        return F.rms_norm(x_BTD.float(), (x_BTD.shape[-1],), eps=self.eps).type_as(x_BTD) * self.weight


def scaled_inv_freq(inv_freq_E2: torch.Tensor, scaling: RopeScaling | None) -> torch.Tensor:
    """RoPE's inverse frequencies under `scaling`, by transformers' rules (modeling_rope_utils: linear and
    llama3), so imported Llama 3.1 weights and scaled exports compute the same angles."""
    if scaling is None:
        return inv_freq_E2
    if isinstance(scaling, LinearRopeScaling):
        return inv_freq_E2 / scaling.factor
    # llama3: wavelengths below original / high_freq_factor are kept, above original / low_freq_factor
    # divided by factor, and in between blended linearly in original / wavelength.
    original, low, high = scaling.original_max_position_embeddings, scaling.low_freq_factor, scaling.high_freq_factor
    wavelen_E2 = 2 * math.pi / inv_freq_E2
    long_E2 = torch.where(wavelen_E2 > original / low, inv_freq_E2 / scaling.factor, inv_freq_E2)
    smooth_E2 = (original / wavelen_E2 - low) / (high - low)
    blended_E2 = (1 - smooth_E2) * long_E2 / scaling.factor + smooth_E2 * long_E2
    medium_E2 = (wavelen_E2 >= original / high) & (wavelen_E2 <= original / low)
    return torch.where(medium_E2, blended_E2, long_E2)


def rope_tables(
    seq_len: int, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (T, E/2): position t rotates pair i by t * theta^(-2i/E), that frequency rescaled by
    `scaling` (model.rope_scaling). Computed in fp32 step by step as transformers computes them: an
    imported model gets the angles it was trained with, and its logits are transformers' bit for bit
    (tables computed in fp64 and rounded differ from them by about 1e-5 in the logits)."""
    inv_freq_E2 = scaled_inv_freq(1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim), scaling)
    angles_TE2 = torch.outer(torch.arange(seq_len).float(), inv_freq_E2)
    return angles_TE2.cos(), angles_TE2.sin()


class Rotary(nn.Module):
    """RoPE's cos and sin tables, (max_seq_len, E/2) each: buffers, not saved (rebuilt from the config
    on load and by `fill`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_width, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @torch.no_grad()
    def fill(self, cfg: ModelConfig) -> None:
        """The tables of cfg's RoPE base, in place (after to_empty() they hold garbage)."""
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_width, cfg.rope_theta, cfg.rope_scaling)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def angles(self, start: int, T: int, positions_BT: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions start..start+T-1, (T, E/2) shared by every row and head, or of
        each row's positions_BT, (B, 1, T, E/2)."""
        assert start + T <= len(self.cos), f"sequence of {start + T} tokens exceeds max_seq_len {len(self.cos)}"
        if positions_BT is None:
            return self.cos[start : start + T], self.sin[start : start + T]
        return self.cos[positions_BT][:, None], self.sin[positions_BT][:, None]


def apply_rope(x_BHTE: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate by the angles in cos/sin: (T, E/2) shared by every row, or (B, 1, T, E/2) per row."""
    # Rotate (first half, second half) pairs, the "rotate_half" layout Hugging Face Llama uses,
    # so exported weights need no permutation.
    x1, x2 = x_BHTE.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.type_as(x_BHTE)


@functools.cache
def flex_attention() -> Callable[..., torch.Tensor]:
    """PyTorch's flex attention, imported on first use (its module takes 0.35 s to import). A
    compiled block (kiln.train.distributed.apply_compile) turns it into one fused kernel; called
    eagerly it computes every score (the CPU's forward-only path)."""
    from torch.nn.attention.flex_attention import flex_attention as flex

    return flex


class ScaledDotProduct(nn.Module):
    """Attention proper: SDPA over queries (B, H, T, E) and keys and values (B, K, S, E), each
    key/value head serving H/K query heads. Training copies them per head (SDPA's enable_gqa sums
    the K/V gradients in another order); decoding passes enable_gqa instead, and so does flex
    attention, which a rule of kernel "flex" asks for with its block mask. No parameters: a
    parallelism may wrap it (kiln.train.context_parallel gathers every rank's keys and values first)."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups  # H / K: query heads per key/value head (the same under tensor parallelism)

    def forward(
        self, q_BHTE: torch.Tensor, k_BKSE: torch.Tensor, v_BKSE: torch.Tensor, sdpa_kwargs: dict[str, Any]
    ) -> torch.Tensor:
        if "block_mask" in sdpa_kwargs:  # kernel "flex" (kiln.model.attention): each head group reads its K/V head
            # subtle: QK-norm's fp32 gains make q and k fp32 under autocast; flex takes one dtype (SDPA casts them).
            q_BHTE, k_BKSE = q_BHTE.to(v_BKSE.dtype), k_BKSE.to(v_BKSE.dtype)
            return flex_attention()(q_BHTE, k_BKSE, v_BKSE, **sdpa_kwargs, enable_gqa=self.groups > 1)
        if self.groups > 1 and not sdpa_kwargs.get("enable_gqa"):
            k_BKSE = k_BKSE.repeat_interleave(self.groups, dim=1)
            v_BKSE = v_BKSE.repeat_interleave(self.groups, dim=1)
        # sdpa_kwargs: is_causal=True (the fast path), nothing (full), or a mask (B, 1, T, S), shared by the heads.
        return F.scaled_dot_product_attention(q_BHTE, k_BKSE, v_BKSE, **sdpa_kwargs)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_width
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_width, bias=cfg.attention_bias)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_width, bias=cfg.attention_bias)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_width, bias=cfg.attention_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_width, cfg.d_model, bias=False)
        # One gain vector per projection, shared by its heads (as OLMo 2 and Qwen 3 normalise per head).
        self.q_norm = RMSNorm(cfg.head_width, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_width, cfg.norm_eps) if cfg.qk_norm else None
        self.sdpa = ScaledDotProduct(cfg.n_heads // cfg.kv_heads)

    def forward(
        self,
        x_BTD: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        sdpa_kwargs: dict[str, Any],
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        # Heads counted from the projections' widths: under tensor parallelism a rank holds H/tp and K/tp of them.
        q_BHTE = self.wq(x_BTD).view(B, T, -1, self.head_dim).transpose(1, 2)
        k_BKTE = self.wk(x_BTD).view(B, T, -1, self.head_dim).transpose(1, 2)
        v_BKTE = self.wv(x_BTD).view(B, T, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q_BHTE, k_BKTE = self.q_norm(q_BHTE), self.k_norm(k_BKTE)  # over E: bounds the q.k logits
        q_BHTE, k_BKTE = apply_rope(q_BHTE, cos, sin), apply_rope(k_BKTE, cos, sin)
        if cache is not None:  # decoding: attend over the cached positions and these (S of them)
            k_BKTE, v_BKTE = cache.store(k_BKTE, v_BKTE)
        y_BHTE = self.sdpa(q_BHTE, k_BKTE, v_BKTE, sdpa_kwargs)
        return self.wo(y_BHTE.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """SwiGLU, w_down(silu(w_gate x) * w_up x), or a plain MLP, w_down(act(w_up x)) with ReLU^2 or GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.activation = cfg.activation
        self.w_gate = nn.Linear(cfg.d_model, cfg.hidden, bias=False) if cfg.gated else None
        self.w_up = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.w_down = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        up_BTF = self.w_up(x_BTD)
        if self.w_gate is not None:
            return self.w_down(F.silu(self.w_gate(x_BTD)) * up_BTF)
        if self.activation == "relu2":
            return self.w_down(F.relu(up_BTF).square())
        return self.w_down(F.gelu(up_BTF, approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = FeedForward(cfg)

    def forward(
        self,
        x_BTD: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        sdpa_kwargs: dict[str, Any],
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos, sin, sdpa_kwargs, cache)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class LayerInputs:
    """What every block of one forward pass is given besides the hidden states."""

    cos: torch.Tensor  # RoPE angles of the pass's positions (Rotary.angles)
    sin: torch.Tensor
    sdpa_kwargs: dict[str, Any]  # the attention rule's SDPA arguments, built once for every layer
    cache: KVCache | None = None  # decoding

    def run(self, block: Block, layer: int, x_BTD: torch.Tensor) -> torch.Tensor:
        """Block `layer` (its index in the whole stack: its part of the cache) on x_BTD."""
        # Training calls a block with exactly these four arguments (what compile and activation checkpointing see).
        if self.cache is None:
            return block(x_BTD, self.cos, self.sin, self.sdpa_kwargs)
        return block(x_BTD, self.cos, self.sin, self.sdpa_kwargs, self.cache.layer(layer))


def layer_inputs(
    rope: Rotary,
    T: int,
    x_BTD: torch.Tensor,
    rule: AttentionRule = CAUSAL,
    positions_BT: torch.Tensor | None = None,
    cache: KVCache | None = None,
    valid_BT: torch.Tensor | None = None,
) -> LayerInputs:
    """The LayerInputs of a pass over T positions whose hidden states x_BTD enter the first block
    (Transformer.forward's arguments say what `rule`, positions_BT, cache and valid_BT mean).

    T is the pass's own: x_BTD may hold a share of its positions (tensor parallelism's sequence
    parallelism splits the embedding's output); x_BTD gives the device and the dtype."""
    device = x_BTD.device
    cos, sin = rope.angles(cache.length if cache is not None else 0, T, positions_BT)
    if cache is not None:
        return LayerInputs(cos, sin, cache.begin(T, device, valid_BT), cache)
    sdpa_kwargs = rule.sdpa_kwargs(T, device)  # any mask is built once, shared by every layer
    if (mask := sdpa_kwargs.get("attn_mask")) is not None:
        # SDPA makes a boolean mask additive on every call and saves that copy for backward: one per
        # layer. Made additive once, in the dtype the projections compute in, every layer shares it.
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else x_BTD.dtype
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        sdpa_kwargs = {**sdpa_kwargs, "attn_mask": additive}
    return LayerInputs(cos, sin, sdpa_kwargs)


def output(
    x_BTD: torch.Tensor, norm: RMSNorm, lm_head: nn.Linear, softcap: float | None, head: Head | None = None
) -> Any:
    """Logits (B, T, V) in fp32 of the last block's hidden states, or what head(final normed hidden
    states, output matrix, logit soft-cap) returns instead."""
    if head is not None:
        return head(norm(x_BTD), lm_head.weight, softcap)
    logits_BTV = lm_head(norm(x_BTD)).float()
    if softcap is not None:  # smooth clamp to (-cap, cap), in fp32
        logits_BTV = softcap * torch.tanh(logits_BTV / softcap)
    return logits_BTV


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.vocab_size is not None, "resolve model.vocab_size from the tokenizer first"
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Keyed by layer index ("0", "1", ...: the names a ModuleList gives): a pipeline stage holds
        # some of them (kiln.train.pipeline_parallel) under the whole model's parameter names.
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = Rotary(cfg)

    def set_rope_theta(self, theta: float) -> None:
        """Switch the RoPE base (a long-context phase); the config, and so a saved checkpoint, follows."""
        self.cfg = self.cfg.model_copy(update={"rope_theta": theta})
        self.rope.fill(self.cfg)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initial weights in place: normal(0, init_std) matrices, norm gains 1, RoPE tables rebuilt.

        Residual-branch outputs (wo, w_down) are scaled down so the stream's variance stays O(1)
        with depth: by 1/sqrt(2 * n_layers) everywhere (init_depth_scale=total, GPT-2), or by
        1/sqrt(2 * (layer + 1)) in block `layer` (init_depth_scale=layer), which leaves the
        early blocks larger.

        Matrices are drawn in named_parameters() order from the default generator, so
        `torch.manual_seed(s)`, construction on the CPU, then this, always give the same weights.
        """
        self.rope.fill(self.cfg)
        std = self.cfg.init_std
        for name, p in self.named_parameters():  # a tied weight comes once
            if name.endswith(".bias"):  # attention_bias: zero, drawing nothing, so the matrices' draws stay the same
                nn.init.zeros_(p)
                continue
            if p.dim() < 2:
                nn.init.ones_(p)  # norm gains: draws nothing from the generator
                continue
            scale = 1.0
            if name.endswith(("wo.weight", "w_down.weight")):  # blocks.<layer>.attn.wo / blocks.<layer>.mlp.w_down
                depth = self.cfg.n_layers if self.cfg.init_depth_scale == "total" else int(name.split(".")[1]) + 1
                scale = 1 / math.sqrt(2 * depth)
            nn.init.normal_(p, mean=0.0, std=std * scale)

    def forward(
        self,
        idx_BT: torch.Tensor,
        rule: AttentionRule = CAUSAL,
        positions_BT: torch.Tensor | None = None,
        cache: KVCache | None = None,
        valid_BT: torch.Tensor | None = None,
        last_only: bool = False,
        head: Head | None = None,
    ) -> Any:
        """Logits (B, T, V) in fp32 for a batch of token ids, attending as `rule` allows.

        positions_BT: each token's RoPE position (restarting per packed document); None means
        0..T-1, or with a cache the positions after the cached ones.
        cache: decoding; the T tokens follow the cached ones and attend causally to them and to
        each other (`rule` is not used), never to positions where valid_BT (a left-padded prefill;
        None: all real) was False.
        last_only: logits of the last position only, (B, 1, V) (decoding needs no others).
        head: instead of the logits, what head(final normed hidden states (B, T, D), output
        matrix (V, D), logit soft-cap) returns: the trainer's fused loss (kiln.train.loss), run
        inside forward so data-parallel wrappers see the output matrix used where they expect.
        """
        x_BTD = self.embed(idx_BT)
        inputs = layer_inputs(self.rope, idx_BT.shape[1], x_BTD, rule, positions_BT, cache, valid_BT)
        for key, block in self.blocks.items():
            x_BTD = inputs.run(block, int(key), x_BTD)
        if cache is not None:
            cache.advance(idx_BT.shape[1])  # the pass is done: its positions are cached
        if last_only:
            x_BTD = x_BTD[:, -1:]
        return output(x_BTD, self.norm, self.lm_head, self.cfg.logit_softcap, head)
