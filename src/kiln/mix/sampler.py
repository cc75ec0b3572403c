"""Draws training windows from per-source token shards by weight, as kiln.model.batch Rows.

Each row picks a source with probability proportional to its weight, then a uniformly random
window of the length the objective asks for (at most seq_len + 1 tokens) in that source's train
split. Windows may cross document boundaries; the end-of-document token marks them, and the
objective decides whether attention may cross them. The whole state is the random generator's
and the row counter, so a resumed run draws exactly the windows an uninterrupted one would
have. The Sampler is a RowSource (kiln.model.batch); the pipeline builds it (`build_sampler`)
and the train stage puts its objective on top.
Not handled here: epoch-exact passes, curricula and sequence-length schedules (the mix issue).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kiln.core.errors import FatalError
from kiln.core.tokenshards import TokenShard, open_split
from kiln.mix.config import MixConfig
from kiln.model.batch import Rows

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
        self.max_window = seq_len + 1
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.drawn = np.zeros(len(self.sources), dtype=np.int64)  # rows per source

    @property
    def rows_drawn(self) -> int:
        return int(self.drawn.sum())

    def next_rows(self, lengths: Sequence[int]) -> Rows:
        """One window per entry of `lengths`, each that many tokens, on the host."""
        assert max(lengths) <= self.max_window, f"windows of {max(lengths)} tokens, sampler built for {self.max_window}"
        first = self.rows_drawn
        which = self.rng.choice(len(self.sources), size=len(lengths), p=self.probs)
        windows = []
        for s, length in zip(which, lengths, strict=True):
            tokens = self.shards[s].tokens
            start = int(self.rng.integers(0, len(tokens) - length + 1))  # the last window ends at the final token
            windows.append(tokens[start : start + length].astype(np.int64))
        np.add.at(self.drawn, which, 1)
        return Rows(windows, which.astype(np.int64), np.arange(first, first + len(lengths), dtype=np.int64))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "drawn": self.drawn.tolist(), "sources": self.sources}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["sources"] != self.sources:
            raise FatalError(f"checkpoint sampler drew from {state['sources']}, this run has {self.sources}; the data changed")
        self.rng.bit_generator.state = state["rng"]
        self.drawn = np.array(state["drawn"], dtype=np.int64)


def build_sampler(tokenize_dir: Path, cfg: MixConfig, seq_len: int, split: str = "train") -> Sampler:
    """The Sampler over a run's split (checksums verified) for windows of up to seq_len + 1 tokens.

    The train split is drawn by mix.weights; the validation split (held-out rows for the
    objective's validation loss) in proportion to each source's tokens.
    """
    # verify: a damaged .bin of the right length would otherwise train silently on garbage.
    return Sampler(open_split(tokenize_dir, split, verify=True), cfg.weights if split == "train" else None, seq_len, cfg.seed)
