"""Draws training windows from per-source token shards by weight, as kiln.model.batch Batches.

Each sequence picks a source with probability proportional to its weight, then a uniformly
random window of seq_len + 1 tokens in that source's train split: its first seq_len tokens are
the inputs, its last seq_len the targets, and every target counts in the loss. Windows may
cross document boundaries (no document ids: attention spans them); the end-of-document token
marks them. The whole state is the random generator's, so a resumed run draws exactly the
sequences an uninterrupted one would have. The Sampler is a BatchSource (kiln.model.batch); the
pipeline builds it (`build_sampler`) and hands it to the trainer.
Not handled here: epoch-exact passes, curricula and sequence-length schedules (the mix issue).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.core.errors import FatalError
from kiln.core.tokenshards import TokenShard, open_split
from kiln.mix.config import MixConfig
from kiln.model.batch import Batch

log = logging.getLogger("kiln.mix")


class Sampler:
    def __init__(self, shards: Mapping[str, TokenShard], weights: Mapping[str, float] | None, seq_len: int, seed: int):
        usable = {s: shard for s, shard in sorted(shards.items()) if len(shard) >= seq_len + 1}
        for s in sorted(set(shards) - set(usable)):
            log.warning("mix: source %s has %d train tokens, fewer than one window of %d; not sampled", s, len(shards[s]), seq_len + 1)
        if weights is None:
            weights = {s: float(len(shard)) for s, shard in usable.items()}
        missing = [s for s, w in weights.items() if w > 0 and s not in usable]
        if missing:
            raise FatalError(f"mix.weights gives weight to {missing}, which have no usable train tokens; drop them from mix.weights")
        self.sources = [s for s in usable if weights.get(s, 0) > 0]
        if not self.sources:
            raise FatalError(f"mix: no source has the {seq_len + 1} train tokens of one window; curate more text or lower train.seq_len")
        w = np.array([weights[s] for s in self.sources], dtype=np.float64)
        self.probs = w / w.sum()
        self.shards = [usable[s] for s in self.sources]
        self.seq_len = seq_len
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.drawn = np.zeros(len(self.sources), dtype=np.int64)

    def next_batch(self, batch_size: int) -> Batch:
        """batch_size windows on the host: inputs and targets (B, seq_len), all targets counted."""
        which = self.rng.choice(len(self.sources), size=batch_size, p=self.probs)
        windows = np.empty((batch_size, self.seq_len + 1), dtype=np.int64)
        for row, s in enumerate(which):
            tokens = self.shards[s].tokens
            start = int(self.rng.integers(0, len(tokens) - self.seq_len))  # last window ends at the final token
            windows[row] = tokens[start : start + self.seq_len + 1]
        np.add.at(self.drawn, which, 1)
        windows_BT1 = torch.from_numpy(windows)  # no copy; inputs and targets are views of it
        return Batch(
            input_ids_BT=windows_BT1[:, :-1],
            targets_BT=windows_BT1[:, 1:],
            loss_mask_BT=torch.ones(batch_size, self.seq_len, dtype=torch.bool),
            doc_ids_BT=None,
            source_B=torch.from_numpy(which),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "drawn": self.drawn.tolist(), "sources": self.sources}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["sources"] != self.sources:
            raise FatalError(f"checkpoint sampler drew from {state['sources']}, this run has {self.sources}; the data changed")
        self.rng.bit_generator.state = state["rng"]
        self.drawn = np.array(state["drawn"], dtype=np.int64)

    def tokens_by_source(self) -> dict[str, int]:
        return {s: int(n) * self.seq_len for s, n in zip(self.sources, self.drawn, strict=True)}


def build_sampler(tokenize_dir: Path, cfg: MixConfig, seq_len: int) -> Sampler:
    """The Sampler over a run's train split (checksums verified) for windows of seq_len tokens."""
    # verify: a damaged .bin of the right length would otherwise train silently on garbage.
    return Sampler(open_split(tokenize_dir, "train", verify=True), cfg.weights, seq_len, cfg.seed)
