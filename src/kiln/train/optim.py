"""The `train.optim` section and its optimizer: AdamW with weight decay on matrices only.

Norm gains (1-D) are not decayed: pulling them toward 0 only fights the normalization. The
embedding is a matrix and is decayed, as in Llama and nanoGPT. Fused kernels are used on CUDA.
Not handled here: the learning-rate schedule (kiln.train.schedule), other optimizers (Muon).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from kiln.core.config import Section


class OptimConfig(Section):
    lr: float = Field(default=3e-3, gt=0, le=1, description="Peak learning rate after warmup.")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW decoupled weight decay on matrices (not on norms).")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW second-moment decay.")
    grad_clip: float | None = Field(default=1.0, gt=0, description="Global gradient-norm clip; None disables it.")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    # named_parameters() yields a tied weight once, so the embedding is not stepped twice.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, fused=fused)
