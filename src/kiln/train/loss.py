"""The training loss of a Batch: next-token cross-entropy over the positions its loss mask keeps.

Returns the mean over kept positions (what is differentiated) and, detached, each row's mean
and kept-token count (what the per-source log aggregates). A row with no kept position has
mean 0 and count 0.
Shape legend: B rows, T positions, V vocabulary.
Not handled here: z-loss, label smoothing, chunked cross-entropy for large vocabularies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kiln.model.batch import Batch


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class Loss:
    mean: torch.Tensor  # scalar, nats per kept token, with grad
    row_mean_B: torch.Tensor  # detached: nats per kept token of each row
    row_tokens_B: torch.Tensor  # detached: kept tokens per row (int64)


def lm_loss(logits_BTV: torch.Tensor, batch: Batch) -> Loss:
    loss_BT = F.cross_entropy(logits_BTV.flatten(0, 1), batch.targets_BT.flatten(), reduction="none").view_as(batch.targets_BT)
    kept_BT = loss_BT * batch.loss_mask_BT  # masked positions contribute exactly 0
    tokens_B = batch.loss_mask_BT.sum(dim=1)  # (B,) int64
    B, T = loss_BT.shape
    # subtle: mean() times (positions / kept) rather than sum() / kept. With every position kept
    # (next-token prediction) the factor is exactly 1.0, so value and gradient are bit for bit
    # those of loss_BT.mean(), what kiln computed before loss masks, on any device. On the CPU
    # sum() / kept happens to match too (mean is sum-then-divide there; tests/train/test_loss.py),
    # but CUDA's mean kernel multiplies by 1/n, which can round differently from a division.
    mean = kept_BT.mean() * (B * T / tokens_B.sum().clamp(min=1))
    row_mean_B = kept_BT.detach().mean(dim=1) * (T / tokens_B.clamp(min=1))
    return Loss(mean, row_mean_B, tokens_B)
