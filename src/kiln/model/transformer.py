"""A Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention.

Options from the config: ReLU-squared or GELU feed-forward instead of SwiGLU, RMSNorm on
queries and keys (qk_norm), tanh soft-capping of the output logits, depth-scaled
initialisation. Positions default to 0..T-1; a caller packing several documents in a row passes
`positions_BT` restarting at each document (kiln.model.batch), so each sees the rotations it
would see alone.

Only model math lives here: parallelism, activation checkpointing and torch.compile are applied
from outside (kiln.train), the loss lives with the trainer (kiln.train.loss). Attention goes
through PyTorch's scaled_dot_product_attention, which picks a flash or memory-efficient kernel
where the device has one; which positions see which is the caller's AttentionRule
(kiln.model.attention; causal by default). The constructor allocates (with PyTorch's per-layer
defaults); `init_weights()` draws kiln's initial weights and fills the RoPE tables, so a model
can be built on the meta device, materialised with `to_empty(device=...)` and initialised
there (kiln.model.init).

Shape legend:
    B batch, T sequence length, D d_model, H query heads, K key/value heads,
    E head dim (D / H), F feed-forward hidden, V vocabulary.
Decoding passes a KVCache (kiln.model.kv_cache): each block's attention stores its new keys
and values there and attends over all of them; the caller gives the new positions.
Not handled here: the z-loss (a loss term: kiln.train.loss reads model.z_loss), sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kiln.model.attention import CAUSAL, AttentionRule
from kiln.model.config import ModelConfig
from kiln.model.kv_cache import KVCache, LayerCache

# What Transformer.forward's `head` is called with: final normed hidden states (B, T, D), output matrix (V, D), logit soft-cap.
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


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (T, E/2): position t rotates pair i by t * theta^(-2i/E)."""
    inv_freq_E2 = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles_TE2 = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq_E2)
    return angles_TE2.cos().float(), angles_TE2.sin().float()


