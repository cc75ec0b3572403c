"""Context parallelism: each window's positions split over `parallel.cp` ranks, every rank's keys
and values gathered for attention.

The cp ranks of a group train on the same rows, each holding 1/cp of every window's positions
through the whole model (embedding, blocks, loss), so activation memory per rank shrinks by cp.
Attention is the one place positions meet: every query needs the keys and values of the
positions its rule lets it see. `apply_context_parallel` wraps each block's attention proper
(kiln.model.transformer's ScaledDotProduct, which has no parameters: names stay the model's) in
`GatheredKeys`: inside `ContextSplit.sharded()`, around the step's forward and backward as
PyTorch's own context-parallel API is entered, each rank all-gathers its group's keys and values,
layer by layer (`torch.distributed._functional_collectives.all_gather_single`, whose backward
reduce-scatters the gradients to the ranks holding those positions); outside it (evaluation on
whole windows) attention is the model's own. A rank's share of a batch (`ContextBatch`) carries a
`ShardedRule`, its rule masking this rank's queries against every rank's keys by their places in
the window; the model applies it as any rule.
Load balance: under a causal mask a late position attends to more keys than an early one, so the
window is cut into 2 x cp chunks and rank r holds chunks r and 2cp-1-r (the head-and-tail split of
PyTorch's and Megatron's context parallelism): each rank gets the same share of the causal work.
Why not ring attention: PyTorch 2.13's context-parallel API (torch.distributed.tensor.experimental)
runs its ring only through the CUDA SDPA kernels (flash, memory-efficient, cuDNN) and only with
is_causal or no mask, and its flex-attention path gathers keys and values as kiln does. kiln's
rules also mask documents and prefixes, and its ranks may be CPUs, so kiln gathers (as Llama 3
was trained): each layer keeps the whole window's keys and values it gathered for backward,
unless it is recomputed (K heads, few with grouped-query attention). Every rule is supported:
causal, full (MLM), prefix-LM, each with or without document masking; also RoPE positions
restarting per document, and the sequence-length schedule (every length must split into 2 x cp
chunks).
The loss is each rank's positions' share of the step's kept-token sum; FSDP2 shards the weights
over dp_shard x cp and averages gradients over those ranks (kiln.train.distributed,
`Ranks.grad_scale`), so the group's gradients are summed as data ranks' are.
Shape legend: B rows, T window positions, Q this rank's positions (T / cp), K key/value heads, E head dim.
With tensor parallelism each rank's positions go through the tp plan as a whole window would
(sequence parallelism splits them further over tp; each rank's share must divide by tp).
Not handled here: pipeline stages with cp (refused, with the reason, by kiln.train.mesh.check_layout);
evaluation, which scores whole windows on every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn

from kiln.model.attention import AttentionRule, Kernel
from kiln.model.batch import Batch
from kiln.train.loss import Loss


def load_balanced_index(T: int, cp: int, rank: int) -> torch.Tensor:
    """The window positions (T / cp of them, int64) rank `rank` of cp holds: chunks rank and 2cp-1-rank of 2cp."""
    chunks = torch.arange(T).view(2 * cp, T // (2 * cp))
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])


@dataclass(frozen=True, eq=False, kw_only=True)  # eq=False: tensor fields have no single truth value
class ShardedRule(AttentionRule):
    """A rule over whole windows (its prefix and document ids cover them), applied to one rank's
    queries and every rank's keys, by their places in the window."""

    query_index_Q: torch.Tensor  # int64: the window positions this rank holds, in its order
    key_index_T: torch.Tensor  # int64: the window position of each gathered key, in gather order

    def sdpa_kwargs(self, T: int, device: torch.device) -> dict[str, Any]:
        """A (B, 1, Q, T) mask whatever the rule: the queries and keys are not in window order (T,
        what the model passes, is this rank's Q)."""
        return {"attn_mask": self.mask_BQK(self.query_index_Q.to(device), self.key_index_T.to(device))[:, None]}


@dataclass(frozen=True, eq=False, kw_only=True)  # eq=False: tensor fields have no single truth value
class ContextBatch(Batch):
    """One rank's share of a batch of whole windows: the (B, T) fields hold its Q positions of each
    window (query_index_Q), doc_ids_BT and prefix_BT the whole window, for the keys of every rank."""

    query_index_Q: torch.Tensor  # int64, on the batch's device
    key_index_T: torch.Tensor  # int64: every rank's positions in the order all_gather concatenates them

    def rule(self, kernel: Kernel = "sdpa") -> AttentionRule:
        """The rule over this rank's queries and every rank's keys: SDPA with a dense mask whatever the kernel."""
        return ShardedRule(
            self.attention,
            prefix_BT=self.prefix_BT,
            doc_ids_BT=self.doc_ids_BT,
            query_index_Q=self.query_index_Q,
            key_index_T=self.key_index_T,
        )

    def window_positions(self) -> tuple[torch.Tensor | None, int]:
        return self.query_index_Q, len(self.key_index_T)


