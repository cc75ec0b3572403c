"""One source's documents as an endless stream of tokens, epoch by epoch, in a seeded order.

Each epoch visits every document of the source's train split once, in an order drawn from
(mix.seed, the source, the epoch), dealt round-robin into `lanes` (mix.lanes): lane k holds the
order's documents k, k + lanes, k + 2 * lanes, ... Successive rows of the source come from
successive lanes, and a row takes the next tokens of its lane, documents packed end to end
(each ends with its end-of-document token). So nothing is skipped or repeated within an epoch,
tokens are counted exactly, and the rows of one batch come from different documents spread
over the epoch rather than from consecutive pieces of one long document (which made training
measurably slower: the demo's loss at step 160 was 1 nat higher with a single lane).
A row that exhausts its lane continues in the next one; when every lane is exhausted the next
epoch begins. With a curriculum, the first epoch's order is the curriculum's (by length or a
curation score, optionally in shuffled buckets), so every lane starts with the first documents
of that order; at the first row drawn after the curriculum's share of training, the documents
each lane has not reached yet are shuffled. The state is a few integers per lane, so a stream
resumes exactly.
Not handled here: choosing which source a row comes from (kiln.mix.sampler).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from kiln.core.errors import ConfigError
from kiln.core.tokenshards import TokenShard, read_scores
from kiln.mix.config import CurriculumConfig

# Generator stream ids (seeded with mix.seed): an epoch's order, curriculum buckets, the shuffle at
# the curriculum's end. kiln.mix.sampler uses 3 for each row's source, the trainer 2 for objectives.
ORDER, BUCKETS, SWITCH = 0, 1, 4


@dataclass
class StreamState:
    epoch: int = 0
    turn: int = 0  # the lane the next row starts in
    position: list[int] = field(default_factory=list)  # per lane: index into its documents
    offset: list[int] = field(default_factory=list)  # per lane: tokens of that document already taken
    switched_at: list[int] = field(
        default_factory=list
    )  # per lane: first-epoch position where the curriculum order ended; empty: not yet


def curriculum_order(shard: TokenShard, cfg: CurriculumConfig, rng: np.random.Generator) -> np.ndarray:
    """Document indices in curriculum order; documents without the score go last."""
    if cfg.key == "length":
        key = np.diff(np.asarray(shard.offsets, dtype=np.int64)).astype(np.float64)
    else:
        key = read_scores(shard.prefix, shard.n_docs)[cfg.key].astype(np.float64)
        if not np.isfinite(key).any():
            raise ConfigError(
                f"mix.curriculum.key={cfg.key}: no document of {shard.prefix} has that score (curation sets it "
                "only when its step runs); order by length or run the step"
            )
    key = -key if cfg.descending else key
    key = np.where(np.isnan(key), np.inf, key)  # unscored documents last, in either direction
    order = np.argsort(key, kind="stable")
    if cfg.buckets:
        order = np.concatenate([rng.permutation(b) for b in np.array_split(order, cfg.buckets)])
    return order


class SourceStream:
    def __init__(
        self, shard: TokenShard, source_index: int, seed: int, lanes: int, curriculum: CurriculumConfig | None
    ):
        self.shard, self.source_index, self.seed, self.curriculum = shard, source_index, seed, curriculum
        self.lanes = max(1, min(lanes, shard.n_docs))
        self.offsets = np.asarray(shard.offsets, dtype=np.int64)
        self.state = StreamState(position=[0] * self.lanes, offset=[0] * self.lanes)
        self._cache: tuple[tuple, list[np.ndarray]] | None = None  # (state key, documents per lane)
        self.lane_docs()  # a curriculum's scores are read (and checked) now, before any training

    def rng(self, stream: int, *more: int) -> np.random.Generator:
        """A generator for one purpose (ORDER, BUCKETS, SWITCH) of this source, seeded by mix.seed."""
        return np.random.default_rng([self.seed, stream, self.source_index, *more])

    def lane_docs(self) -> list[np.ndarray]:
        """Each lane's documents in this epoch (cached; rebuilt from the state alone)."""
        key = (self.state.epoch, tuple(self.state.switched_at))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.build_lanes())
        return self._cache[1]

    def build_lanes(self) -> list[np.ndarray]:
        s = self.state
        if s.epoch > 0 or self.curriculum is None:
            order = self.rng(ORDER, s.epoch).permutation(self.shard.n_docs)
            return [order[k :: self.lanes] for k in range(self.lanes)]
        order = curriculum_order(self.shard, self.curriculum, self.rng(BUCKETS))
        lanes = [order[k :: self.lanes] for k in range(self.lanes)]
        if s.switched_at:  # the rest of each lane's first epoch, shuffled
            lanes = [
                np.concatenate([d[:cut], d[cut:][self.rng(SWITCH, k, cut).permutation(len(d) - cut)]])
                for k, (d, cut) in enumerate(zip(lanes, s.switched_at, strict=True))
            ]
        return lanes

    def take(self, n: int, progress: float, read: bool = True) -> np.ndarray | None:
        """The next n tokens of the stream (int64), or None with read=False (the position still moves)."""
        s = self.state
        if self.curriculum is not None and s.epoch == 0 and not s.switched_at and progress >= self.curriculum.until:
            # Documents in progress finish in curriculum order; the ones after them are shuffled.
            s.switched_at = [p + (1 if o else 0) for p, o in zip(s.position, s.offset, strict=True)]
        pieces: list[np.ndarray] = []
        need, lane, first_lane = n, None, None
        while need:
            lanes = self.lane_docs()
            if lane is None or s.position[lane] == len(lanes[lane]):
                lane = self.next_lane(s.turn if lane is None else lane)
                lanes = self.lane_docs()  # a new epoch rebuilds them
                first_lane = lane if first_lane is None else first_lane
            doc = int(lanes[lane][s.position[lane]])
            start, end = int(self.offsets[doc]) + s.offset[lane], int(self.offsets[doc + 1])
            took = min(need, end - start)
            if read:
                pieces.append(self.shard.tokens[start : start + took])
            need -= took
            s.offset[lane] += took
            if start + took == end:  # document finished: the lane's next one
                s.position[lane], s.offset[lane] = s.position[lane] + 1, 0
        assert first_lane is not None
        s.turn = (first_lane + 1) % self.lanes
        return np.concatenate(pieces).astype(np.int64) if read else None

    def next_lane(self, start: int) -> int:
        """The first lane from `start` on with documents left; a new epoch when none has."""
        s = self.state
        lanes = self.lane_docs()
        for i in range(self.lanes):
            k = (start + i) % self.lanes
            if s.position[k] < len(lanes[k]):
                return k
        s.epoch, s.position, s.offset, s.switched_at = s.epoch + 1, [0] * self.lanes, [0] * self.lanes, []
        return start % self.lanes

    @property
    def tokens_per_epoch(self) -> int:
        return int(self.offsets[-1])

    def state_dict(self) -> dict[str, object]:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        """Go on from a saved position; ValueError when it does not fit this stream's documents (the
        state of other data, or an edited one: the stream would index past its lanes or loop forever)."""
        loaded = StreamState(**{k: (list(v) if isinstance(v, list) else v) for k, v in state.items()})
        sizes = [
            len(range(k, self.shard.n_docs, self.lanes)) for k in range(self.lanes)
        ]  # documents per lane, in any order
        lanes_fit = len(loaded.position) == len(loaded.offset) == self.lanes and len(loaded.switched_at) in (
            0,
            self.lanes,
        )
        if not lanes_fit or loaded.turn >= self.lanes:
            raise ValueError(
                f"the state has {len(loaded.position)} lane(s) (turn {loaded.turn}), this stream {self.lanes}"
            )
        for k, (n, p, cut) in enumerate(zip(sizes, loaded.position, loaded.switched_at or sizes, strict=True)):
            if p > n or cut > n:
                raise ValueError(f"lane {k}: position {p} (or switched_at {cut}) lies past its {n} documents")
        before, self.state = self.state, loaded
        lanes = self.lane_docs()
        for k, (docs, p, o) in enumerate(zip(lanes, loaded.position, loaded.offset, strict=True)):
            length = (
                int(self.offsets[docs[p] + 1] - self.offsets[docs[p]]) if p < len(docs) else 1
            )  # an exhausted lane: offset 0
            if o >= length:
                self.state = before
                raise ValueError(f"lane {k}: offset {o} lies past the {length} tokens of its document")