def apply_rope(x_BHTE: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate by the angles in cos/sin: (T, E/2) shared by every row, or (B, 1, T, E/2) per row."""
    # Rotate (first half, second half) pairs, the "rotate_half" layout Hugging Face Llama uses,
    # so exported weights need no permutation.
    x1, x2 = x_BHTE.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.type_as(x_BHTE)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        # One gain vector per projection, shared by its heads (as OLMo 2 and Qwen 3 normalise per head).
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x_BTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sdpa_kwargs: dict[str, Any], cache: LayerCache | None = None) -> torch.Tensor:
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
        if (gather_kv := sdpa_kwargs.get("gather_kv")) is not None:  # context parallel: every rank's keys and values
            k_BKTE, v_BKTE = gather_kv(k_BKTE, v_BKTE)
            sdpa_kwargs = {"attn_mask": sdpa_kwargs["attn_mask"]}
        # Grouped-query: each K/V head serves H/K query heads. Training copies them (SDPA's
        # enable_gqa sums the K/V gradients in another order); decoding passes enable_gqa instead.
        if self.n_kv != self.n_heads and not sdpa_kwargs.get("enable_gqa"):
            k_BKTE = k_BKTE.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v_BKTE = v_BKTE.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        # sdpa_kwargs: is_causal=True (the fast path), nothing (full), or a (B, 1, T, T) bool attn_mask
        # ((B, 1, T/cp, T) under context parallelism: this rank's queries, every rank's keys).
        y_BHTE = F.scaled_dot_product_attention(q_BHTE, k_BKTE, v_BKTE, **sdpa_kwargs)
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

    def forward(self, x_BTD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sdpa_kwargs: dict[str, Any], cache: LayerCache | None = None) -> torch.Tensor:
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos, sin, sdpa_kwargs, cache)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.vocab_size is not None, "resolve model.vocab_size from the tokenizer first"
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Keyed by layer index ("0", "1", ...: the names a ModuleList gives): a pipeline stage keeps
        # some of them (kiln.train.pipeline_parallel) and parameter names stay the whole model's.
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        # Not parameters and not saved: rebuilt from the config on load and by init_weights().
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def set_rope_theta(self, theta: float) -> None:
        """Switch the RoPE base (a long-context phase); the config, and so a saved checkpoint, follows."""
        self.cfg = self.cfg.model_copy(update={"rope_theta": theta})
        cos, sin = rope_tables(self.cfg.max_seq_len, self.cfg.head_dim, theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

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
        cos, sin = rope_tables(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_theta)
        self.rope_cos.copy_(cos)  # after to_empty() the buffers hold garbage
        self.rope_sin.copy_(sin)
        std = self.cfg.init_std
        for name, p in self.named_parameters():  # a tied weight comes once
            if p.dim() < 2:
                nn.init.ones_(p)  # norm gains: draws nothing from the generator
                continue
            scale = 1.0
            if name.endswith(("wo.weight", "w_down.weight")):  # blocks.<layer>.attn.wo / blocks.<layer>.mlp.w_down
                depth = self.cfg.n_layers if self.cfg.init_depth_scale == "total" else int(name.split(".")[1]) + 1
                scale = 1 / math.sqrt(2 * depth)
            nn.init.normal_(p, mean=0.0, std=std * scale)

    def forward(self, idx_BT: torch.Tensor, rule: AttentionRule = CAUSAL, positions_BT: torch.Tensor | None = None, cache: KVCache | None = None, valid_BT: torch.Tensor | None = None, last_only: bool = False, head: Head | None = None, layers: range | None = None) -> Any:
        """Logits (B, T, V) in fp32 for a batch of token ids, attending as `rule` allows.

        A pipeline stage (kiln.train.pipeline_parallel) may lack the embedding (it is given the
        hidden states (B, T, D) of the stage before instead of ids) or the output layer (it returns
        its hidden states). `layers`: run only those layers of the stack (one of the pipeline
        stages a rank holds, whose blocks this model keeps): it is given ids where the run starts
        at layer 0 and hidden states otherwise, and returns hidden states unless it ends at the
        last layer. None: every block this model holds.

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
        T = idx_BT.shape[1]
        start = cache.length if cache is not None else 0
        assert start + T <= self.cfg.max_seq_len, f"sequence of {start + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}"
        if positions_BT is None:
            cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, E/2), broadcast over rows and heads
        else:
            cos, sin = self.rope_cos[positions_BT][:, None], self.rope_sin[positions_BT][:, None]  # (B, 1, T, E/2)
        if cache is None:
            sdpa_kwargs = rule.sdpa_kwargs(T, idx_BT.device)  # any mask is built once, shared by every layer
        else:
            sdpa_kwargs = cache.begin(T, idx_BT.device, valid_BT)
        embeds = self.embed is not None if layers is None else layers.start == 0
        x_BTD = self.embed(idx_BT) if embeds else idx_BT  # a later pipeline stage is given hidden states
        if cache is None and (mask := sdpa_kwargs.get("attn_mask")) is not None:
            # SDPA makes a boolean mask additive on every call and saves that copy for backward: one per
            # layer. Made additive once, in the dtype the projections compute in, every layer shares it.
            device = x_BTD.device.type
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x_BTD.dtype
            sdpa_kwargs = {**sdpa_kwargs, "attn_mask": torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))}
        keys = [key for key in self.blocks if layers is None or int(key) in layers]
        for key in keys:
            # Training calls a block with exactly these four arguments (what compile and activation checkpointing see).
            block = self.blocks[key]
            x_BTD = block(x_BTD, cos, sin, sdpa_kwargs) if cache is None else block(x_BTD, cos, sin, sdpa_kwargs, cache.layer(int(key)))
        if cache is not None and keys[-1] == list(self.blocks)[-1]:  # once per pass through the stack: after the last block this model holds
            cache.advance(T)
        if self.lm_head is None or (layers is not None and layers.stop < self.cfg.n_layers):  # a stage before the last: its hidden states go to the next
            return x_BTD
        if last_only:
            x_BTD = x_BTD[:, -1:]
        if head is not None:
            return head(self.norm(x_BTD), self.lm_head.weight, self.cfg.logit_softcap)
        logits_BTV = self.lm_head(self.norm(x_BTD)).float()
        if self.cfg.logit_softcap is not None:  # smooth clamp to (-cap, cap), in fp32
            cap = self.cfg.logit_softcap
            logits_BTV = cap * torch.tanh(logits_BTV / cap)
        return logits_BTV
