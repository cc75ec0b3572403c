"""Context parallelism: each window's positions split over `parallel.cp` ranks, every rank's keys
and values gathered for attention.

The cp ranks of a group train on the same rows, each holding 1/cp of every window's positions
through the whole model (embedding, blocks, loss), so activation memory per rank shrinks by cp.
Attention is the one place positions meet: every query needs the keys and values of the
positions its rule lets it see. Each rank all-gathers its group's keys and values, layer by layer
(`torch.distributed._functional_collectives.all_gather_single`, whose backward reduce-scatters
the gradients to the ranks holding those positions), and attends with a mask built from window
positions (kiln.model.attention's ContextShard).
Load balance: under a causal mask a late position attends to more keys than an early one, so the
window is cut into 2 x cp chunks and rank r holds chunks r and 2cp-1-r (the head-and-tail split of
PyTorch's and Megatron's context parallelism): each rank gets the same share of the causal work.
Why not ring attention: PyTorch 2.13's context-parallel API (torch.distributed.tensor.experimental)
runs its ring only through the CUDA SDPA kernels (flash, memory-efficient, cuDNN) and only with
is_causal or no mask, and its flex-attention path gathers keys and values as kiln does. kiln's
rules also mask documents and prefixes, and its ranks may be CPUs, so kiln gathers (as Llama 3
was trained): each layer keeps the whole window's keys and values it gathered for backward,
unless it is recomputed (K heads, few with grouped-query attention). Every rule is supported: causal, full (MLM), prefix-LM, each
with or without document masking; also RoPE positions restarting per document, and the
sequence-length schedule (every length must split into 2 x cp chunks).
The loss is each rank's positions' share of the step's kept-token sum; FSDP2 shards the weights
over dp_shard x cp and averages gradients over those ranks (kiln.train.distributed,
`Ranks.grad_scale`), so the group's gradients are summed as data ranks' are.
Shape legend: B rows, T window positions, Q this rank's positions (T / cp), K key/value heads, E head dim.
With tensor parallelism each rank's positions go through the tp plan as a whole window would
(sequence parallelism splits them further over tp; each rank's share must divide by tp).
Not handled here: pipeline stages with cp (refused, with the reason, by kiln.train.mesh.check_layout); evaluation, which scores
whole windows on every rank.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed._functional_collectives as funcol

from kiln.model.attention import ContextShard
from kiln.model.batch import Batch
from kiln.train.loss import Loss


def load_balanced_index(T: int, cp: int, rank: int) -> torch.Tensor:
    """The window positions (T / cp of them, int64) rank `rank` of cp holds: chunks rank and 2cp-1-rank of 2cp."""
    chunks = torch.arange(T).view(2 * cp, T // (2 * cp))
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])


class ContextSplit:
    """This rank's share of each window, and the collectives over its context-parallel group."""

    def __init__(self, group: torch.distributed.ProcessGroup, cp: int, rank: int):
        self.group, self.cp, self.rank = group, cp, rank
        self.shards: dict[tuple[int, torch.device], ContextShard] = {}

    def shard(self, T: int, device: torch.device) -> ContextShard:
        """The ContextShard of a window of T positions (one per length and device)."""
        if (T, device) not in self.shards:
            key_index_T = torch.cat([load_balanced_index(T, self.cp, r) for r in range(self.cp)])  # the order all_gather concatenates in
            self.shards[T, device] = ContextShard(load_balanced_index(T, self.cp, self.rank).to(device), key_index_T.to(device), self.gather_kv)
        return self.shards[T, device]

    def gather_kv(self, k_BKQE: torch.Tensor, v_BKQE: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's keys and values, (B, K, T, E) each: one all-gather for both."""
        kv_BKTE = funcol.all_gather_single(torch.cat([k_BKQE, v_BKQE], dim=1).contiguous(), 2, self.group)
        k_BKTE, v_BKTE = kv_BKTE.chunk(2, dim=1)
        return k_BKTE, v_BKTE

    def share(self, batch: Batch) -> Batch:
        """This rank's positions of a batch of whole windows (already on its device); the document
        ids and prefix stay whole, for the keys of every rank."""
        T = batch.input_ids_BT.shape[1]
        shard = self.shard(T, batch.input_ids_BT.device)
        index_Q = shard.query_index_Q
        positions_BQ = index_Q.expand(batch.input_ids_BT.shape[0], -1) if batch.positions_BT is None else batch.positions_BT[:, index_Q]
        return dataclasses.replace(
            batch, input_ids_BT=batch.input_ids_BT[:, index_Q], targets_BT=batch.targets_BT[:, index_Q], loss_mask_BT=batch.loss_mask_BT[:, index_Q],
            positions_BT=positions_BQ, context=shard,
        )

    def whole_rows(self, loss: Loss) -> tuple[torch.Tensor, torch.Tensor]:
        """(row_mean_B, row_tokens_B) over every rank's positions of each row: a collective."""
        nats_tokens_2B = torch.stack([loss.row_mean_B * loss.row_tokens_B, loss.row_tokens_B.to(loss.row_mean_B.dtype)])
        torch.distributed.all_reduce(nats_tokens_2B, group=self.group)
        return nats_tokens_2B[0] / nats_tokens_2B[1].clamp(min=1), nats_tokens_2B[1].long()
