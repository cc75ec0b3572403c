"""The `classifiers` step: classifiers trained on labels (`kiln quality train-labels`) as filters or annotations.

Each named model scores every prose document; its scores go into `meta.scores.<name>` (`{label: score}`:
P(label) for a class model, the predicted score for a scale) and a document goes when a label's score
is at or above its `remove_above` threshold (toxic: 0.5) or below its `remove_below` one (a scale such as
educational value: 3, as FineWeb-Edu kept pages predicted 3 or more). A removal is recorded with the
score and the threshold, so `--explain` shows why. Models load once a worker (cached by folder and
modification time) and score a group of documents in one call. A threshold naming a label the model
lacks stops curate before any work, naming the model's labels.
Not handled here: training (kiln.curate.quality.labels), the reference-vs-corpus classifier
(kiln.curate.steps.quality).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from pydantic import Field

from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import ConfigError
from kiln.curate.audit import Ledger
from kiln.curate.quality.labels import LabelModel
from kiln.curate.steps.quality import load_label_model


class LabelFilterConfig(Section):
    model: str | None = Field(
        None, description="The model's folder; None: this run's quality/labels/<name> (kiln quality train-labels)."
    )
    remove_above: dict[str, float] = Field(
        default_factory=dict, description="Remove a document whose score of a label is at or above this (toxic: 0.5)."
    )
    remove_below: dict[str, float] = Field(
        default_factory=dict, description="Remove a document whose score of a label is below this (a scale's score: 3)."
    )


class ClassifiersConfig(Section):
    enabled: bool = Field(True, description="Apply the models below (a no-op while there are none; prose only).")
    models: dict[str, LabelFilterConfig] = Field(
        default_factory=dict,
        description="Models by name, each annotating meta.scores.<name> and removing by its thresholds.",
    )


class LabelFilters:
    """Scores each document with every model; writes meta.scores and drops by the thresholds."""

    name = "classifiers"

    def __init__(self, cfg: ClassifiersConfig):
        self.filters = []
        for name, own in cfg.models.items():
            assert own.model is not None, "curate.classifiers: the run names each model's folder before tasks start"
            model = load_label_model(Path(own.model))
            for key, thresholds in (("remove_above", own.remove_above), ("remove_below", own.remove_below)):
                unknown = sorted(set(thresholds) - set(model.labels))
                if unknown:
                    raise ConfigError(
                        f"curate.classifiers.models.{name}.{key}: {', '.join(unknown)} not a label of {own.model} "
                        f"(its labels: {', '.join(model.labels)})"
                    )
            self.filters.append((name, model, own))

    def prepare(self, docs: list[Document]) -> None:
        """Every model scores the group in one call (as the quality filters do); kept in each document's cache."""
        for name, model, _ in self.filters:
            for doc, row in zip(docs, _rows(model, [d.text for d in docs])):
                doc.cache[f"{self.name}:{name}"] = row

    def process(self, docs: Iterable[Document], ledger: Ledger) -> Iterator[Document]:
        for doc in docs:
            scores: dict[str, dict[str, float]] = {}
            drop = None
            for name, model, own in self.filters:
                row = doc.cache.get(f"{self.name}:{name}")
                if row is None:
                    row = _rows(model, [doc.text])[0]
                found = {label: round(float(v), 4) for label, v in zip(model.labels, row)}
                scores[name] = found
                if drop is None:
                    drop = _verdict(name, found, own)
            if drop is not None:
                rule, value, threshold, note = drop
                ledger.remove(doc, self.name, rule, value, threshold, note=note)
                continue
            yield doc.with_meta(scores={**doc.meta.get("scores", {}), **scores})


def _rows(model: LabelModel, texts: list[str]) -> list[list[float]]:
    """Each text's scores as a list (prepare_scores keeps one value a document)."""
    return np.asarray(model.scores(texts)).tolist()


def _verdict(name: str, scores: dict[str, float], own: LabelFilterConfig) -> tuple[str, float, float, str] | None:
    for label, threshold in own.remove_above.items():
        if scores[label] >= threshold:
            return f"{name}.{label}", scores[label], threshold, f"{label} at or above {threshold:g}"
    for label, threshold in own.remove_below.items():
        if scores[label] < threshold:
            return f"{name}.{label}", scores[label], threshold, f"{label} below {threshold:g}"
    return None
