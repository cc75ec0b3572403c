"""Trainer hooks: what runs around the loop without living in it.

The loop calls `on_start` once before step 1, `after_step` after every optimizer step and
`on_end` once after the last; monitoring and checkpointing are hooks, and later ones (loss-
spike rollback, profiling) join the same list. Hooks see the live model, optimizer and
sampler through StepState; they must not change the math of a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from kiln.mix.sampler import Sampler
from kiln.model.transformer import Transformer
from kiln.train.checkpoint import save_checkpoint


@dataclass
class StepState:
    step: int
    model: Transformer
    optimizer: torch.optim.Optimizer
    sampler: Sampler
    loss: float = float("nan")
    loss_by_source: dict[str, float] = field(default_factory=dict)
    lr: float = 0.0
    grad_norm: float = 0.0
    tokens: int = 0  # tokens in this step


class Hook(Protocol):
    def on_start(self, state: StepState) -> None: ...

    def after_step(self, state: StepState) -> None: ...

    def on_end(self, state: StepState) -> None: ...


class Checkpointer:
    """Saves `<folder>` every `every` steps (latest only) and always after the last step."""

    def __init__(self, folder: Path, every: int | None):
        self.folder, self.every = folder, every
        self.paths: list[Path] = []

    def on_start(self, state: StepState) -> None:
        pass

    def after_step(self, state: StepState) -> None:
        if self.every and state.step % self.every == 0:
            self.save(state)

    def on_end(self, state: StepState) -> None:
        self.save(state)

    def save(self, state: StepState) -> None:
        train_state = {
            "step": state.step,
            "optimizer": state.optimizer.state_dict(),
            "sampler": state.sampler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        self.paths = save_checkpoint(self.folder, state.model, train_state)
