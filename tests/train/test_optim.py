"""kiln.train.optim and kiln.train.muon: parameter groups, Newton-Schulz by measurement, and Muon
against AdamW on a small regression a hand can check."""

from __future__ import annotations

import pytest
import torch

from kiln.model.config import ModelConfig
from kiln.model.init import build_model
from kiln.train.config import OptimConfig
from kiln.train.muon import Muon, orthogonalise
from kiln.train.optim import build_optimizer, parameter_groups

MODEL = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


def test_groups_split_block_matrices_embeddings_and_norms() -> None:
    model = build_model(MODEL, seed=0, device="cpu")
    groups = parameter_groups(model, OptimConfig(weight_decay=0.1, decay_embeddings=False))
    blocks, embeddings, norms = groups
    assert len(blocks["params"]) == 2 * 7  # wq wk wv wo, w_gate w_up w_down per block
    assert [p.shape for p in embeddings["params"]] == [(97, 32), (97, 32)]  # untied: embedding and output
    assert all(p.dim() == 1 for p in norms["params"])
    assert (blocks["weight_decay"], embeddings["weight_decay"], norms["weight_decay"]) == (0.1, 0.0, 0.0)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    muon = parameter_groups(model, OptimConfig(name="muon", lr=1e-3, muon_lr=0.02))
    assert muon[0]["muon"] and muon[0]["lr_scale"] == pytest.approx(20.0) and not muon[1]["muon"]


@pytest.mark.parametrize("shape", [(32, 96), (96, 32)])
def test_newton_schulz_pushes_every_singular_value_near_one(shape: tuple[int, int]) -> None:
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))  # singular values 4.2 to 15
    s = torch.linalg.svdvals(orthogonalise(g, steps=5))
    # The quintic map's band after 5 steps: about [0.7, 1.2] (measured 0.68 to 1.06 here).
    assert s.min() > 0.6 and s.max() < 1.25
    U, _, Vh = torch.linalg.svd(g, full_matrices=False)
    assert torch.nn.functional.cosine_similarity((U @ Vh).flatten(), orthogonalise(g, 5).flatten(), dim=0) > 0.95


def test_muon_without_muon_groups_is_adamw() -> None:
    torch.manual_seed(0)
    a = torch.randn(8, 4, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ours = Muon([{"params": [a], "muon": False, "weight_decay": 0.1}], lr=1e-2)
    ref = torch.optim.AdamW([b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        g = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.allclose(a, b, atol=1e-6)


def test_a_muon_step_is_the_orthogonalised_nesterov_momentum() -> None:
    g = torch.randn(48, 16, generator=torch.Generator().manual_seed(3))
    w = torch.zeros(48, 16, requires_grad=True)
    w.grad = g.clone()
    Muon([{"params": [w], "muon": True}], lr=0.1, momentum=0.9).step()
    # First step: buffer = 0.1 g; Nesterov direction = g + 0.9 (0.1 g - g) = 0.19 g; a tall matrix
    # moves sqrt(48 / 16) times further.
    expected = -0.1 * (48 / 16) ** 0.5 * orthogonalise(0.19 * g, 5)
    assert torch.allclose(w.detach(), expected, atol=1e-6)


def test_muon_fits_a_linear_map() -> None:
    target = torch.randn(32, 32, generator=torch.Generator().manual_seed(1))
    x = torch.randn(256, 32, generator=torch.Generator().manual_seed(2))
    w = torch.zeros(32, 32, requires_grad=True)
    opt = Muon([{"params": [w], "muon": True}], lr=0.2)
    losses = []
    for _ in range(60):
        loss = ((x @ w - x @ target) ** 2).mean()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.1 * losses[0]  # measured 0.045 of the start


def test_build_optimizer_picks_the_kind() -> None:
    model = build_model(MODEL, seed=0, device="cpu")
    assert isinstance(build_optimizer(model, OptimConfig()), torch.optim.AdamW)
    assert isinstance(build_optimizer(model, OptimConfig(name="muon")), Muon)
