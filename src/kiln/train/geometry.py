"""The shape of each optimizer step: sequence length, rows, micro-batches, RoPE base, progress.

Tokens per step stay at train.global_batch_tokens whatever the sequence length (a longer phase
takes fewer rows), except during batch-size warmup, which ramps tokens per step linearly from
a share of it over the first steps (rounded down to whole rows on every rank). A micro-batch
holds micro_batch_size * seq_len tokens per rank in every phase, so memory per micro-step is
the same in each. Progress, what every schedule is a function of, is (step - 1) / steps: 0 at
the first step.
Not handled here: what rows hold (kiln.train.objectives, kiln.mix).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from kiln.core.config import Section

if TYPE_CHECKING:  # the train section imports this module
    from kiln.train.config import TrainConfig


class SeqLenPhase(Section):
    start: float = Field(
        ge=0, lt=1, description="Progress (share of the steps) this phase starts at; the first phase starts at 0."
    )
    seq_len: int = Field(
        ge=2,
        description="Tokens per row in this phase; at most train.seq_len, dividing micro_batch_size * train.seq_len.",
    )
    rope_theta: float | None = Field(
        default=None,
        gt=0,
        description=(
            "RoPE base from this phase on (long-context recipes raise it with the length); None keeps the current one."
        ),
    )


class BatchWarmupConfig(Section):
    start_fraction: float = Field(default=0.25, gt=0, le=1, description="Share of global_batch_tokens taken at step 1.")
    steps: int = Field(
        default=100, ge=1, description="Steps over which tokens per step grow linearly to global_batch_tokens."
    )


@dataclass(frozen=True)
class StepGeometry:
    progress: float  # (step - 1) / steps
    seq_len: int
    rows_per_rank: int  # rows each rank trains on this step
    micro_rows: int  # rows per micro-batch (the last one may hold fewer)
    rope_theta: float | None  # the RoPE base in force; None: the model's own

    @property
    def micro_batches(self) -> list[int]:
        """Rows of each micro-batch of this rank's step."""
        full, rest = divmod(self.rows_per_rank, self.micro_rows)
        return [self.micro_rows] * full + ([rest] if rest else [])

    def tokens(self, world: int) -> int:
        return self.rows_per_rank * world * self.seq_len


def step_geometry(step: int, cfg: TrainConfig, world: int) -> StepGeometry:
    """Step `step` of the train section `cfg` on `world` data ranks (TrainConfig.geometry: its own;
    a resumed run's earlier stretches were drawn by other numbers of ranks, kiln.train.state_files)."""
    progress = (step - 1) / cfg.steps
    length, theta = cfg.seq_len, None
    for phase in cfg.seq_len_schedule or []:
        if progress >= phase.start:
            length = phase.seq_len
            theta = phase.rope_theta or theta
    tokens, warmup = cfg.tokens_per_step, cfg.batch_warmup
    if warmup is not None and step <= warmup.steps:
        share = warmup.start_fraction + (1 - warmup.start_fraction) * (step - 1) / warmup.steps
        tokens = int(cfg.tokens_per_step * share)
    rows_per_rank = max(1, tokens // (length * world))
    return StepGeometry(progress, length, rows_per_rank, cfg.micro_batch_size * cfg.seq_len // length, theta)
