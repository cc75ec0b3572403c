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
Shape legend: B batch, T sequence length, Q queries, K keys.
Not handled here: sliding windows, or building the document ids and prefix lengths (the data side).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class AttentionRule:
    kind: Literal["causal", "full", "prefix"]
    prefix_BT: torch.Tensor | None = None  # prefix rule, bool: keys every query (of the same document) may see
    doc_ids_BT: torch.Tensor | None = None  # a query sees only keys with the same document id

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

    def sdpa_kwargs(self, T: int, device: torch.device) -> dict[str, Any]:
        """Keyword arguments for F.scaled_dot_product_attention that apply this rule to T positions."""
        if self.doc_ids_BT is None and self.kind == "causal":
            return {"is_causal": True}  # the fast path: no mask tensor is built
        if self.doc_ids_BT is None and self.kind == "full":
            return {}
        return {"attn_mask": self.mask_BTT(T, device)[:, None]}  # (B, 1, T, T): the same for every head


CAUSAL = AttentionRule("causal")
FULL = AttentionRule("full")


def prefix_lm(prefix_BT: torch.Tensor) -> AttentionRule:
    """Bidirectional over the positions where prefix_BT is True, causal elsewhere."""
    return AttentionRule("prefix", prefix_BT=prefix_BT)


def leading(prefix_len_B: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool marking the first prefix_len_B[b] positions of each row: one prefix per row."""
    return torch.arange(T, device=prefix_len_B.device)[None, :] < prefix_len_B[:, None]
