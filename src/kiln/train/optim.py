"""AdamW with weight decay on matrices only.

Norm gains (1-D) are not decayed: pulling them toward 0 only fights the normalization. The
embedding is a matrix and is decayed, as in Llama and nanoGPT. Fused kernels are used on CUDA.
"""

from __future__ import annotations

import torch
from torch import nn

from kiln.train.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # named_parameters() yields a tied weight once, so the embedding is not stepped twice.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, fused=fused)
