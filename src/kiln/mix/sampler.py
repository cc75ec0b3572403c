"""Draws training rows from per-source token streams by (scheduled) weight, as kiln.model.batch Rows.

Row i of the global stream picks its source with a generator seeded by (mix.seed, i) from the
weights at the current training progress (constants or piecewise-linear schedules, times the
adaptive factors when mix.adaptive is on), then takes the next tokens of that source's stream
(kiln.mix.streams: documents packed end to end in a seeded order per epoch, curriculum first).
Every data-parallel rank draws the same global rows and reads only its own slice, so the state
(stream positions, rows drawn, adaptive factors) does not depend on the number of ranks, and a
resumed run, with any number of ranks, continues the stream without repeating or skipping a row.
`plan` integrates the weight schedules over the run's steps: planned tokens and epochs per source,
checked against mix.max_epochs before any training. With mix.language_alpha the weights of this
run's sources are tempered over their languages (kiln.mix.languages) at every progress, before the
replayed share and the adaptive factors; being a function of progress, this keeps resume exact.
The Sampler is a RowSource (kiln.model.batch); the pipeline builds it (`build_sampler`) and the
train stage puts its objective on top.
Not handled here: objectives and batching (kiln.train), sequence-length phases (kiln.train.geometry).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kiln.core.errors import ConfigError, FatalError
from kiln.core.layout import MANIFEST, TRAIN, RunLayout
from kiln.core.manifest import read_manifest, recorded_outputs
from kiln.core.mirror import refresh, run_path
from kiln.core.tokenshards import TokenShard, open_split, split_languages
from kiln.mix.adaptive import reweight
from kiln.mix.config import MixConfig
from kiln.mix.languages import language_table, target_shares, tempered
from kiln.mix.schedule import Schedule, breakpoints, value_at
from kiln.mix.streams import SourceStream
from kiln.model.batch import Rows

log = logging.getLogger("kiln.mix")
# Generator streams are seeded (seed, stream id, ...): 0, 1 and 4 order documents
# (kiln.mix.streams), 3 draws each row's source, 2 is the trainer's objectives (with train.seed).
SOURCE_STREAM = 3


class Sampler:
    def __init__(
        self,
        shards: Mapping[str, TokenShard],
        cfg: MixConfig,
        seq_len: int,
        replay: Mapping[str, tuple[TokenShard, float]] | None = None,
        languages: Mapping[str, Mapping[str, int]] | None = None,
    ):
        """replay: source -> (shard, share of the replayed rows) drawn at a fixed mix.replay.fraction of all rows.
        languages: source -> {language: train tokens} (the tokenize manifest's), needed by mix.language_alpha."""
        self.cfg = cfg
        self.replay_fraction = cfg.replay.fraction if replay else 0.0
        usable = {s: shard for s, shard in sorted(shards.items()) if len(shard) >= seq_len + 1}
        for s in sorted(set(shards) - set(usable)):
            log.warning(
                "mix: source %s has %d train tokens, fewer than one window of %d; not sampled",
                s,
                len(shards[s]),
                seq_len + 1,
            )
        schedules: dict[str, Schedule] = (
            dict(cfg.weights) if cfg.weights is not None else {s: float(len(shard)) for s, shard in usable.items()}
        )
        positive = {s for s, sched in schedules.items() if any(value_at(sched, p) > 0 for p in _probe_points(sched))}
        missing = sorted(positive - set(usable))
        if missing:
            raise FatalError(
                f"mix.weights gives weight to {missing}, which have no usable train tokens; drop them from mix.weights"
            )
        self.sources = [s for s in usable if s in positive]
        if not self.sources:
            raise FatalError(
                f"mix: no source has the {seq_len + 1} train tokens of one window; curate more text or lower "
                "train.seq_len"
            )
        self.schedules = [schedules[s] for s in self.sources]
        self.own = len(self.sources)  # the replayed sources follow this run's own
        # The sampled sources' train tokens per language, for the plan's table; None where any is not counted.
        self.languages: dict[str, dict[str, int]] | None = None
        if languages is not None and all(s in languages for s in self.sources):
            self.languages = {s: dict(languages[s]) for s in self.sources}
        self.target_L: np.ndarray | None = None  # mix.language_alpha's share per language; None: off
        self.shares_SL = np.zeros((self.own, 0))  # each source's share of its train tokens per language
        if cfg.language_alpha is not None:
            if self.languages is None:
                uncounted = [s for s in self.sources if languages is None or s not in languages]
                raise ConfigError(
                    f"mix.language_alpha: the tokenize manifest does not count the languages of {uncounted} (a kiln "
                    "before the count wrote it); rerun `kiln tokenize --force`, or drop mix.language_alpha"
                )
            table = language_table(self.sources, self.languages)
            self.shares_SL, self.target_L = table.shares_SL, target_shares(table.tokens_L, cfg.language_alpha)
            if len(table.languages) < 2:
                log.warning(
                    "mix.language_alpha: the sampled sources hold one language only (%s); nothing to balance (run "
                    "curate's language step for meta.language)",
                    table.languages,
                )
        for s, (shard, share) in sorted((replay or {}).items()):
            if len(shard) >= seq_len + 1 and share > 0:
                usable[s], self.sources, self.schedules = shard, [*self.sources, s], [*self.schedules, share]
        if replay and len(self.sources) == self.own:
            log.warning(
                "mix: no replayed source of %s has the %d train tokens of one window; nothing is replayed",
                cfg.replay.run,
                seq_len + 1,
            )  # type: ignore[union-attr]
            self.replay_fraction = 0.0
        self.streams = [
            SourceStream(usable[s], i, cfg.seed, cfg.lanes, cfg.curriculum) for i, s in enumerate(self.sources)
        ]
        self.max_window = seq_len + 1
        self.rows_drawn = 0
        self.drawn = np.zeros(len(self.sources), dtype=np.int64)  # rows per source
        self.factors = np.ones(len(self.sources))  # adaptive multipliers of the recipe's weights
        self.last_val: dict[str, float] = {}

    def weights_at(self, progress: float, adaptive: bool = True) -> np.ndarray:
        """Probability of each source (in `sources` order) for a row drawn at `progress`."""
        w = np.array([value_at(s, progress) for s in self.schedules], dtype=np.float64)
        if self.target_L is not None:
            w[: self.own] = tempered(w[: self.own], self.shares_SL, self.target_L)
        w[: self.own] *= (1 - self.replay_fraction) / w[: self.own].sum()
        if self.replay_fraction:
            w[self.own :] *= self.replay_fraction / w[self.own :].sum()
        if adaptive and self.cfg.adaptive is not None:
            w = w * self.factors / (w * self.factors).sum()
            live = w > 0  # a source the schedule has switched off stays off
            floor = min(self.cfg.adaptive.floor, 1 / live.sum())
            # Mixed with the floor so every live source keeps at least `floor` of the rows.
            w[live] = floor + (1 - floor * live.sum()) * w[live]
        return w

    def next_rows(self, lengths: Sequence[int], progress: float = 0.0, keep: slice = slice(None)) -> Rows:
        """The next len(lengths) rows of the global stream; only the rows in `keep` are read and returned."""
        assert max(lengths) <= self.max_window, f"windows of {max(lengths)} tokens, sampler built for {self.max_window}"
        cdf = np.cumsum(self.weights_at(progress))
        first = self.rows_drawn
        kept = range(len(lengths))[keep]
        tokens, sources, indices, every = [], [], [], []
        for i, length in enumerate(lengths):
            u = np.random.default_rng([self.cfg.seed, SOURCE_STREAM, first + i]).random()
            s = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(self.sources) - 1)
            read = i in kept
            window = self.streams[s].take(length, progress, read=read)
            self.drawn[s] += 1
            every.append(s)
            if read:
                tokens.append(window)
                sources.append(s)
                indices.append(first + i)
        self.rows_drawn += len(lengths)
        return Rows(
            tokens,
            np.array(sources, dtype=np.int64),
            np.array(indices, dtype=np.int64),
            np.array(every, dtype=np.int64),
        )

    def observe(self, step: int, progress: float, val_loss: Mapping[str, float]) -> dict[str, Any] | None:
        """Adaptive mode: reweight from per-source validation losses; the log record with its reasons, or None."""
        if self.cfg.adaptive is None:
            return None
        weights_before = self.weights_at(progress)
        record = reweight(self.sources, self.factors, self.last_val, val_loss, self.cfg.adaptive)
        self.last_val = {s: float(v) for s, v in val_loss.items() if s in self.sources}
        if record is None:
            return None
        weights_after = self.weights_at(progress)  # what rows are drawn by from now on, floor included
        for i, s in enumerate(self.sources):
            record["adaptive"].setdefault(s, {}).update(
                weight_before=round(float(weights_before[i]), 5), weight_after=round(float(weights_after[i]), 5)
            )
        record["step"] = step
        log.info("mix: adaptive reweighting at step %d: %s", step, record["reason"])
        return record

    @property
    def adapt_every(self) -> int | None:
        return self.cfg.adaptive.every if self.cfg.adaptive is not None else None

    @property
    def report_windows(self) -> int:
        return self.cfg.report_windows

    def breakpoints(self) -> list[float]:
        """Progress points where the weights change slope or jump, and where a curriculum ends."""
        points = {p for s in self.schedules for p in breakpoints(s)}
        if self.cfg.curriculum is not None:
            points.add(self.cfg.curriculum.until)
        return sorted(points)

    def plan(self, step_tokens: Sequence[int], step_progress: Sequence[float], check: bool = False) -> dict[str, Any]:
        """Planned tokens and epochs per source over the given steps (the weights as they stand, adaptive floor
        included).

        check: raise ConfigError (mix.on_overrepeat=error) or warn when a source would repeat more than mix.max_epochs
        times.
        """
        w_SP = np.stack([self.weights_at(p) for p in step_progress], axis=1)  # (sources, steps), as rows are drawn now
        tokens = w_SP @ np.asarray(step_tokens, dtype=np.float64)
        per_source = {
            s: {
                "tokens": int(round(t)),
                "epochs": round(float(t) / stream.tokens_per_epoch, 3),
                "train_tokens": stream.tokens_per_epoch,
            }
            for s, t, stream in zip(self.sources, tokens, self.streams, strict=True)
        }
        over = {s: v["epochs"] for s, v in per_source.items() if v["epochs"] > self.cfg.max_epochs}
        if check and over:
            message = f"mix: sources planned beyond mix.max_epochs={self.cfg.max_epochs}: " + ", ".join(
                f"{s} {e:.2f} epochs" for s, e in over.items()
            )
            if self.cfg.on_overrepeat == "error":
                raise ConfigError(message + "; lower their weight, raise mix.max_epochs, or curate more of them")
            log.warning("%s; repeated data is worth less with every pass", message)
        return per_source

    def state_dict(self) -> dict[str, Any]:
        return {
            "sources": self.sources,
            "rows_drawn": self.rows_drawn,
            "drawn": self.drawn.tolist(),
            "streams": [s.state_dict() for s in self.streams],
            "factors": self.factors.tolist(),
            "last_val": self.last_val,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["sources"] != self.sources:
            raise FatalError(
                f"checkpoint sampler drew from {state['sources']}, this run has {self.sources}; the data changed"
            )
        self.rows_drawn = state["rows_drawn"]
        self.drawn = np.array(state["drawn"], dtype=np.int64)
        for source, stream, s in zip(self.sources, self.streams, state["streams"], strict=True):
            try:
                stream.load_state_dict(s)
            except ValueError as e:
                raise FatalError(
                    f"checkpoint sampler, source {source}: {e}; the state belongs to other data or was edited"
                ) from None
        self.factors = np.array(state["factors"], dtype=np.float64)
        self.last_val = dict(state["last_val"])


def _probe_points(schedule: Schedule) -> list[float]:
    return [0.0, 1.0] if isinstance(schedule, int | float) else [p for p, _ in schedule]


def replayed(cfg: MixConfig) -> dict[str, tuple[TokenShard, float]]:
    """mix.replay's sources as `<run>/<source>`: the run's train shards, each with its share of the
    tokens that run's training read (its train manifest), its original mixture as realized. A run
    that only tokenized (general text standing in for an imported model's pretraining data, which
    kiln never saw) is spread in proportion to each source's train tokens."""
    assert cfg.replay is not None
    run = RunLayout(run_path(cfg.replay.run))  # a run in a store: its place in a mirror
    recorded_outputs(run.token_shards)  # there: fetched once and checked; here: its manifest read
    if refresh(run.stage(TRAIN) / MANIFEST):
        read = read_manifest(run.stage(TRAIN))["counts"]["tokens_by_source"]
    else:
        read = {s: v["train"]["tokens"] for s, v in read_manifest(run.token_shards)["counts"]["per_source"].items()}
    shards = open_split(run.token_shards, "train", verify=True)
    total = sum(read.values())
    return {f"{Path(run.root).name}/{s}": (shards[s], n / total) for s, n in read.items() if n and s in shards}


def build_sampler(tokenize_dir: Path, cfg: MixConfig, seq_len: int, split: str = "train") -> Sampler:
    """The Sampler over a run's split (checksums verified) for windows of up to seq_len + 1 tokens.

    The train split is drawn as the mix section says, replay included; the validation split
    (held-out rows for an objective's validation loss) in proportion to each source's tokens,
    shuffled, fixed.
    """
    if split != "train":
        cfg = cfg.model_copy(
            update={"weights": None, "curriculum": None, "adaptive": None, "replay": None, "language_alpha": None}
        )
    # verify: a damaged .bin of the right length would otherwise train silently on garbage.
    return Sampler(
        open_split(tokenize_dir, split, verify=True),
        cfg,
        seq_len,
        replayed(cfg) if cfg.replay else None,
        split_languages(tokenize_dir, split),
    )
