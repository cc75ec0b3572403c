"""What kiln.train.distributed applies to the model from outside, on one process: activation
checkpointing (every mode gives the same loss and gradients as none) and torch.compile (the same
numbers within float tolerance, parameter names unchanged)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.train.distributed import apply_activation_checkpointing, apply_compile

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=32)


def loss_and_grads(mode: str, every: int = 1, compiled: bool = False) -> tuple[float, dict[str, torch.Tensor]]:
    model = build_model(CFG, seed=0, device="cpu")
    apply_activation_checkpointing(model, mode, every)
    if compiled:
        apply_compile(model)
    idx = torch.randint(0, 97, (4, 32), generator=torch.Generator().manual_seed(1))
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("mode", "every"), [("full", 1), ("full", 2), ("selective", 1)])
def test_activation_checkpointing_changes_memory_not_numbers(mode: str, every: int) -> None:
    ref_loss, ref_grads = loss_and_grads("none")
    loss, grads = loss_and_grads(mode, every)
    assert loss == ref_loss
    assert grads.keys() == ref_grads.keys()  # parameter names unchanged: checkpoints stay compatible
    assert all(torch.equal(grads[n], ref_grads[n]) for n in grads)


def test_checkpointed_blocks_recompute_in_the_backward_pass() -> None:
    model = build_model(CFG, seed=0, device="cpu")
    calls = []
    mlp_forward = model.blocks["0"].mlp.forward

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return mlp_forward(x)

    model.blocks["0"].mlp.forward = counted
    apply_activation_checkpointing(model, "full", 1)
    loss = model(torch.zeros(1, 8, dtype=torch.long)).sum()
    assert len(calls) == 1
    loss.backward()
    assert len(calls) == 2  # recomputed for the backward pass


@pytest.mark.slow
def test_compiled_blocks_match_eager() -> None:
    # torch.compile is not bitwise equal to eager (fused kernels round differently).
    ref_loss, ref_grads = loss_and_grads("none")
    loss, grads = loss_and_grads("none", compiled=True)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref_grads.keys()
    assert all(torch.allclose(grads[n], ref_grads[n], rtol=1e-3, atol=1e-6) for n in grads)
