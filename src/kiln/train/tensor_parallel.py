"""Tensor parallelism (Megatron-LM style) with PyTorch's DTensor plans, and its vocabulary-parallel loss.

Inside each block the query, key and value projections and the feed-forward's gate and up
projections are split column-wise (each rank computes whole heads, and a slice of the hidden
width), the attention output and down projections row-wise: one all-reduce after attention and
one after the feed-forward per block, forward and backward (Shoeybi et al. 2019, Section 3).
The embedding is split by vocabulary rows (each rank looks up the ids it holds; the partial
embeddings are summed), the output layer by vocabulary columns. A tied output matrix stays tied:
both are sharded by vocabulary row alike.
With sequence parallelism (`parallel.sequence_parallel`) the norms and the residual stream
between blocks hold 1/tp of the positions on each rank; the all-reduces become a
reduce-scatter and an all-gather (Korthikanti et al. 2022).
Per-head query and key norms (`model.qk_norm`) have one gain shared by every head, and each rank
normalises only its heads: the gain is replicated over the tp ranks and its gradient, partial on
each, is summed over them in backward, as a sequence-parallel norm's is (the same DTensor style
with the heads as the split dimension); the gradient norm counts it once.
The training loss never gathers the logits: each rank computes its (B, T, V/tp) slice and
`torch.distributed.tensor.parallel.loss_parallel` takes the cross-entropy over the shards
(the loop runs forward and backward inside `Ranks.loss_context`). Evaluation and generation call
the model without a head and get the full logits, gathered.
Shape legend: B rows, T positions, D model width, V vocabulary.
Not handled here: the z-loss under tp (refused, with the reason, by kiln.train.mesh.check_layout),
and the fused chunked loss (kiln.train.loss; tp takes the loss over vocabulary shards instead).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from kiln.model.batch import Batch
from kiln.model.config import ModelConfig
from kiln.train.loss import PLAIN, Loss, LossOptions, logits_loss


class WholeWindows(nn.Module):
    """The sequence-parallel model for evaluation: causal windows of any length, right-padded to a
    multiple of tp for the forward pass (a causal position never sees the padding after it) and
    cut back. Batches of other rules come at the training lengths, which divide by tp already."""

    def __init__(self, model: nn.Module, tp: int):
        super().__init__()
        self.model, self.tp = model, tp

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg  # type: ignore[return-value]

    def forward(self, idx_BT: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        T = idx_BT.shape[1]
        if T % self.tp == 0:
            return self.model(idx_BT, **kwargs)
        assert not kwargs, f"a window of {T} positions with {sorted(kwargs)}: only plain causal windows are padded"
        padded_BT = torch.nn.functional.pad(idx_BT, (0, self.tp - T % self.tp))
        return self.model(padded_BT)[:, :T]


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, sequence_parallel: bool) -> None:
    """Split the Transformer's matrices over the 1-D mesh `tp_mesh`, in place."""
    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout between blocks
    # type: ignore[union-attr]
    tied = model.lm_head is not None and model.lm_head.weight is getattr(model.embed, "weight", None)
    outer = {
        # Each rank looks up the ids in its vocabulary rows (zeros elsewhere); the sum is the embedding.
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "norm": SequenceParallel() if sequence_parallel else None,
        # Without a loss head the model returns the logits gathered (evaluation, generation).
        "lm_head": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
    }
    # A pipeline stage holds the embedding (first) or the norm and output layer (last), or neither.
    parallelize_module(
        model,
        tp_mesh,
        {name: style for name, style in outer.items() if style is not None and getattr(model, name) is not None},
    )
    if tied:  # each plan made its own DTensor of the one matrix: share it again (both are split by vocabulary row)
        model.lm_head.weight = model.embed.weight  # type: ignore[union-attr]
    for block in model.blocks.values():  # type: ignore[union-attr, operator]
        plan = {
            "attn": PrepareModuleInput(
                input_layouts=(between, None, None, None, None),
                desired_input_layouts=(Replicate(), None, None, None, None),
            ),  # (x, cos, sin, sdpa_kwargs, cache)
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=between),
            "mlp": PrepareModuleInput(input_layouts=(between,), desired_input_layouts=(Replicate(),)),
            "mlp.w_up": ColwiseParallel(),
            "mlp.w_down": RowwiseParallel(output_layouts=between),
        }
        if block.mlp.w_gate is not None:
            plan["mlp.w_gate"] = ColwiseParallel()
        if block.attn.q_norm is not None:  # (B, H/tp, T, E): this rank's heads, split on dim 1, one gain for all
            heads = SequenceParallel(sequence_dim=1, use_local_output=True)
            plan |= {"attn.q_norm": heads, "attn.k_norm": heads}
        if sequence_parallel:
            plan |= {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel()}
        parallelize_module(block, tp_mesh, {k: v for k, v in plan.items() if v is not None})


def vocab_parallel_loss(
    hidden_BTD: torch.Tensor,
    weight_VD: torch.Tensor,
    softcap: float | None,
    batch: Batch,
    step_tokens: int | None = None,
    options: LossOptions = PLAIN,
) -> Loss:
    """lm_loss of the logits hidden_BTD @ weight_VD.T, each rank holding its vocabulary shard of
    them (B, T, V/tp); a loss head for Transformer.forward. Call it, and backward, inside
    loss_parallel (Ranks.loss_context). Only options.late_position_weight applies (no z-loss under
    tp, kiln.train.mesh.check_tensor_parallel; the logits are whole in no chunk)."""
    mesh = weight_VD.device_mesh  # type: ignore[attr-defined]
    if isinstance(hidden_BTD, DTensor):  # sequence parallel: every rank needs every position
        hidden_BTD = hidden_BTD.redistribute(mesh, [Replicate()])
    else:
        hidden_BTD = DTensor.from_local(hidden_BTD, mesh, [Replicate()])
    # The logits are Shard(2): this rank's vocabulary columns.
    return logits_loss(
        hidden_BTD,
        weight_VD,
        softcap,
        batch,
        step_tokens,
        LossOptions(late_position_weight=options.late_position_weight),
    )
