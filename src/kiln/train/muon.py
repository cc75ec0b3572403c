"""Muon: momentum orthogonalised by Newton-Schulz for the hidden matrices, AdamW for the rest.

For each 2-D weight inside the transformer blocks, the (Nesterov) momentum of its gradient is
replaced by the nearest semi-orthogonal matrix, approximated with five iterations of a quintic
Newton-Schulz map, X <- a X + (b A + c A^2) X with A = X X^T and (a, b, c) = (3.4445, -4.7750,
2.0315), the coefficients of the modded-nanogpt speedrun, which push every singular value into
about [0.7, 1.2] in five steps. The update is scaled by sqrt(max(1, rows / cols)) so tall and wide
matrices move alike. Embeddings, the output projection and norm gains keep AdamW (one optimizer,
two kinds of parameter group, so the loop, the schedule and checkpoints see one object).
Shape legend: R rows, C columns of a weight.
Not handled here: sharded matrices (FSDP2 holds shards, Newton-Schulz needs whole matrices; the
trainer refuses the combination).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalise(g_RC: torch.Tensor, steps: int) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with g's singular vectors (Newton-Schulz, `steps` iterations)."""
    a, b, c = NS_COEFFICIENTS
    # bf16 on CUDA is what the speedrun uses and is accurate enough for an update direction;
    # the CPU has no fast bf16 matmul, so it iterates in fp32.
    x = g_RC.to(torch.bfloat16 if g_RC.is_cuda else torch.float32)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T  # iterate on the wide side: A is (min, min)
    x = x / (x.norm() + 1e-7)  # spectral norm <= Frobenius norm <= 1: inside the map's basin
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return (x.T if tall else x).to(g_RC.dtype)


class Muon(torch.optim.Optimizer):
    """Groups with `muon=True` take orthogonalised momentum; the others AdamW (betas, eps, weight decay)."""

    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "muon": False,
        }
        super().__init__(list(groups), defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "Muon takes no closure"
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                p.mul_(1 - lr * wd)  # decoupled weight decay, as AdamW
                if group["muon"]:
                    buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    direction = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                    update = orthogonalise(direction, group["ns_steps"])
                    p.add_(update, alpha=-lr * math.sqrt(max(1.0, p.size(0) / p.size(1))))
                    continue
                beta1, beta2 = group["betas"]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** state["step"])).sqrt_().add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** state["step"]))
