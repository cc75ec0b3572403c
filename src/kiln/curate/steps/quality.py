"""Model-based quality filters: perplexity under a reference n-gram model (CCNet) and the score
of a reference-vs-corpus classifier (GPT-3, DCLM).

Both load a model trained by `kiln quality train-lm` / `train-classifier` (a folder holding
model.npz and the model's sorted scores of a corpus sample), write their score into the
document's meta, and keep by a cutoff taken from that sample: perplexity buckets head / middle /
tail at two percentiles (CCNet: 30 and 60), or the classifier's top fraction (DCLM: 10%);
or by an absolute threshold instead. A worker loads each model once (cached by path), and curate
scores a group of documents in one call (`prepare`, kiln.curate.steps.chain.run_documents).
Not handled here: training the models (kiln.curate.quality), code documents (these filters run in the
prose branch only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, model_validator

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.curate.audit import Ledger

if TYPE_CHECKING:
    from kiln.curate.quality.classifier import HashedClassifier
    from kiln.curate.quality.labels import LabelModel
    from kiln.curate.quality.ngram import NGramLM

Bucket = Literal["head", "middle", "tail"]
BUCKETS: tuple[Bucket, ...] = ("head", "middle", "tail")
MODEL, LM_SCORES, CLASSIFIER_SCORES = "model.npz", "corpus_perplexity.npy", "corpus_scores.npy"
TRAIN_LM, TRAIN_CLASSIFIER = "kiln quality train-lm", "kiln quality train-classifier"


class PerplexityConfig(Section):
    enabled: bool = Field(
        default=False,
        description=(
            "Score documents with the reference n-gram model (`kiln quality train-lm` first) and keep the buckets "
            "below (prose only)."
        ),
    )
    model: str | None = Field(
        default=None,
        description="Folder of the trained model (model.npz, corpus_perplexity.npy); None: this run's quality/lm.",
    )
    percentiles: tuple[float, float] = Field(
        default=(30.0, 60.0),
        description=(
            "Perplexity percentiles of the model's corpus sample that split head | middle | tail (CCNet: 30, 60)."
        ),
    )
    keep: tuple[Bucket, ...] = Field(
        default=("head", "middle"),
        min_length=1,
        description="Buckets kept (head: lowest perplexity, most like the reference).",
    )
    max_perplexity: float | None = Field(
        default=None,
        gt=0,
        description="Absolute threshold instead of buckets: keep documents with perplexity at or below it.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PerplexityConfig:
        low, high = self.percentiles
        if not 0 < low < high < 100:
            raise ValueError(
                f"perplexity.percentiles must be two increasing values inside (0, 100), got {list(self.percentiles)}"
            )
        return self


class ClassifierFilterConfig(Section):
    enabled: bool = Field(
        default=False,
        description=(
            "Score documents with the reference-vs-corpus classifier (`kiln quality train-classifier` first) and keep "
            "the best (prose only)."
        ),
    )
    model: str | None = Field(
        default=None,
        description=(
            "Folder of the trained classifier (model.npz, corpus_scores.npy); None: this run's quality/classifier."
        ),
    )
    top_fraction: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Keep documents scoring in this top fraction of the classifier's corpus sample (DCLM: 0.1).",
    )
    min_score: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Absolute threshold instead of top_fraction: keep documents scoring at or above it.",
    )


def model_folder(configured: str | None, run_dir: Path, default: str) -> Path:
    """The configured folder, else `default` (LM_DIR, CLASSIFIER_DIR) in the run directory; absolute."""
    return Path(configured if configured is not None else Path(run_dir) / default).resolve()


def model_files(folder: Path, scores: str) -> list[Path]:
    """The files a filter reads (curate hashes them, so a retrained model redoes the stage)."""
    files = [folder / MODEL, folder / scores]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FatalError(
            f"curate: quality model files missing: {', '.join(missing)}; train them first (`kiln quality "
            "train-lm` / `kiln quality train-classifier` with the same recipe) or point the filter's `model` at "
            "their folder"
        )
    return files


@functools.lru_cache(maxsize=4)
def _load_lm(path: Path, mtime: float) -> NGramLM:
    from kiln.curate.quality.ngram import NGramLM  # the config imports this module; the models only when a filter runs

    return NGramLM.load(path)


@functools.lru_cache(maxsize=4)
def _load_classifier(path: Path, mtime: float) -> HashedClassifier:
    from kiln.curate.quality.classifier import HashedClassifier

    return HashedClassifier.load(path)


@functools.lru_cache(maxsize=8)
def _load_labels(folder: Path, mtime: float) -> LabelModel:
    from kiln.curate.quality.labels import LabelModel

    return LabelModel.load(folder)


def load_label_model(folder: Path) -> LabelModel:
    """A model of `kiln quality train-labels`, loaded once a process (again when retrained)."""
    from kiln.curate.quality.labels import LABELS_FILE

    labels = folder / LABELS_FILE
    return _load_labels(folder, labels.stat().st_mtime if labels.is_file() else 0.0)  # load() names what is missing


def _mtime(path: Path, command: str) -> float:
    """The file's modification time (the load cache's key: a retrained model is reloaded)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        raise FatalError(
            f"quality: no model at {path}; train it with `{command}` or point the filter's `model` at its folder"
        ) from None


