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

fused_lm_loss is the same loss taken through the output layer in chunks of positions (what
train.fused_loss selects): each chunk's logits are made, turned into its losses and its
gradients (softmax minus one-hot, times each position's weight) and dropped, so the (B, T, V)
logits never exist whole and are passed over fewer times; the backward pass only scales the
gradients the forward pass kept. Same value and gradients as lm_loss on the model's logits up to
summation order (tests/train/test_loss.py).
Shape legend (fused): N = B * T positions, D model width, P the vocabulary padded to PAD_VOCAB.
Not handled here: label smoothing; fp16's loss scaling with the fused loss (the trainer takes
the plain path for fp16: the unscaled per-position gradients would underflow in fp16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from kiln.model.batch import Batch


@dataclass(frozen=True)
class LossOptions:
    """How a loss head (logits_loss, fused_lm_loss) takes the loss, besides the batch."""

    z_loss: float = 0.0  # model.z_loss: weight of logsumexp(logits)^2 per kept position
    late_position_weight: float = 0.0  # train.late_position_weight
    chunk: int = 256  # fused_lm_loss: positions per chunk through the output layer
    compiled: bool = False  # fused_lm_loss: each chunk through torch.compile


PLAIN = LossOptions()  # no z-loss, every position alike


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class Loss:
    value: torch.Tensor  # scalar with grad: this micro-batch's share of the step's loss
    row_mean_B: torch.Tensor  # detached: cross-entropy nats per kept token of each row
    row_tokens_B: torch.Tensor  # detached: kept tokens per row (int64)


def position_weights(T: int, late: float, device: torch.device) -> torch.Tensor:
    """(T,) weights 1 + late * t / (T - 1), scaled to mean 1: later positions count more."""
    w_T = 1 + late * torch.arange(T, device=device, dtype=torch.float32) / max(T - 1, 1)
    return w_T / w_T.mean()


def window_weights(batch: Batch, late: float, device: torch.device) -> torch.Tensor:
    """position_weights of the batch's positions by their place in the window: (T,), or this rank's (Q,) under context
    parallelism."""
    index_Q, length = batch.window_positions()
    weights_T = position_weights(length, late, device)
    return weights_T if index_Q is None else weights_T[index_Q.to(device)]


def lm_loss(
    logits_BTV: torch.Tensor,
    batch: Batch,
    step_tokens: int | None = None,
    z_loss: float = 0.0,
    late_position_weight: float = 0.0,
) -> Loss:
    """step_tokens: kept positions of the whole step; None means this batch's own (its plain mean)."""
    loss_N = F.cross_entropy(logits_BTV.flatten(0, 1), batch.targets_BT.flatten(), reduction="none")
    # Tensor parallel: loss_parallel's cross-entropy over the vocabulary shards, whole on every rank.
    if isinstance(loss_N, DTensor):
        loss_N = loss_N.full_tensor()
    loss_BT = loss_N.view_as(batch.targets_BT)
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
        value = (kept_BT * window_weights(batch, late_position_weight, kept_BT.device)).mean() * scale
    if z_loss:
        z_BT = torch.logsumexp(logits_BTV, dim=-1)  # log of the softmax normaliser
        value = value + z_loss * (z_BT.square() * batch.loss_mask_BT).mean() * scale
    row_mean_B = kept_BT.detach().mean(dim=1) * (T / tokens_B.clamp(min=1))
    return Loss(value, row_mean_B, tokens_B)


def logits_loss(
    hidden_BTD: torch.Tensor,
    weight_VD: torch.Tensor,
    softcap: float | None,
    batch: Batch,
    step_tokens: int | None = None,
    options: LossOptions = PLAIN,
) -> Loss:
    """lm_loss of the logits hidden_BTD @ weight_VD.T (soft-capped), made whole in fp32: the loss as
    a model head where the chunked one is not used (a pipeline's last stage with fp16 or
    train.fused_loss off; over vocabulary shards, kiln.train.tensor_parallel)."""
    logits_BTV = F.linear(hidden_BTD, weight_VD).float()
    if softcap is not None:
        logits_BTV = softcap * torch.tanh(logits_BTV / softcap)
    return lm_loss(logits_BTV, batch, step_tokens, options.z_loss, options.late_position_weight)


# Zero rows pad the output matrix to a multiple of this for the fused loss's matmuls: cuBLAS ran
# (32768 x 768) @ (768 x 50257) in bf16 at 96 TFLOP/s on an H200, and at 675 with 50,304 columns.
PAD_VOCAB = 64
# torch.addmm(..., out_dtype=torch.float32) sums bf16 factors into an fp32 `self` on CUDA from PyTorch 2.10 on.
FP32_ADDMM = torch.__version__ >= "2.10"


def head_chunk(
    h_CD: torch.Tensor,
    w_PD: torch.Tensor,
    target_C: torch.Tensor,
    ce_weight_C: torch.Tensor,
    z_weight_C: torch.Tensor,
    vocab: int,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of positions: (d value / d logits in the matmul dtype, ce_C, the chunk's value).

    In place over the chunk's fp32 logits when eager; torch.compile fuses the same code into a few
    passes that never write the fp32 logits. Every pass runs over all P columns, so each row is
    one contiguous run of memory (a slice to the vocabulary made the compiled gradient pass index
    row by row: 1.5 TB/s on an H100); the padded columns are set to -inf, so they get no
    probability and a zero gradient.
    """
    logits_CP = (h_CD @ w_PD.t()).float()
    if softcap is not None:
        tanh_CP = torch.tanh(logits_CP / softcap)
        logits_CP.copy_(tanh_CP).mul_(softcap)
    if vocab < logits_CP.shape[1]:
        logits_CP[:, vocab:] = float("-inf")
    target_logit_C = logits_CP.gather(1, target_C[:, None]).squeeze(1)
    # One exp pass gives both the log-normaliser and the softmax.
    max_C = logits_CP.amax(dim=-1)
    exp_CP = logits_CP.sub_(max_C[:, None]).exp_()
    sum_C = exp_CP.sum(dim=-1)
    lse_C = max_C + sum_C.log()
    ce_C = lse_C - target_logit_C
    # d value / d logits = softmax * (ce_w + 2 z_w lse) - ce_w * one-hot; the target's column is
    # written last, from fp32 values, so p - 1 near p = 1 loses nothing to the matmul dtype.
    coef_C = (ce_weight_C + 2 * z_weight_C * lse_C) / sum_C
    exp_CP.mul_(coef_C[:, None])
    grad_target_C = torch.exp(target_logit_C - max_C) * coef_C - ce_weight_C
    if softcap is not None:
        exp_CP.mul_(1 - tanh_CP.square())
        grad_target_C = grad_target_C * (1 - (target_logit_C / softcap).square())
    grad_CP = exp_CP.to(h_CD.dtype)
    grad_CP[torch.arange(len(target_C), device=target_C.device), target_C] = grad_target_C.to(grad_CP.dtype)
    return grad_CP, ce_C, (ce_C * ce_weight_C).sum() + (lse_C.square() * z_weight_C).sum()


@cache
def compiled_head_chunk() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return torch.compile(head_chunk)  # built on first use: importing torch's compiler takes seconds


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class HeadTargets:
    """Per position of the flattened rows (N): the target id and the weights of its cross-entropy and its z-loss."""

    targets_N: torch.Tensor
    ce_weight_N: torch.Tensor
    z_weight_N: torch.Tensor


class _ChunkedHeadLoss(torch.autograd.Function):
    """sum_n ce_weight_N[n] * ce_N[n] + z_weight_N[n] * lse_N[n]^2 through the output matrix, chunk by chunk.

    Logits are hidden_ND @ weight_VD.T in the autocast dtype when autocast is on (as the model's
    output layer would run), then fp32; with softcap, cap * tanh(logits / cap). Returns the value
    and the detached per-position cross-entropy ce_N.
    The matrix gets zero rows up to a multiple of PAD_VOCAB for the matmuls alone; the padded
    logits take no part in the loss and get zero gradient.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_ND: torch.Tensor,
        weight_VD: torch.Tensor,
        at: HeadTargets,
        softcap: float | None,
        options: LossOptions,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device, chunk = hidden_ND.device.type, options.chunk
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_ND.dtype
        step = compiled_head_chunk() if options.compiled else head_chunk
        with torch.autocast(device, enabled=False):
            V = weight_VD.shape[0]
            h_ND, w_PD = hidden_ND.to(mm_dtype), weight_VD.to(mm_dtype)
            if V % PAD_VOCAB:
                w_PD = F.pad(w_PD, (0, 0, 0, PAD_VOCAB - V % PAD_VOCAB))
            N = h_ND.shape[0]
            grad_h_ND = torch.empty_like(h_ND)
            grad_w_PD = torch.zeros(w_PD.shape, dtype=torch.float32, device=w_PD.device)
            ce_N = torch.empty(N, dtype=torch.float32, device=h_ND.device)
            value = torch.zeros((), dtype=torch.float32, device=h_ND.device)
            for start in range(0, N, chunk):
                end = min(start + chunk, N)
                h_CD = h_ND[start:end]
                weights_C = at.ce_weight_N[start:end], at.z_weight_N[start:end]
                grad_CP, ce_N[start:end], chunk_value = step(
                    h_CD, w_PD, at.targets_N[start:end], *weights_C, V, softcap
                )
                value += chunk_value
                torch.mm(grad_CP, w_PD, out=grad_h_ND[start:end])
                if mm_dtype == torch.float32:
                    grad_w_PD.addmm_(grad_CP.t(), h_CD)
                elif grad_w_PD.is_cuda and FP32_ADDMM:
                    # bf16 inputs summed into the fp32 gradient by the matmul itself: on an H100 0.58 ms
                    # a chunk against 0.69 for a bf16 product then an fp32 add, and 7e-6 relative error
                    # against 2e-3 after 21 chunks (the bf16 product is rounded before it is added).
                    torch.addmm(grad_w_PD, grad_CP.t(), h_CD, out_dtype=torch.float32, out=grad_w_PD)
                else:  # no mixed-dtype matmul on the CPU
                    grad_w_PD.add_(grad_CP.t() @ h_CD)  # in mm_dtype, summed over chunks in fp32
        ctx.save_for_backward(grad_h_ND, grad_w_PD[:V])
        ctx.dtypes = hidden_ND.dtype, weight_VD.dtype
        ctx.mark_non_differentiable(ce_N)
        return value, ce_N

    @staticmethod
    def backward(ctx: Any, grad_value: torch.Tensor, _grad_ce: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h_ND, grad_w_VD = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        return (grad_h_ND * grad_value).to(h_dtype), (grad_w_VD * grad_value).to(w_dtype), None, None, None


def fused_lm_loss(
    hidden_BTD: torch.Tensor,
    weight_VD: torch.Tensor,
    softcap: float | None,
    batch: Batch,
    step_tokens: int | None = None,
    options: LossOptions = PLAIN,
) -> Loss:
    """lm_loss of the logits hidden_BTD @ weight_VD.T (soft-capped), options.chunk positions at a time
    (each chunk through torch.compile with options.compiled).

    The model calls it in place of its output layer (Transformer.forward's `head`), with its
    final normed hidden states, its output matrix and its logit soft-cap.
    """
    B, T, _ = hidden_BTD.shape
    mask_BT = batch.loss_mask_BT.float()
    tokens_B = batch.loss_mask_BT.sum(dim=1)
    kept = step_tokens if step_tokens else tokens_B.sum().clamp(min=1)
    ce_weight_BT = mask_BT / kept
    if options.late_position_weight:
        ce_weight_BT = ce_weight_BT * window_weights(batch, options.late_position_weight, mask_BT.device)
    z_weight_BT = mask_BT * (options.z_loss / kept)
    at = HeadTargets(batch.targets_BT.flatten(), ce_weight_BT.flatten(), z_weight_BT.flatten())
    value, ce_N = _ChunkedHeadLoss.apply(hidden_BTD.flatten(0, 1), weight_VD, at, softcap, options)
    kept_BT = ce_N.view(B, T) * mask_BT
    return Loss(value, kept_BT.mean(dim=1) * (T / tokens_B.clamp(min=1)), tokens_B)
