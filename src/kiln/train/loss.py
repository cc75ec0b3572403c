"""The training loss of a Batch: cross-entropy over the positions its loss mask keeps, plus z-loss.

The differentiated value is the sum over kept positions divided by the kept positions of the
whole optimizer step (all micro-batches; all ranks once data-parallel), so every kept token
weighs the same however the masks fall (MLM keeps ~15% of a row, prefix-LM a random share); a
per-micro-batch mean would weigh a token of a sparse micro-batch more. The optional z-loss,
z_loss * logsumexp(logits)^2 per kept position (PaLM), pulls the softmax normaliser towards 1.
Also returned, detached: each row's mean cross-entropy and kept-token count (what the
per-source log aggregates); a row with no kept position has mean 0 and count 0.
Shape legend: B rows, T positions, V vocabulary.
With train.late_position_weight, the differentiated value weighs position t by
1 + w * t / (T - 1) (mean 1), for long-context phases that should learn from far context.
Not handled here: label smoothing, chunked cross-entropy for large vocabularies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kiln.model.batch import Batch


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class Loss:
    value: torch.Tensor  # scalar with grad: this micro-batch's share of the step's loss
    row_mean_B: torch.Tensor  # detached: cross-entropy nats per kept token of each row
    row_tokens_B: torch.Tensor  # detached: kept tokens per row (int64)


def position_weights(T: int, late: float, device: torch.device) -> torch.Tensor:
    """(T,) weights 1 + late * t / (T - 1), scaled to mean 1: later positions count more."""
    w_T = 1 + late * torch.arange(T, device=device, dtype=torch.float32) / max(T - 1, 1)
    return w_T / w_T.mean()


def lm_loss(logits_BTV: torch.Tensor, batch: Batch, step_tokens: int | None = None, z_loss: float = 0.0, late_position_weight: float = 0.0) -> Loss:
    """step_tokens: kept positions of the whole step; None means this batch's own (its plain mean)."""
    loss_BT = F.cross_entropy(logits_BTV.flatten(0, 1), batch.targets_BT.flatten(), reduction="none").view_as(batch.targets_BT)
    kept_BT = loss_BT * batch.loss_mask_BT  # masked positions contribute exactly 0
    tokens_B = batch.loss_mask_BT.sum(dim=1)  # (B,) int64
    B, T = loss_BT.shape
    # subtle: mean() times (positions / kept) rather than sum() / kept. With every position kept
    # in one micro-batch (next-token prediction) the factor is exactly 1.0, so value and gradient
    # are bit for bit those of loss_BT.mean(), what kiln computed before loss masks, on any
    # device. On the CPU sum() / kept happens to match too (mean is sum-then-divide there), but
    # CUDA's mean kernel multiplies by 1/n, which can round differently from a division.
    scale = B * T / step_tokens if step_tokens else B * T / tokens_B.sum().clamp(min=1)
    value = kept_BT.mean() * scale
    if late_position_weight:  # replaces the plain value; the logged row means stay unweighted
        value = (kept_BT * position_weights(T, late_position_weight, kept_BT.device)).mean() * scale
    if z_loss:
        z_BT = torch.logsumexp(logits_BTV, dim=-1)  # log of the softmax normaliser
        value = value + z_loss * (z_BT.square() * batch.loss_mask_BT).mean() * scale
    row_mean_B = kept_BT.detach().mean(dim=1) * (T / tokens_B.clamp(min=1))
    return Loss(value, row_mean_B, tokens_B)
