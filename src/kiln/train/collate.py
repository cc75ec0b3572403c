"""The train stage's BatchSource: windows from a RowSource, made into rows by the objective, stacked.

For each row of a micro-batch the collator seeds a generator with (train.seed, the row's global
index), picks the row's objective (one, or one of a weighted mapping), asks the row source for a
window of the length that objective takes at the step's sequence length, and builds the row
(kiln.train.objectives). Every data-parallel rank computes the lengths of the whole global
micro-batch (rank-major: rank r's rows are the r-th slice) and reads and builds only its own. Rows of
one batch may attend differently (UL2 mixing): all causal stays causal (SDPA's fast path without
document masking), all full stays full, and any mix becomes a per-row prefix rule (a causal row
has no prefix, a full row is all prefix). With document masking, document ids go with the batch
and RoPE positions restart at each document.
Tokens per source count the tokens each row of every rank read from its source's stream (T + 1
for clm, fim and prefix_lm, T for mlm, the window L for span corruption): what the epochs are
made of, exactly, never as rows times length.
Not handled here: drawing windows (kiln.mix), the step's shape (kiln.train.geometry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kiln.model.batch import Batch, RowSource
from kiln.train import objectives as obj
from kiln.train.config import TrainConfig
from kiln.train.objectives import Objective, Row, TokenIds

# subtle: the sampler seeds row i's source choice with (mix.seed, its stream id, i); a distinct id
# here keeps the two draws independent when train.seed equals mix.seed (both default to 0).
OBJECTIVE_STREAM = 2


@dataclass(frozen=True)
class ObjectiveMix:
    """The resolved objective settings of a train section."""

    weights: dict[str, float]  # objective -> probability per row (one entry: always that one)
    masking: dict[str, bool]  # objective -> document masking on
    mlm: obj.MLMConfig
    prefix_lm: obj.PrefixLMConfig
    span: obj.SpanCorruptionConfig


def restart_positions(doc_ids_T: np.ndarray) -> np.ndarray:
    """Each position's offset from the start of its document: 0, 1, 2, ... restarting at every new id."""
    idx = np.arange(len(doc_ids_T))
    starts = np.where(np.diff(doc_ids_T, prepend=doc_ids_T[0] - 1) != 0, idx, 0)
    return idx - np.maximum.accumulate(starts)


class Collator:
    def __init__(self, rows: RowSource, mix: ObjectiveMix, ids: TokenIds, seed: int, rank: int = 0, world: int = 1):
        self.rows, self.mix, self.ids, self.seed, self.rank, self.world = rows, mix, ids, seed, rank, world
        self.names = list(mix.weights)
        self.probs = np.array([mix.weights[n] for n in self.names], dtype=np.float64)
        self.probs /= self.probs.sum()
        self.any_masking = any(mix.masking[n] for n in self.names)
        self.seen = np.zeros(len(rows.sources), dtype=np.int64)

    @property
    def sources(self) -> Sequence[str]:
        return self.rows.sources

    def weights_at(self, progress: float) -> np.ndarray:
        return self.rows.weights_at(progress)

    def observe(self, step: int, progress: float, val_loss: Mapping[str, float]) -> dict[str, Any] | None:
        return self.rows.observe(step, progress, val_loss)

    def build_row(self, objective: Objective, window: np.ndarray, seq_len: int, rng: np.random.Generator) -> Row:
        masking = self.mix.masking[objective]
        if objective in ("clm", "fim"):
            return obj.clm(window, self.ids, masking)
        if objective == "mlm":
            return obj.mlm(window, self.ids, self.mix.mlm, masking, rng)
        if objective == "prefix_lm":
            return obj.prefix_lm(window, self.ids, self.mix.prefix_lm, masking, rng)
        return obj.span_corruption(window, self.ids, self.mix.span, seq_len, rng)

    def next_batch(self, rows: int, seq_len: int, progress: float) -> Batch:
        first = self.rows.rows_drawn
        # One generator per row, seeded by its place in the global stream: rows do not depend on
        # how they are grouped into micro-batches or ranks.
        rngs = [np.random.default_rng([self.seed, OBJECTIVE_STREAM, first + r]) for r in range(rows * self.world)]
        chosen: list[Objective] = [
            self.names[int(rng.choice(len(self.names), p=self.probs))] if len(self.names) > 1 else self.names[0]
            for rng in rngs
        ]  # type: ignore[misc]
        lengths = [obj.window_length(o, seq_len, self.mix.span) for o in chosen]
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        drawn = self.rows.next_rows(lengths, progress, mine)
        assert drawn.index_B.tolist() == list(range(first, first + rows * self.world))[mine], (
            "the row source numbered its rows differently"
        )
        built = [
            self.build_row(o, w, seq_len, rng) for o, w, rng in zip(chosen[mine], drawn.tokens, rngs[mine], strict=True)
        ]
        np.add.at(self.seen, drawn.all_sources, lengths)
        return stack(built, drawn.source_B, self.any_masking, drawn.index_B)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows.state_dict(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows.load_state_dict(state["rows"])
        self.seen = np.array(state["seen"], dtype=np.int64)

    def tokens_by_source(self) -> dict[str, int]:
        return {s: int(n) for s, n in zip(self.sources, self.seen, strict=True)}


def stack(rows: list[Row], source_B: np.ndarray, with_documents: bool, index_B: np.ndarray | None = None) -> Batch:
    """One Batch of the rows; the attention rule is the narrowest that covers them all."""

    def tensor(arrays: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(arrays))

    kinds = {r.attention for r in rows}
    attention = kinds.pop() if len(kinds) == 1 else "prefix"
    prefix = None
    if attention == "prefix":
        # A causal row sees no key bidirectionally; a full row sees every key of its document.
        prefix = tensor(
            [r.prefix if r.prefix is not None else np.full(len(r.inputs), r.attention == "full") for r in rows]
        )
    doc_ids = tensor([r.doc_ids for r in rows]) if with_documents else None
    positions = tensor([restart_positions(r.doc_ids) for r in rows]) if with_documents else None
    return Batch(
        tensor([r.inputs for r in rows]),
        tensor([r.targets for r in rows]),
        tensor([r.loss_mask for r in rows]),
        doc_ids,
        torch.from_numpy(source_B),
        attention,
        prefix,
        positions,
        None if index_B is None else torch.from_numpy(index_B),
    )


def build_collator(rows: RowSource, cfg: TrainConfig, ids: TokenIds, rank: int = 0, world: int = 1) -> Collator:
    """The train section's objective(s) over `rows`, seeded by train.seed, for one data-parallel rank."""
    mix = ObjectiveMix(
        cfg.objectives, {o: cfg.masks_documents(o) for o in cfg.objectives}, cfg.mlm, cfg.prefix_lm, cfg.span_corruption
    )
    return Collator(rows, mix, ids, cfg.seed, rank, world)
