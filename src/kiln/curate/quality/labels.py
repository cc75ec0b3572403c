"""Classifiers trained on any labels: `kiln quality train-labels` and the models the `classifiers` step applies.

A labelled file is JSONL (one object a line) or CSV (a header row) with a text column and a label column:
toxicity (`toxic` / `clean`), NSFW, a topic, or a score on a scale (FineWeb-Edu's 0-5 educational value).
Labels that are all numbers with more than two values are a scale (`kind: auto`); anything else names
classes. A class model is one linear classifier per label (kiln.curate.quality.classifier, one against the
rest, each class weighing half its loss), scoring P(label); a scale model is one classifier fit to the
score mapped onto [0, 1] (logistic regression on soft targets), scoring on the label's own scale. The file
is read whole and checked before any training: a line that is not JSON, a missing or empty text or label,
a single class, each named by file and line. The held-out split (by a hash of each row's id, or its line
number) gives precision, recall and AUC per class, or Pearson and Spearman correlation and mean absolute
error for a scale. Model folder: `labels.json` (kind, labels, scale) and one `model-<i>.npz` per label.
Not handled here: applying the models (kiln.curate.steps.labels), multi-label rows (one label a row).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kiln.core.errors import ConfigError, FatalError
from kiln.curate.quality.classifier import HashedClassifier, evaluate
from kiln.curate.quality.config import ClassifierConfig, LabelledConfig

FORMAT = "kiln-label-model v1"
LABELS_FILE = "labels.json"
Kind = Literal["auto", "classes", "scale"]  # as LabelledConfig.kind


@dataclass(frozen=True)
class Row:
    id: str
    text: str
    label: str | float
    where: str  # file:line


def read_rows(cfg: LabelledConfig) -> list[Row]:
    """Every row of the labelled file, checked; ConfigError naming the file and line of the first bad one."""
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise ConfigError(f"quality.labels: labelled file {str(path)!r} does not exist; fix the path")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Excel's "CSV UTF-8") is not text
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); give JSONL or CSV in UTF-8") from None
    records = _csv_records(text, path, cfg) if path.suffix.lower() == ".csv" else _jsonl_records(text, path)
    rows = []
    for number, record in records:
        where = f"{path}:{number}"
        body, label = record.get(cfg.text_key), record.get(cfg.label_key)
        if not isinstance(body, str) or not body.strip():
            raise ConfigError(f"{where}: no text under {cfg.text_key!r}; every row needs a text (quality.labels)")
        if label is None or isinstance(label, (list, dict)) or (isinstance(label, str) and not label.strip()):
            raise ConfigError(f"{where}: an empty label under {cfg.label_key!r}; every row needs one label")
        row_id = str(record.get(cfg.id_key, "")) if cfg.id_key else f"line-{number}"
        if not row_id:
            raise ConfigError(f"{where}: no id under {cfg.id_key!r} (quality.labels id_key)")
        rows.append(Row(row_id, body, label if isinstance(label, (int, float)) else str(label).strip(), where))
    if not rows:
        raise ConfigError(f"{path}: no labelled rows; give one text and label a line")
    return rows


def _jsonl_records(text: str, path: Path) -> list[tuple[int, dict[str, Any]]]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{number}: not JSON ({e.msg}); one JSON object a line") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path}:{number}: a JSON {type(record).__name__}, not an object with text and label")
        records.append((number, record))
    return records


def _csv_records(text: str, path: Path, cfg: LabelledConfig) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [key for key in (cfg.text_key, cfg.label_key) if key not in header]
    if missing:
        raise ConfigError(
            f"{path}:1: the header {header} has no column {', '.join(map(repr, missing))}; set quality.labels "
            "text_key and label_key to the columns"
        )
    # the line a row starts on (a quoted text may span lines)
    return [(reader.line_num, dict(row)) for row in reader]


def label_kind(rows: list[Row], kind: Kind, path: str) -> tuple[str, list[str], tuple[float, float]]:
    """(classes or scale, the label names, the scale's range) of the rows, checked: two classes at least, or
    a scale of numbers that is not one value."""
    numbers = [_number(r.label) for r in rows]
    distinct = {r.label if isinstance(r.label, str) else _canonical(r.label) for r in rows}
    if kind == "auto":
        kind = "scale" if all(n is not None for n in numbers) and len(distinct) > 2 else "classes"
    if kind == "scale":
        bad = next((r for r, n in zip(rows, numbers) if n is None), None)
        if bad is not None:
            raise ConfigError(f"{bad.where}: label {bad.label!r} is not a number, and kind is scale")
        low, high = min(numbers), max(numbers)  # type: ignore[type-var]
        if low == high:
            raise ConfigError(f"{path}: every label is {low:g}: a scale needs two values or more")
        return "scale", ["score"], (float(low), float(high))  # type: ignore[arg-type]
    if len(distinct) < 2:
        raise ConfigError(
            f"{path}: every row has the label {next(iter(distinct))!r}: a classifier needs two classes or more"
        )
    return "classes", sorted(distinct), (0.0, 1.0)


def _number(label: str | float) -> float | None:
    if isinstance(label, bool):
        return None
    if isinstance(label, (int, float)):
        return float(label) if math.isfinite(label) else None
    try:
        value = float(label)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _canonical(label: float) -> str:
    """A class's name for a number label (`1`, not `1.0`; `true` for JSON true)."""
    if isinstance(label, bool):
        return "true" if label else "false"
    return f"{label:g}"


def class_of(row: Row) -> str:
    return row.label if isinstance(row.label, str) else _canonical(row.label)


class LabelModel:
    """Scores of each label: P(label) for classes, the predicted score on its scale for a scale."""

    def __init__(self, kind: str, labels: list[str], scale: tuple[float, float], models: list[HashedClassifier]):
        assert len(labels) == len(models)
        self.kind, self.labels, self.scale, self.models = kind, labels, scale, models

    @classmethod
    def train(
        cls, rows: list[Row], kind: str, labels: list[str], scale: tuple[float, float], cfg: ClassifierConfig, seed: int
    ) -> LabelModel:
        texts = [r.text for r in rows]
        if kind == "scale":
            low, high = scale
            targets = np.array([(float(r.label) - low) / (high - low) for r in rows])
            return cls(kind, labels, scale, [HashedClassifier.fit(texts, targets, cfg, seed)])
        names = np.array([class_of(r) for r in rows])
        models = [
            HashedClassifier.fit(texts, (names == label).astype(np.float64), cfg, seed, balanced=True)
            for label in labels
        ]
        return cls(kind, labels, scale, models)

    def scores(self, texts: list[str]) -> np.ndarray:
        """[texts, labels]: each label's score of each text."""
        columns = [m.scores(texts) for m in self.models]
        if self.kind == "scale":
            low, high = self.scale
            columns = [low + c * (high - low) for c in columns]
        return np.stack(columns, axis=1) if columns else np.zeros((len(texts), 0))

    def save(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        about, *models = self.files(folder)
        for model, path in zip(self.models, models, strict=True):
            model.save(path)
        spec = {"format": FORMAT, "kind": self.kind, "labels": self.labels, "scale": list(self.scale)}
        about.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        return [about, *models]

    @classmethod
    def load(cls, folder: Path) -> LabelModel:
        fix = "train it again with `kiln quality train-labels`"
        try:
            about = json.loads((folder / LABELS_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FatalError(f"quality: no label model at {folder} (no {LABELS_FILE}); {fix}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FatalError(f"quality: {folder / LABELS_FILE} is not readable ({e}); {fix}") from None
        if not isinstance(about, dict) or about.get("format") != FORMAT:
            raise FatalError(f"quality: {folder / LABELS_FILE} is not a {FORMAT} file; {fix}")
        labels = list(about["labels"])
        models = [HashedClassifier.load(folder / f"model-{i}.npz") for i in range(len(labels))]
        return cls(about["kind"], labels, tuple(about["scale"]), models)

    def files(self, folder: Path) -> list[Path]:
        return [folder / LABELS_FILE, *(folder / f"model-{i}.npz" for i in range(len(self.labels)))]


def held_out_report(model: LabelModel, rows: list[Row]) -> dict[str, Any]:
    """Classes: precision, recall, F1 and AUC of each label (score >= 0.5 predicts it); a scale: Pearson and
    Spearman correlation and mean absolute error."""
    if not rows:
        return {}
    scores = model.scores([r.text for r in rows])
    if model.kind == "scale":
        truth = np.array([float(r.label) for r in rows])
        predicted = scores[:, 0]
        return {
            "rows": len(rows),
            "pearson": round(_pearson(truth, predicted), 4),
            "spearman": round(_pearson(_ranks(truth), _ranks(predicted)), 4),
            "mae": round(float(np.mean(np.abs(truth - predicted))), 4),
        }
    names = np.array([class_of(r) for r in rows])
    per_label = {}
    for j, label in enumerate(model.labels):
        found = evaluate(names == label, scores[:, j])
        per_label[label] = {k: round(v, 4) if math.isfinite(v) else v for k, v in found.items()}
    return {"rows": len(rows), "labels": per_label}


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (Spearman's convention)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / counts[inverse]
