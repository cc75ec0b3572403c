"""Attention rules: which key positions each query position may see.

A rule is a small frozen record the model takes per forward pass: causal (a decoder), full
(bidirectional, an encoder), or prefix-LM (bidirectional inside the positions marked as prefix,
causal after them), each optionally restricted to one document per position (block-diagonal
masking of packed sequences). With documents, each document has its own prefix: a prefix key is
visible to every query of its document and, through the document mask, to no other. Plain causal
without document ids takes SDPA's `is_causal=True` fast path (no mask tensor; flash kernels where
the device has them); every other rule builds a boolean (B, 1, T, T) mask, True where a query may
attend to a key. Every rule lets a position see itself, so no row of the mask is empty (an empty
row would give NaN). `mask_BQK` masks queries and keys at any window positions (context
parallelism, kiln.train.context_parallel, holds some of each window's queries).
A rule whose `kernel` is "flex" gives flex attention a block mask instead of the dense mask: the
same rule as a mask_mod, from which PyTorch builds once per pass a list of the 128 x 128 blocks
any query may see, so blocks wholly outside every document are never computed (packed windows of
4,096 positions holding documents of about 500 see about 1/8 of the blocks). PyTorch computes
flex attention's backward on CUDA only; the trainer picks the kernel (train.attention_kernel).
Shape legend: B batch, T sequence length, Q queries, K keys.
Not handled here: sliding windows, or building the document ids and prefix lengths (the data side).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:  # imported where a block mask is built: flex attention's module takes 0.35 s to import
    from torch.nn.attention.flex_attention import BlockMask

Kernel = Literal["sdpa", "flex"]
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (b, h, q, k) -> allowed


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class AttentionRule:
    kind: Literal["causal", "full", "prefix"]
    prefix_BT: torch.Tensor | None = None  # prefix rule, bool: keys every query (of the same document) may see
    doc_ids_BT: torch.Tensor | None = None  # a query sees only keys with the same document id
    kernel: Kernel = "sdpa"  # how a rule that needs a mask is computed: SDPA with a dense mask, or flex attention

    def __post_init__(self) -> None:
        assert (self.kind == "prefix") == (self.prefix_BT is not None), "prefix_BT goes with kind='prefix' only"

    def within_documents(self, doc_ids_BT: torch.Tensor | None) -> AttentionRule:
        """This rule restricted to each position's own document; None leaves it as it is."""
        return self if doc_ids_BT is None else dataclasses.replace(self, doc_ids_BT=doc_ids_BT)

    def mask_BTT(self, T: int, device: torch.device) -> torch.Tensor:
        """Boolean (B or 1, T, T): [b, i, j] is True where query i may attend to key j."""
        index_T = torch.arange(T, device=device)
        return self.mask_BQK(index_T, index_T)

    def mask_BQK(self, query_Q: torch.Tensor, key_K: torch.Tensor) -> torch.Tensor:
        """Boolean (B or 1, Q, K): [b, i, j] is True where the query at window position query_Q[i]
        may attend to the key at window position key_K[j]."""
        device = query_Q.device
        if self.kind == "full":
            allowed = torch.ones(1, len(query_Q), len(key_K), dtype=torch.bool, device=device)
        else:
            allowed = (key_K[None, :] <= query_Q[:, None])[None]  # causal: (1, Q, K)
        if self.prefix_BT is not None:
            # Keys inside a prefix are visible to every query (the queries after it see them
            # causally anyway), so the prefix block is bidirectional; the document mask below
            # keeps one document's prefix from the queries of an earlier document.
            allowed = allowed | self.prefix_BT.to(device)[:, key_K][:, None, :]
        if self.doc_ids_BT is not None:
            doc_BT = self.doc_ids_BT.to(device)
            allowed = allowed & (doc_BT[:, query_Q][:, :, None] == doc_BT[:, key_K][:, None, :])
        return allowed

    def mask_mod(self, device: torch.device) -> MaskMod:
        """This rule as flex attention's mask_mod(b, h, q, k) -> bool over positions of the window
        (mask_BQK's rule, written for one query and key at a time)."""
        prefix_BT = None if self.prefix_BT is None else self.prefix_BT.to(device)
        doc_BT = None if self.doc_ids_BT is None else self.doc_ids_BT.to(device)
        full = self.kind == "full"

        def allowed(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            seen = (k <= q) | full
            if prefix_BT is not None:
                seen = seen | prefix_BT[b, k]
            if doc_BT is not None:
                seen = seen & (doc_BT[b, q] == doc_BT[b, k])
            return seen

        return allowed

    def block_mask(self, T: int, device: torch.device) -> BlockMask:
        """flex attention's BlockMask of this rule over T positions, one per row (shared by the heads)."""
        rows = next((t.shape[0] for t in (self.prefix_BT, self.doc_ids_BT) if t is not None), None)
        return block_mask_builder(device.type == "cuda")(self.mask_mod(device), rows, None, T, T, device=device)

    def sdpa_kwargs(self, T: int, device: torch.device) -> dict[str, Any]:
        """Keyword arguments for the attention (kiln.model.transformer.ScaledDotProduct) that apply
        this rule to T positions: SDPA's, or flex attention's block mask."""
        if self.doc_ids_BT is None and self.kind == "causal":
            return {"is_causal": True}  # the fast path: no mask tensor is built
        if self.doc_ids_BT is None and self.kind == "full":
            return {}
        if self.kernel == "flex":
            return {"block_mask": self.block_mask(T, device)}
        return {"attn_mask": self.mask_BTT(T, device)[:, None]}  # (B, 1, T, T): the same for every head


@functools.cache
def block_mask_builder(cuda: bool) -> Callable[..., BlockMask]:
    """PyTorch's create_block_mask; on CUDA compiled, which builds the mask block by block (eager, it
    first makes the whole (B, T, T) mask). Its tensors are the compiled function's inputs: a new
    batch's document ids reuse the compiled code."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask) if cuda else create_block_mask


CAUSAL = AttentionRule("causal")
FULL = AttentionRule("full")


def prefix_lm(prefix_BT: torch.Tensor) -> AttentionRule:
    """Bidirectional over the positions where prefix_BT is True, causal elsewhere."""
    return AttentionRule("prefix", prefix_BT=prefix_BT)


def leading(prefix_len_B: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool marking the first prefix_len_B[b] positions of each row: one prefix per row."""
    return torch.arange(T, device=prefix_len_B.device)[None, :] < prefix_len_B[:, None]
