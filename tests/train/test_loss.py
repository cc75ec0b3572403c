"""kiln.train.loss: lm_loss's masked mean by hand and its bit-identity with the plain mean for CLM;
fused_lm_loss against lm_loss on the output layer's logits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.model.batch import Batch
from kiln.train.loss import LossOptions, fused_lm_loss, lm_loss


def batch(targets: list[list[int]], mask: list[list[bool]] | None = None) -> Batch:
    targets_BT = torch.tensor(targets)
    B, T = targets_BT.shape
    mask_BT = torch.ones(B, T, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return Batch(torch.zeros(B, T, dtype=torch.long), targets_BT, mask_BT, None, torch.zeros(B, dtype=torch.long))


def test_by_hand() -> None:
    # Logits over 4 tokens favour token 0 at every position: p(0) = e^2 / (e^2 + 3), p(other) = 1 / (e^2 + 3).
    logits = torch.tensor([2.0, 0.0, 0.0, 0.0]).expand(2, 3, 4)
    z = math.log(math.exp(2) + 3)
    hit, miss = z - 2, z  # nats of target 0 and of any other target
    # Row 0 keeps targets 0, 1 (drops 3); row 1 keeps only target 0.
    loss = lm_loss(logits, batch([[0, 1, 3], [0, 2, 2]], [[True, True, False], [True, False, False]]))
    assert loss.value.item() == pytest.approx((hit + miss + hit) / 3)
    assert loss.row_mean_B.tolist() == pytest.approx([(hit + miss) / 2, hit])
    assert loss.row_tokens_B.tolist() == [2, 1]


def test_masked_positions_get_no_gradient() -> None:
    logits = torch.randn(2, 5, 7, requires_grad=True, generator=torch.Generator().manual_seed(0))
    mask = [[True, False, True, False, True], [False] * 5]
    lm_loss(logits, batch([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]], mask)).value.backward()
    assert logits.grad is not None
    kept = torch.tensor(mask)
    assert (logits.grad[~kept] == 0).all() and (logits.grad[kept].abs().sum(-1) > 0).all()


def test_a_row_with_nothing_kept_counts_zero_and_nothing_kept_at_all_is_finite() -> None:
    loss = lm_loss(torch.zeros(2, 2, 3), batch([[0, 1], [2, 0]], [[True, True], [False, False]]))
    assert loss.row_mean_B.tolist() == pytest.approx([math.log(3), 0.0]) and loss.row_tokens_B.tolist() == [2, 0]
    none_kept = lm_loss(torch.zeros(1, 2, 3), batch([[0, 1]], [[False, False]]))
    assert none_kept.value.item() == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_every_position_kept_is_bit_identical_to_the_plain_mean(seed: int) -> None:
    # What kiln's loop computed before loss masks: loss_BT.mean() and loss_BT.mean(dim=1).
    gen = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(16, 64, 257, generator=gen)).requires_grad_()
    targets = torch.randint(0, 257, (16, 64), generator=gen)
    loss_BT = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    reference = loss_BT.mean()
    (reference_grad,) = torch.autograd.grad(reference, logits)
    ours = lm_loss(logits, batch(targets.tolist()))
    (ours_grad,) = torch.autograd.grad(ours.value, logits)
    assert torch.equal(ours.value, reference) and torch.equal(ours_grad, reference_grad)
    assert torch.equal(ours.row_mean_B, loss_BT.detach().mean(dim=1))
    # On the CPU the sum over the count matches too (mean is sum-then-divide here); the loss
    # keeps the mean-times-factor form because CUDA's mean multiplies by 1/n instead.
    assert torch.equal(loss_BT.sum() / loss_BT.numel(), reference)


def test_z_loss_adds_the_squared_log_normaliser_of_kept_positions() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))
    b = batch([[0, 1, 2], [3, 4, 0]], [[True, False, True], [True, True, True]])
    plain, with_z = lm_loss(logits, b), lm_loss(logits, b, z_loss=1e-2)
    lse = torch.logsumexp(logits, dim=-1)[b.loss_mask_BT]
    assert with_z.value.item() == pytest.approx(plain.value.item() + 1e-2 * lse.square().mean().item(), rel=1e-6)
    assert torch.equal(with_z.row_mean_B, plain.row_mean_B)  # logged cross-entropy is the plain one


def test_micro_batches_divide_by_the_kept_positions_of_the_whole_step() -> None:
    # Masks keep 1 position of one micro-batch and 5 of the other: the step's value is the mean
    # over all 6 kept tokens, not the mean of two per-batch means.
    logits = torch.randn(2, 1, 3, 7, generator=torch.Generator().manual_seed(2))
    targets = [[[1, 2, 3]], [[4, 5, 6]]]
    masks = [[[True, False, False]], [[True, True, True]]]
    one = batch(targets[0], masks[0])
    two = batch(targets[1], masks[1])
    step = lm_loss(logits[0], one, step_tokens=4).value + lm_loss(logits[1], two, step_tokens=4).value
    all_tokens = F.cross_entropy(torch.cat([logits[0, 0, :1], logits[1, 0]]), torch.tensor([1, 4, 5, 6]))
    assert step.item() == pytest.approx(all_tokens.item(), rel=1e-6)


def test_late_position_weight_counts_later_positions_more_at_mean_one() -> None:
    # T = 3, w = 1: raw weights 1, 1.5, 2 -> divided by their mean 1.5: 2/3, 1, 4/3.
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(3))
    b = batch([[0, 1, 2]])
    per_position = F.cross_entropy(logits[0], torch.tensor([0, 1, 2]), reduction="none")
    weighted = lm_loss(logits, b, late_position_weight=1.0)
    expected = (per_position * torch.tensor([2 / 3, 1.0, 4 / 3])).mean()
    assert weighted.value.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.equal(weighted.row_mean_B, lm_loss(logits, b).row_mean_B)  # the logged loss stays unweighted


def head_losses(
    B: int,
    T: int,
    V: int,
    seed: int,
    chunk: int,
    z_loss: float,
    late: float,
    softcap: float | None,
    step_tokens: int | None,
    amp: torch.dtype | None = None,
    device: str = "cpu",
    D: int = 8,
    compiled: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """[value, row means, row tokens, grad of the hidden states, grad of the output matrix] of lm_loss
    on the output layer's logits and of fused_lm_loss, from the same random hidden states, matrix and mask."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=gen).to(device)
    weight = torch.randn(V, D, generator=gen).to(device)
    targets = torch.randint(0, V, (B, T), generator=gen).tolist()
    mask = (torch.rand(B, T, generator=gen) < 0.7).tolist()
    b = batch(targets, mask).to(torch.device(device))
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            if fused:
                loss = fused_lm_loss(h, w, softcap, b, step_tokens, LossOptions(z_loss, late, chunk, compiled))
            else:
                logits = (h @ w.t()).float()  # the model's output layer: the autocast dtype, then fp32
                if softcap is not None:
                    logits = softcap * torch.tanh(logits / softcap)
        if not fused:
            loss = lm_loss(logits, b, step_tokens, z_loss, late)
        loss.value.backward()
        results.append([loss.value.detach(), loss.row_mean_B, loss.row_tokens_B.float(), h.grad, w.grad])
    return results[0], results[1]


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 9),
    V=st.integers(2, 40),
    seed=st.integers(0, 2**16),
    chunk=st.integers(1, 30),
    z_loss=st.sampled_from([0.0, 1e-2]),
    late=st.sampled_from([0.0, 0.5]),
    softcap=st.sampled_from([None, 3.0]),
    extra_tokens=st.sampled_from([None, 0, 7]),
)
def test_the_fused_loss_has_the_plain_losss_value_row_means_and_gradients(
    B: int,
    T: int,
    V: int,
    seed: int,
    chunk: int,
    z_loss: float,
    late: float,
    softcap: float | None,
    extra_tokens: int | None,
) -> None:
    # extra_tokens: None divides by this batch's kept positions; otherwise by a step's (this batch's + extra).
    step_tokens = None if extra_tokens is None else B * T + extra_tokens
    plain, fused = head_losses(B, T, V, seed, chunk, z_loss, late, softcap, step_tokens)
    for name, a, b in zip(
        ["value", "row means", "row tokens", "hidden grad", "matrix grad"], plain, fused, strict=True
    ):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{name}: {a} vs {b}"


