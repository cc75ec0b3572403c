"""The train stage's BatchSource: windows from a RowSource, made into rows by the objective, stacked.

For each row of a micro-batch the collator seeds a generator with (train.seed, the row's global
index), picks the row's objective (one, or one of a weighted mapping), asks the row source for a
window of the length that objective takes, and builds the row (kiln.train.objectives). Rows of
one batch may attend differently (UL2 mixing): all causal stays causal (SDPA's fast path without
document masking), all full stays full, and any mix becomes a per-row prefix rule (a causal row
has no prefix, a full row is all prefix). With document masking, document ids go with the batch
and RoPE positions restart at each document.
Tokens seen per source count the data tokens each row read (T for clm, fim, prefix_lm and mlm,
the window L for span corruption), exactly, never as rows times length.
Not handled here: drawing windows (kiln.mix) or sharding rows across data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kiln.model.batch import Batch, RowSource
from kiln.train import objectives as obj
from kiln.train.config import TrainConfig
from kiln.train.objectives import Objective, Row, TokenIds


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
    def __init__(self, rows: RowSource, mix: ObjectiveMix, ids: TokenIds, seq_len: int, seed: int):
        self.rows, self.mix, self.ids, self.seq_len, self.seed = rows, mix, ids, seq_len, seed
        self.names = list(mix.weights)
        self.probs = np.array([mix.weights[n] for n in self.names], dtype=np.float64)
        self.probs /= self.probs.sum()
        self.any_masking = any(mix.masking[n] for n in self.names)
        self.seen = np.zeros(len(rows.sources), dtype=np.int64)

    @property
    def sources(self) -> Sequence[str]:
        return self.rows.sources

    def build_row(self, objective: Objective, window: np.ndarray, rng: np.random.Generator) -> Row:
        masking = self.mix.masking[objective]
        if objective in ("clm", "fim"):
            return obj.clm(window, self.ids, masking)
        if objective == "mlm":
            return obj.mlm(window, self.ids, self.mix.mlm, masking, rng)
        if objective == "prefix_lm":
            return obj.prefix_lm(window, self.ids, self.mix.prefix_lm, masking, rng)
        return obj.span_corruption(window, self.ids, self.mix.span, self.seq_len, rng)

    def next_batch(self, batch_size: int) -> Batch:
        first = self.rows.rows_drawn
        # One generator per row, seeded by its place in the global stream: rows do not depend on
        # how they are grouped into micro-batches or ranks.
        rngs = [np.random.default_rng([self.seed, first + r]) for r in range(batch_size)]
        chosen: list[Objective] = [self.names[int(rng.choice(len(self.names), p=self.probs))] if len(self.names) > 1 else self.names[0] for rng in rngs]  # type: ignore[misc]
        drawn = self.rows.next_rows([obj.window_length(o, self.seq_len, self.mix.span) for o in chosen])
        assert int(drawn.index_B[0]) == first, "the row source numbered its rows differently"
        rows = [self.build_row(o, w, rng) for o, w, rng in zip(chosen, drawn.tokens, rngs, strict=True)]
        np.add.at(self.seen, drawn.source_B, [min(len(w), self.seq_len) for w in drawn.tokens])
        return stack(rows, drawn.source_B, self.any_masking)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows.state_dict(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows.load_state_dict(state["rows"])
        self.seen = np.array(state["seen"], dtype=np.int64)

    def tokens_by_source(self) -> dict[str, int]:
        return {s: int(n) for s, n in zip(self.sources, self.seen, strict=True)}


def stack(rows: list[Row], source_B: np.ndarray, with_documents: bool) -> Batch:
    """One Batch of the rows; the attention rule is the narrowest that covers them all."""
    def tensor(arrays: list[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(arrays))

    kinds = {r.attention for r in rows}
    attention = kinds.pop() if len(kinds) == 1 else "prefix"
    prefix = None
    if attention == "prefix":
        # A causal row sees no key bidirectionally; a full row sees every key of its document.
        prefix = tensor([r.prefix if r.prefix is not None else np.full(len(r.inputs), r.attention == "full") for r in rows])
    doc_ids = tensor([r.doc_ids for r in rows]) if with_documents else None
    positions = tensor([restart_positions(r.doc_ids) for r in rows]) if with_documents else None
    return Batch(
        tensor([r.inputs for r in rows]), tensor([r.targets for r in rows]), tensor([r.loss_mask for r in rows]),
        doc_ids, torch.from_numpy(source_B), attention, prefix, positions,
    )


def build_collator(rows: RowSource, cfg: TrainConfig, ids: TokenIds) -> Collator:
    """The train section's objective(s) over `rows`, seeded by train.seed."""
    mix = ObjectiveMix(cfg.objectives, {o: cfg.masks_documents(o) for o in cfg.objectives}, cfg.mlm, cfg.prefix_lm, cfg.span_corruption)
    return Collator(rows, mix, ids, cfg.seq_len, cfg.seed)
