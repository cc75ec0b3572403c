"""Model-based quality filters: perplexity under a reference n-gram model (CCNet) and the score
of a reference-vs-corpus classifier (GPT-3, DCLM).

Both load a model trained by `kiln quality train-lm` / `train-classifier` (a folder holding
model.npz and the model's sorted scores of a corpus sample), write their score into the
document's meta, and keep by a cutoff taken from that sample: perplexity buckets head / middle /
tail at two percentiles (CCNet: 30 and 60), or the classifier's top fraction (DCLM: 10%);
or by an absolute threshold instead. A worker loads each model once (cached by path).
Not handled here: training the models (kiln.quality), code documents (these filters run in the
prose branch only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.audit import Ledger

if TYPE_CHECKING:
    from kiln.quality.classifier import HashedClassifier
    from kiln.quality.ngram import NGramLM

Bucket = Literal["head", "middle", "tail"]
BUCKETS: tuple[Bucket, ...] = ("head", "middle", "tail")
MODEL, LM_SCORES, CLASSIFIER_SCORES = "model.npz", "corpus_perplexity.npy", "corpus_scores.npy"


class PerplexityConfig(Section):
    enabled: bool = Field(default=False, description="Score documents with the reference n-gram model (`kiln quality train-lm` first) and keep the buckets below (prose only).")
    model: str | None = Field(default=None, description="Folder of the trained model (model.npz, corpus_perplexity.npy); None: this run's quality/lm.")
    percentiles: tuple[float, float] = Field(default=(30.0, 60.0), description="Perplexity percentiles of the model's corpus sample that split head | middle | tail (CCNet: 30, 60).")
    keep: tuple[Bucket, ...] = Field(default=("head", "middle"), min_length=1, description="Buckets kept (head: lowest perplexity, most like the reference).")
    max_perplexity: float | None = Field(default=None, gt=0, description="Absolute threshold instead of buckets: keep documents with perplexity at or below it.")

    @model_validator(mode="after")
    def _ordered(self) -> PerplexityConfig:
        low, high = self.percentiles
        if not 0 < low < high < 100:
            raise ValueError(f"perplexity.percentiles must be two increasing values inside (0, 100), got {list(self.percentiles)}")
        return self


class ClassifierFilterConfig(Section):
    enabled: bool = Field(default=False, description="Score documents with the reference-vs-corpus classifier (`kiln quality train-classifier` first) and keep the best (prose only).")
    model: str | None = Field(default=None, description="Folder of the trained classifier (model.npz, corpus_scores.npy); None: this run's quality/classifier.")
    top_fraction: float = Field(default=0.1, gt=0, le=1, description="Keep documents scoring in this top fraction of the classifier's corpus sample (DCLM: 0.1).")
    min_score: float | None = Field(default=None, ge=0, le=1, description="Absolute threshold instead of top_fraction: keep documents scoring at or above it.")


def model_folder(configured: str | None, run_dir: Path | None, default: str) -> Path:
    """The configured folder, else `default` (LM_DIR, CLASSIFIER_DIR) in the run directory; absolute."""
    if configured is not None:
        return Path(configured).resolve()
    assert run_dir is not None, "a quality filter without a model folder needs the run directory"
    return (Path(run_dir) / default).resolve()


def model_files(folder: Path, scores: str) -> list[Path]:
    """The files a filter reads (curate hashes them, so a retrained model redoes the stage)."""
    files = [folder / MODEL, folder / scores]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FatalError(f"curate: quality model files missing: {', '.join(missing)}; train them first (`kiln quality train-lm` / `kiln quality train-classifier` with the same recipe) or point the filter's `model` at their folder")
    return files


@functools.lru_cache(maxsize=4)
def _load_lm(path: Path, mtime: float) -> NGramLM:
    from kiln.quality.ngram import NGramLM  # the config imports this module; the models only when a filter runs

    return NGramLM.load(path)


@functools.lru_cache(maxsize=4)
def _load_classifier(path: Path, mtime: float) -> HashedClassifier:
    from kiln.quality.classifier import HashedClassifier

    return HashedClassifier.load(path)


def _sorted_scores(path: Path) -> np.ndarray:
    scores = np.load(path)
    if len(scores) == 0:
        raise FatalError(f"{path}: the model's corpus sample has no scores, so no percentile cutoff exists; retrain with more corpus text (quality.corpus_sample_mb) or use an absolute threshold")
    return scores


class PerplexityFilter:
    """Writes meta.perplexity and meta.perplexity_bucket; drops the buckets not kept."""

    name = "perplexity"

    def __init__(self, cfg: PerplexityConfig, folder: Path):
        path = Path(folder) / MODEL
        self.model = _load_lm(path, path.stat().st_mtime)
        self.keep, self.max_perplexity = set(cfg.keep), cfg.max_perplexity
        self.cutoffs = tuple(float(c) for c in np.percentile(_sorted_scores(Path(folder) / LM_SCORES), cfg.percentiles))

    def bucket(self, perplexity: float) -> Bucket:
        return "head" if perplexity <= self.cutoffs[0] else "middle" if perplexity <= self.cutoffs[1] else "tail"

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            perplexity = float(self.model.perplexities([doc.text])[0])
            if math.isnan(perplexity):
                ledger.remove(doc, self.name, "no_words", note="no word to score")
                continue
            bucket = self.bucket(perplexity)
            if self.max_perplexity is not None:
                if perplexity > self.max_perplexity:
                    ledger.remove(doc, self.name, "above_max", perplexity, self.max_perplexity)
                    continue
            elif bucket not in self.keep:
                threshold = self.cutoffs[1] if bucket == "tail" else self.cutoffs[0]  # the boundary the bucket starts (or, for head, ends) at
                ledger.remove(doc, self.name, bucket, perplexity, threshold, note=f"buckets kept: {', '.join(b for b in BUCKETS if b in self.keep)}")
                continue
            yield doc.with_meta(perplexity=round(perplexity, 3), perplexity_bucket=bucket)


class ClassifierFilter:
    """Writes meta.quality_score; drops documents below the cutoff."""

    name = "quality_classifier"

    def __init__(self, cfg: ClassifierFilterConfig, folder: Path):
        path = Path(folder) / MODEL
        self.model = _load_classifier(path, path.stat().st_mtime)
        if cfg.min_score is not None:
            self.cutoff, self.rule = cfg.min_score, "below_min_score"
        else:
            self.cutoff, self.rule = float(np.quantile(_sorted_scores(Path(folder) / CLASSIFIER_SCORES), 1 - cfg.top_fraction)), "below_top_fraction"

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            score = float(self.model.scores([doc.text])[0])
            if score < self.cutoff:
                ledger.remove(doc, self.name, self.rule, score, self.cutoff)
                continue
            yield doc.with_meta(quality_score=round(score, 6))