def test_the_fused_loss_under_bf16_autocast_rounds_as_the_output_layer_does() -> None:
    plain, fused = head_losses(
        4, 64, 300, seed=0, chunk=50, z_loss=0.0, late=0.0, softcap=None, step_tokens=None, amp=torch.bfloat16
    )
    value, _, _, grad_h, grad_w = fused
    assert grad_h.dtype == torch.float32 and grad_w.dtype == torch.float32  # gradients in the tensors' own dtype
    # Same bf16 logits, so the value agrees to fp32 summation order; the gradients' bf16 matmuls to bf16's precision.
    assert value.item() == pytest.approx(plain[0].item(), rel=1e-6)
    for a, b in zip(plain[3:], fused[3:], strict=True):
        assert (a - b).abs().max() <= 1e-2 * a.abs().max()


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_the_compiled_fused_loss_has_the_plain_losss_value_row_means_and_gradients(softcap: float | None) -> None:
    # Chunks of 7 positions over 40: a full chunk and a shorter last one; 100 classes pad to 128.
    plain, fused = head_losses(
        4, 10, 100, seed=3, chunk=7, z_loss=1e-2, late=0.5, softcap=softcap, step_tokens=None, compiled=True
    )
    for name, a, b in zip(
        ["value", "row means", "row tokens", "hidden grad", "matrix grad"], plain, fused, strict=True
    ):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{name}: {a} vs {b}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled", [False, True])
def test_the_fused_loss_on_cuda_in_bf16_agrees_with_the_plain_loss(compiled: bool) -> None:
    # The trainer's GPU chunk (2^28 logits: 5,341 positions of a 50K vocabulary) and a smaller one.
    for chunk in (2**28 // 50257, 1000):
        plain, fused = head_losses(
            4,
            1024,
            50257,
            seed=1,
            chunk=chunk,
            z_loss=1e-4,
            late=0.0,
            softcap=None,
            step_tokens=None,
            amp=torch.bfloat16,
            device="cuda",
            D=256,
            compiled=compiled,
        )
        # cuBLAS may sum a chunk's bf16 logits in another order than the whole matrix's.
        assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-4)
        assert torch.allclose(fused[1], plain[1], rtol=1e-3)
        for a, b in zip(plain[3:], fused[3:], strict=True):
            assert (a - b).abs().max() <= 1e-2 * a.abs().max()
