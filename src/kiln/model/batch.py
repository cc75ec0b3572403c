"""What the trainer takes from a data stream: `Batch` records from a `BatchSource`.

A Batch is one micro-batch, already split into model inputs and next-token targets (the data
side does the shift, the loop never slices): the loss counts the positions where `loss_mask_BT`
is True, and `doc_ids_BT`, when given, keeps attention inside each document. `source_B` says
which source each row came from, for the per-source loss. kiln.mix's Sampler is the source the
pipeline wires in; the trainer knows only this protocol, so a stage never imports another.
Shape legend: B rows, T positions.
Not handled here: how rows are drawn (kiln.mix), objectives other than next-token prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True, eq=False)  # eq=False: tensor fields have no single truth value
class Batch:
    input_ids_BT: torch.Tensor  # int64 token ids the model reads
    targets_BT: torch.Tensor  # int64 token ids it should predict at each position
    loss_mask_BT: torch.Tensor  # bool: True where the target counts in the loss
    doc_ids_BT: torch.Tensor | None  # int64 document index per position; None: attend across documents
    source_B: torch.Tensor  # int64 index into the BatchSource's `sources`

    def to(self, device: torch.device) -> Batch:
        """The same batch on `device` (copies start without waiting where the device allows)."""
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)  # on the same device: the tensor itself

        return Batch(move(self.input_ids_BT), move(self.targets_BT), move(self.loss_mask_BT), None if self.doc_ids_BT is None else move(self.doc_ids_BT), move(self.source_B))


class BatchSource(Protocol):
    """A resumable stream of batches drawn from named sources."""

    @property
    def sources(self) -> Sequence[str]: ...

    def next_batch(self, batch_size: int) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def tokens_by_source(self) -> dict[str, int]:
        """Tokens drawn so far per source (the train manifest's tokens_by_source)."""
        ...
