"""The `train` recipe section: optimizer, schedule, batch geometry, precision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kiln.core.config import Section


class TrainConfig(Section):
    # None of these changes the trained weights.
    NOT_HASHED = frozenset({"threads", "checkpoint_every", "eval_at_start"})
    steps: int = Field(default=300, ge=1, description="Optimizer steps.")
    seq_len: int = Field(default=256, ge=2, description="Tokens per training sequence; at most model.max_seq_len.")
    micro_batch_size: int = Field(default=16, ge=1, description="Sequences per forward/backward pass.")
    grad_accum_steps: int = Field(default=1, ge=1, description="Micro-batches accumulated per optimizer step.")
    lr: float = Field(default=3e-3, gt=0, le=1, description="Peak learning rate after warmup.")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="Cosine decay floor as a fraction of lr.")
    warmup_steps: int = Field(default=30, ge=0, description="Linear warmup steps from 0 to lr.")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW decoupled weight decay on matrices (not on norms).")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW second-moment decay.")
    grad_clip: float | None = Field(default=1.0, gt=0, description="Global gradient-norm clip; None disables it.")
    seed: int = Field(default=0, description="Seed for initialization.")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto picks cuda when available.")
    precision: Literal["auto", "fp32", "bf16"] = Field(default="auto", description="auto: bf16 autocast on cuda, fp32 on cpu.")
    threads: int | None = Field(default=None, ge=1, description="CPU threads for torch; None leaves torch's default.")
    checkpoint_every: int | None = Field(default=None, ge=1, description="Also save the checkpoint every this many steps (latest kept); None saves only after the last step.")
    eval_at_start: bool = Field(default=True, description="Evaluate the untrained model on validation data before step 1 (the 'before' numbers).")

    @model_validator(mode="after")
    def _warmup(self) -> TrainConfig:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch_size * self.grad_accum_steps