def _sorted_scores(path: Path, command: str) -> np.ndarray:
    """The model's sorted scores of its corpus sample; FatalError when missing, corrupt or empty."""
    fix = f"train the model again with `{command}`"
    try:
        scores = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FatalError(f"quality: no corpus scores at {path}; {fix}") from None
    except (OSError, ValueError, EOFError) as e:
        raise FatalError(f"quality: {path} is not a readable score array ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(scores, np.ndarray):  # an .npz
        scores.close()
        raise FatalError(f"quality: {path} holds several arrays, not the model's corpus scores; {fix}")
    if scores.ndim != 1 or scores.dtype.kind != "f" or not np.isfinite(scores).all():
        raise FatalError(f"quality: {path} holds {scores.dtype}{list(scores.shape)}, not finite scores; {fix}")
    if len(scores) == 0:
        raise FatalError(
            f"quality: {path}: the model's corpus sample has no scores, so no percentile cutoff exists; {fix} on "
            "more corpus text (quality.corpus_sample_mb)"
        )
    return scores


def release_models() -> None:
    """Forget the loaded models (the curate driver checks them, then leaves them to the workers)."""
    _load_lm.cache_clear()
    _load_classifier.cache_clear()
    _load_labels.cache_clear()


def prepare_scores(key: str, score: Callable[[list[str]], np.ndarray], docs: list[Document]) -> None:
    """Score `docs` in one model call into each document's cache under `key` (the cache belongs to
    the current text, so an edited document is scored again). perf: each model call pays a fixed
    cost of numpy calls; the perplexity filter ran at 8.8 MB/s one call a document against 12.0
    grouped (6.2 kB documents of the demo corpus, one process)."""
    for doc, value in zip(docs, score([d.text for d in docs]).tolist()):
        doc.cache[key] = value


def cached_score(key: str, score: Callable[[list[str]], np.ndarray], doc: Document) -> float:
    found = doc.cache.get(key)
    if found is None:
        found = doc.cache[key] = float(score([doc.text])[0])
    return found


class PerplexityFilter:
    """Writes meta.perplexity and meta.perplexity_bucket; drops the buckets not kept."""

    name = "perplexity"

    def __init__(self, cfg: PerplexityConfig, folder: Path):
        path = Path(folder) / MODEL
        self.model = _load_lm(path, _mtime(path, TRAIN_LM))
        self.keep, self.max_perplexity = set(cfg.keep), cfg.max_perplexity
        self.cutoffs = tuple(
            float(c) for c in np.percentile(_sorted_scores(Path(folder) / LM_SCORES, TRAIN_LM), cfg.percentiles)
        )

    def prepare(self, docs: list[Document]) -> None:
        prepare_scores(self.name, self.model.perplexities, docs)

    def bucket(self, perplexity: float) -> Bucket:
        return "head" if perplexity <= self.cutoffs[0] else "middle" if perplexity <= self.cutoffs[1] else "tail"

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            perplexity = cached_score(self.name, self.model.perplexities, doc)
            if math.isnan(perplexity):
                ledger.remove(doc, self.name, "no_words", note="no word to score")
                continue
            bucket = self.bucket(perplexity)
            if self.max_perplexity is not None:
                if perplexity > self.max_perplexity:
                    ledger.remove(doc, self.name, "above_max", perplexity, self.max_perplexity)
                    continue
            elif bucket not in self.keep:
                threshold = (
                    self.cutoffs[1] if bucket == "tail" else self.cutoffs[0]
                )  # the boundary the bucket starts (or, for head, ends) at
                ledger.remove(
                    doc,
                    self.name,
                    bucket,
                    perplexity,
                    threshold,
                    note=f"buckets kept: {', '.join(b for b in BUCKETS if b in self.keep)}",
                )
                continue
            yield doc.with_meta(perplexity=round(perplexity, 3), perplexity_bucket=bucket)


class ClassifierFilter:
    """Writes meta.quality_score; drops documents below the cutoff."""

    name = "quality_classifier"

    def __init__(self, cfg: ClassifierFilterConfig, folder: Path):
        path = Path(folder) / MODEL
        self.model = _load_classifier(path, _mtime(path, TRAIN_CLASSIFIER))
        scores = _sorted_scores(
            Path(folder) / CLASSIFIER_SCORES, TRAIN_CLASSIFIER
        )  # read even when unused: a broken model folder stops curate early
        if cfg.min_score is not None:
            self.cutoff, self.rule = cfg.min_score, "below_min_score"
        elif cfg.top_fraction >= 1:
            self.cutoff, self.rule = (
                -math.inf,
                "below_top_fraction",
            )  # everything, even scores below the sample's lowest
        else:
            self.cutoff, self.rule = float(np.quantile(scores, 1 - cfg.top_fraction)), "below_top_fraction"

    def prepare(self, docs: list[Document]) -> None:
        prepare_scores(self.name, self.model.scores, docs)

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            score = cached_score(self.name, self.model.scores, doc)
            if score < self.cutoff:
                ledger.remove(doc, self.name, self.rule, score, self.cutoff)
                continue
            yield doc.with_meta(quality_score=round(score, 6))
