"""What the trainer takes from a data stream: `Rows` of raw tokens, turned into `Batch` records.

The data side (kiln.mix's sampler, a `RowSource`) draws windows of token ids from named sources;
the objective (kiln.train.objectives) turns each window into one training row: the ids the model
reads, the ids it should predict at each position, which positions count in the loss, and the
attention rule (causal, full, or a bidirectional prefix), optionally restricted to each packed
document with RoPE positions restarting there. A `BatchSource` yields those Batches; the loop
never slices or shifts ids itself. The trainer knows only these protocols, so a stage never
imports another.
Shape legend: B rows, T positions.
Not handled here: how windows are drawn (kiln.mix), how objectives build rows (kiln.train.objectives).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from kiln.model.attention import AttentionRule, Kernel


@dataclass(frozen=True, eq=False)  # eq=False: array fields have no single truth value
class Rows:
    """Windows of token ids as drawn, one per row, with where they came from."""

    tokens: list[np.ndarray]  # int64 ids of each window read (this rank's), of the lengths asked for
    source_B: np.ndarray  # int64 index into the RowSource's `sources`
    index_B: np.ndarray  # int64 position of each row in the global stream (0, 1, 2, ... since step 1)
    all_sources: np.ndarray  # int64 source of every row drawn in the call, every rank's


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class Batch:
    input_ids_BT: torch.Tensor  # int64 token ids the model reads
    targets_BT: torch.Tensor  # int64 token ids it should predict at each position
    loss_mask_BT: torch.Tensor  # bool: True where the target counts in the loss
    doc_ids_BT: torch.Tensor | None  # int64 document index per position; None: attend across documents
    source_B: torch.Tensor  # int64 index into the BatchSource's `sources`
    attention: Literal["causal", "full", "prefix"] = "causal"
    prefix_BT: torch.Tensor | None = None  # bool, with attention="prefix": positions every query of the document sees
    positions_BT: torch.Tensor | None = None  # int64 RoPE position per token; None means 0..T-1 in every row
    index_B: torch.Tensor | None = (
        None  # int64 place of each row in the global stream (Rows.index_B), for logs; stays on the host
    )

    def rule(self, kernel: Kernel = "sdpa") -> AttentionRule:
        """The attention rule the model applies to this batch, computed by `kernel` where it needs a mask."""
        return AttentionRule(self.attention, prefix_BT=self.prefix_BT, doc_ids_BT=self.doc_ids_BT, kernel=kernel)

    def window_positions(self) -> tuple[torch.Tensor | None, int]:
        """(each column's position in its window, None for 0..T-1; the window's length). A batch
        holding some of each window's positions (context parallelism) says which."""
        return None, self.targets_BT.shape[1]

    def to(self, device: torch.device) -> Batch:
        """The same batch on `device` (copies start without waiting where the device allows)."""

        def move(t: torch.Tensor | None) -> Any:
            return None if t is None else t.to(device, non_blocking=True)  # on the same device: the tensor itself

        return Batch(
            move(self.input_ids_BT),
            move(self.targets_BT),
            move(self.loss_mask_BT),
            move(self.doc_ids_BT),
            move(self.source_B),
            self.attention,
            move(self.prefix_BT),
            move(self.positions_BT),
            self.index_B,
        )


class Mixture(Protocol):
    """What a stream drawn from weighted sources tells the trainer, and what it takes back."""

    @property
    def sources(self) -> Sequence[str]: ...

    def weights_at(self, progress: float) -> np.ndarray:
        """Intended share of each source (in `sources` order) at a training progress in [0, 1]."""
        ...

    def observe(self, step: int, progress: float, val_loss: Mapping[str, float]) -> dict[str, Any] | None:
        """Per-source validation losses for an adaptive mixture; a log record when it reweighted."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RowSource(Mixture, Protocol):
    """A resumable global stream of token windows; each data-parallel rank reads its slice."""

    @property
    def rows_drawn(self) -> int:
        """Rows drawn so far: the global index the next row gets."""
        ...

    @property
    def adapt_every(self) -> int | None:
        """Steps between reweightings of an adaptive mixture; None when the weights are fixed."""
        ...

    @property
    def report_windows(self) -> int:
        """Windows of steps to report the realized mixture over."""
        ...

    def next_rows(self, lengths: Sequence[int], progress: float, keep: slice) -> Rows: ...

    def breakpoints(self) -> list[float]:
        """Progress points where the mixture changes course (schedule breakpoints, curriculum end)."""
        ...

    def plan(self, step_tokens: Sequence[int], step_progress: Sequence[float], check: bool = False) -> dict[str, Any]:
        """Planned tokens and epochs per source over the given steps; check: act on over-repeated sources."""
        ...

    @property
    def languages(self) -> Mapping[str, Mapping[str, int]] | None:
        """Train tokens of each of this run's sources per language (the plan's language table); None if unknown."""
        ...


class BatchSource(Mixture, Protocol):
    """A resumable stream of training batches drawn from named sources."""

    def next_batch(self, rows: int, seq_len: int, progress: float) -> Batch:
        """This rank's next `rows` rows of seq_len positions, drawn at `progress`."""
        ...

    def tokens_by_source(self) -> dict[str, int]:
        """Tokens read so far from each source's stream, all ranks (the train manifest's tokens_by_source)."""
        ...