class ContextSplit:
    """This rank's share of each window, and the collectives over its context-parallel group."""

    def __init__(self, group: torch.distributed.ProcessGroup, cp: int, rank: int):
        self.group, self.cp, self.rank = group, cp, rank
        self.indices: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self.active = False  # inside sharded(): GatheredKeys gathers

    def index(self, T: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(this rank's window positions, every rank's in gather order) of a window of T positions
        (one pair per length and device)."""
        if (T, device) not in self.indices:
            key_index_T = torch.cat(
                [load_balanced_index(T, self.cp, r) for r in range(self.cp)]
            )  # the order all_gather concatenates in
            self.indices[T, device] = load_balanced_index(T, self.cp, self.rank).to(device), key_index_T.to(device)
        return self.indices[T, device]

    @contextmanager
    def sharded(self) -> Iterator[None]:
        """Around the forward and backward of ContextBatches (activation checkpointing recomputes
        the forward inside the backward): attention gathers every rank's keys and values."""
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def gather_kv(self, k_BKQE: torch.Tensor, v_BKQE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's keys and values, (B, K, T, E) each: one all-gather for both."""
        kv_BKTE = funcol.all_gather_single(torch.cat([k_BKQE, v_BKQE], dim=1).contiguous(), 2, self.group)
        k_BKTE, v_BKTE = kv_BKTE.chunk(2, dim=1)
        return k_BKTE, v_BKTE

    def share(self, batch: Batch) -> ContextBatch:
        """This rank's positions of a batch of whole windows (already on its device)."""
        T = batch.input_ids_BT.shape[1]
        index_Q, key_index_T = self.index(T, batch.input_ids_BT.device)
        positions_BQ = (
            index_Q.expand(batch.input_ids_BT.shape[0], -1)
            if batch.positions_BT is None
            else batch.positions_BT[:, index_Q]
        )
        whole = {f.name: getattr(batch, f.name) for f in dataclasses.fields(Batch)}
        return ContextBatch(
            **{
                **whole,
                "input_ids_BT": batch.input_ids_BT[:, index_Q],
                "targets_BT": batch.targets_BT[:, index_Q],
                "loss_mask_BT": batch.loss_mask_BT[:, index_Q],
                "positions_BT": positions_BQ,
            },
            query_index_Q=index_Q,
            key_index_T=key_index_T,
        )

    def whole_rows(self, loss: Loss) -> tuple[torch.Tensor, torch.Tensor]:
        """(row_mean_B, row_tokens_B) over every rank's positions of each row: a collective."""
        nats_tokens_2B = torch.stack([loss.row_mean_B * loss.row_tokens_B, loss.row_tokens_B.to(loss.row_mean_B.dtype)])
        torch.distributed.all_reduce(nats_tokens_2B, group=self.group)
        return nats_tokens_2B[0] / nats_tokens_2B[1].clamp(min=1), nats_tokens_2B[1].long()


class GatheredKeys(nn.Module):
    """A block's attention proper under context parallelism: inside ContextSplit.sharded(), this
    rank's queries (B, H, Q, E) attend over its group's keys and values, gathered from (B, K, Q, E)
    to (B, K, T, E); outside it, the attention it wraps as it is."""

    def __init__(self, inner: nn.Module, split: ContextSplit):
        super().__init__()
        self.inner, self.split = inner, split

    def forward(
        self, q_BHQE: torch.Tensor, k_BKQE: torch.Tensor, v_BKQE: torch.Tensor, sdpa_kwargs: dict[str, Any]
    ) -> torch.Tensor:
        if not self.split.active:
            return self.inner(q_BHQE, k_BKQE, v_BKQE, sdpa_kwargs)
        k_BKTE, v_BKTE = self.split.gather_kv(k_BKQE, v_BKQE)  # sync point: an all-gather per layer, both ways
        return self.inner(q_BHQE, k_BKTE, v_BKTE, sdpa_kwargs)


def apply_context_parallel(model: nn.Module, split: ContextSplit) -> None:
    """Wrap every block's attention proper in GatheredKeys, in place (no parameter is added or renamed)."""
    for block in model.blocks.values():  # type: ignore[union-attr, operator]
        block.attn.sdpa = GatheredKeys(block.attn.sdpa, split)
