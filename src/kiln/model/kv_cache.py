"""The key/value cache of decoding: every block's keys and values of the positions seen so far.

A forward pass with a cache attends from its T new positions to everything cached plus
themselves, writes its keys and values after the cached ones and advances the length. Rows of a
batch may start with left padding: `valid_BS` marks real tokens, and no query sees a padding
key (a padding query sees itself, so no row of the mask is empty; its output is never used).
Keys and values are stored for the K key/value heads, before grouped-query expansion, in the
dtype the projections produce (bf16 under bf16 autocast).
Shape legend: B batch, K key/value heads, S cache capacity (positions), T new positions, E head dim.
Not handled here: paging, sliding windows, or positions beyond the model's RoPE tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class KVCache:
    def __init__(self, n_layers: int, capacity: int):
        self.capacity = capacity
        self.length = 0  # positions written by finished forward passes
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.valid_BS: torch.Tensor | None = None

    def begin(self, T: int, device: torch.device, valid_BT: torch.Tensor | None = None) -> dict[str, Any]:
        """Start a pass over T new positions; the SDPA arguments every layer of it uses.

        valid_BT: the new positions' real tokens, given for a left-padded prefill (kept for every
        later pass); None when they are all real. enable_gqa: SDPA reads each key/value head for
        its group of query heads, so the cache is never copied per head.
        """
        end = self.length + T
        assert end <= self.capacity, f"{end} positions exceed the cache's {self.capacity}"
        if valid_BT is not None:
            if self.valid_BS is None:
                self.valid_BS = torch.ones(valid_BT.shape[0], self.capacity, dtype=torch.bool, device=valid_BT.device)
            self.valid_BS[:, self.length : end] = valid_BT
        if self.valid_BS is None and self.length == 0:
            return {"is_causal": True, "enable_gqa": True}  # a prefill without padding: plain causal attention
        if self.valid_BS is None and T == 1:
            return {"enable_gqa": True}  # one new position sees every cached one
        i_T1 = torch.arange(self.length, end, device=device)[:, None]
        j_1S = torch.arange(end, device=device)[None, :]
        allowed_BTS = (j_1S <= i_T1)[None]
        if self.valid_BS is not None:  # no query sees a padding key; a padding query sees itself
            allowed_BTS = (allowed_BTS & self.valid_BS[:, None, :end]) | (j_1S == i_T1)[None]
        return {"attn_mask": allowed_BTS[:, None], "enable_gqa": True}  # (B or 1, 1, T, S_used), shared by the heads

    def layer(self, i: int) -> LayerCache:
        """Block i's part: what its attention stores into."""
        return LayerCache(self, i)

    def store(self, layer: int, k_BKTE: torch.Tensor, v_BKTE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one layer's new keys and values; returns that layer's keys and values so far."""
        B, K, T, E = k_BKTE.shape
        if self.k[layer] is None:  # allocated on first use, in the dtype the projections produce
            self.k[layer] = k_BKTE.new_empty(B, K, self.capacity, E)
            self.v[layer] = v_BKTE.new_empty(B, K, self.capacity, E)
        k_BKSE, v_BKSE = self.k[layer], self.v[layer]
        assert k_BKSE is not None and v_BKSE is not None
        end = self.length + T
        k_BKSE[:, :, self.length : end] = k_BKTE
        v_BKSE[:, :, self.length : end] = v_BKTE
        return k_BKSE[:, :, :end], v_BKSE[:, :, :end]

    def advance(self, T: int) -> None:
        """The pass is done: its T positions are now cached."""
        self.length += T


@dataclass(frozen=True)
class LayerCache:
    cache: KVCache
    index: int

    def store(self, k_BKTE: torch.Tensor, v_BKTE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.store(self.index, k_BKTE, v_BKTE)
