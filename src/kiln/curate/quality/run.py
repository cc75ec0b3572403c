"""The quality stages: `kiln quality train-lm`, `kiln quality train-classifier` and `kiln quality train-labels`.

Each trains one model and writes it with what the curate filters need beside it:
  quality/lm/          model.npz (kiln.curate.quality.ngram), corpus_perplexity.npy, report.json
  quality/classifier/  model.npz (kiln.curate.quality.classifier), corpus_scores.npy, report.json
  quality/labels/<name>/  labels.json, model-<i>.npz (kiln.curate.quality.labels), report.json
`corpus_*.npy` holds the model's scores of a sample of the raw corpus (prose documents; for the
classifier, those it was not trained on), sorted: the filters turn percentiles (perplexity
head/middle/tail, classifier top fraction) into cutoffs from it. The
manifest hashes every file read (reference and corpus sample) and records a hash of the training
text itself; a stage whose inputs and settings are unchanged is not redone, and its model
reloads as is. Not handled here: applying the models (kiln.curate.steps.quality).
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from pydantic import Field

from kiln.core.atomic import save_npy
from kiln.core.config import Section
from kiln.core.document import Document
from kiln.core.errors import FatalError
from kiln.core.manifest import Stage
from kiln.core.split import is_heldout
from kiln.curate.config import CurateConfig
from kiln.curate.quality.classifier import HashedClassifier, evaluate
from kiln.curate.quality.config import (
    CLASSIFIER_DIR,
    LABELS_DIR,
    LM_DIR,
    ClassifierConfig,
    LabelledConfig,
    NGramConfig,
    QualityConfig,
)
from kiln.curate.quality.labels import LabelModel, Row, class_of, held_out_report, label_kind, read_rows
from kiln.curate.quality.ngram import NGramLM
from kiln.curate.quality.sample import read_selection, reference_and_corpus, select
from kiln.curate.readers import InputConfig
from kiln.curate.steps.quality import CLASSIFIER_SCORES, LM_SCORES, MODEL

log = logging.getLogger("kiln.curate.quality")

MIN_REFERENCE_WORDS = 100  # below this an n-gram model or a classifier learns nothing worth filtering with


class CorpusInputs(Section):
    """What of the curate section decides which documents the quality stages read."""

    inputs: tuple[InputConfig, ...] = Field(
        description="curate.inputs: the raw corpus (and the reference source, when it is one of them)."
    )
    max_doc_mb: float = Field(description="curate.max_doc_mb: larger documents are not read.")
    extract_timeout_s: float = Field(description="curate.extract_timeout_s: HTML taking longer to extract is not read.")


def text_digest(docs: list[Document]) -> str:
    """xxh3-128 over the ids and texts, in order: what the model was trained on, beside the file hashes."""
    h = xxhash.xxh3_128()
    for doc in docs:
        h.update(doc.id.encode("utf-8", "surrogatepass") + b"\0" + doc.text.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def describe(docs: list[Document]) -> dict[str, Any]:
    return {
        "docs": len(docs),
        "bytes": sum(len(d.text.encode("utf-8", "surrogatepass")) for d in docs),
        "text_xxh3_128": text_digest(docs),
    }


def _stage(
    run_dir: Path, name: str, quality: QualityConfig, curate: CurateConfig, budgets: tuple[float, float]
) -> tuple[Stage, Any, Any]:
    """The stage, with the reference and corpus selections whose files it hashes."""
    ref_inputs, only, corpus_inputs, without = reference_and_corpus(quality, curate)
    reference = select(ref_inputs, budgets[0], quality.seed, only=only)
    corpus = select(corpus_inputs, budgets[1], quality.seed + 1, without=without)
    # Only what changes this model is hashed: the other model's settings are left at their defaults.
    hashed = quality.model_copy(update={"classifier": ClassifierConfig()} if name == LM_DIR else {"lm": NGramConfig()})
    stage = Stage(
        run_dir,
        name,
        {
            "quality": hashed,
            "curate_inputs": CorpusInputs(
                inputs=curate.inputs, max_doc_mb=curate.max_doc_mb, extract_timeout_s=curate.extract_timeout_s
            ),
        },
        inputs=reference.paths | corpus.paths,
    )
    return stage, reference, corpus


def _reference_docs(selection: Any, budget_mb: float, curate: CurateConfig) -> list[Document]:
    docs = read_selection(selection, budget_mb, curate, "quality: reference")
    words = sum(len(d.text.split()) for d in docs)
    if words < MIN_REFERENCE_WORDS:
        raise FatalError(
            f"quality: the reference text has {len(docs)} documents and {words} words, under {MIN_REFERENCE_WORDS}; "
            "check quality.reference_source / quality.reference (a source with prose in it: code documents are "
            "left out)"
        )
    return docs


def _percentiles(scores: np.ndarray, points: tuple[float, ...] = (10, 30, 50, 60, 90)) -> dict[str, float]:
    return {f"p{p:g}": round(float(np.percentile(scores, p)), 4) for p in points} if len(scores) else {}


def train_lm(quality: QualityConfig, curate: CurateConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    stage, reference, corpus = _stage(
        run_dir, LM_DIR, quality, curate, (quality.lm.max_train_mb, quality.corpus_sample_mb)
    )
    if done := stage.up_to_date(force):
        return done
    ref_docs = _reference_docs(reference, quality.lm.max_train_mb, curate)  # too little reference text stops here
    stage.begin()
    t0 = time.perf_counter()
    model = NGramLM.train((d.text for d in ref_docs), order=quality.lm.order, fold_digits=quality.lm.fold_digits)
    train_s = time.perf_counter() - t0
    model.save(stage.dir / MODEL)
    corpus_docs = read_selection(corpus, quality.corpus_sample_mb, curate, "quality: corpus sample")
    t0 = time.perf_counter()
    ppl = model.perplexities([d.text for d in corpus_docs])
    score_s = time.perf_counter() - t0
    scored = np.sort(ppl[np.isfinite(ppl)])
    if not len(scored):
        raise FatalError(
            f"quality: the corpus sample has no prose document with words ({len(corpus_docs)} read), so no "
            "perplexity percentile exists; check curate.inputs and quality.corpus_sample_mb"
        )
    save_npy(stage.dir / LM_SCORES, scored)
    sample = describe(corpus_docs)
    counts = {
        "reference": describe(ref_docs),
        "corpus_sample": sample,
        "model": model.stats,
        "corpus_perplexity": _percentiles(scored),
        "train_seconds": round(train_s, 2),
        "score_mb_s": round(sample["bytes"] / 1e6 / max(score_s, 1e-9), 2),
    }
    report = stage.dir / "report.json"
    report.write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    summary = (
        f"n-gram LM (order {quality.lm.order}) on {counts['reference']['docs']:,} reference documents "
        f"({counts['reference']['bytes'] / 1e6:.1f} MB) in {train_s:.1f} s\n"
        f"corpus sample: {len(corpus_docs):,} documents, {sample['bytes'] / 1e6:.1f} MB scored at "
        f"{counts['score_mb_s']} MB/s\n"
        "corpus perplexity percentiles: " + ", ".join(f"{k} {v:,.1f}" for k, v in counts["corpus_perplexity"].items())
    )
    return stage.finish([stage.dir / MODEL, stage.dir / LM_SCORES, report], counts, summary)


def train_classifier(
    quality: QualityConfig, curate: CurateConfig, run_dir: Path, force: bool = False
) -> dict[str, Any]:
    cfg = quality.classifier
    stage, reference, corpus = _stage(
        run_dir, CLASSIFIER_DIR, quality, curate, (cfg.max_train_mb, quality.corpus_sample_mb)
    )
    if done := stage.up_to_date(force):
        return done
    positives = _reference_docs(reference, cfg.max_train_mb, curate)  # too little reference text stops here
    stage.begin()
    corpus_docs = read_selection(corpus, quality.corpus_sample_mb, curate, "quality: corpus sample")
    # Negatives are at most half the sample, in a seeded order; the documents not trained on (the
    # rest, and the held-out negatives) are the sample the top-fraction cutoff is taken from: the
    # model scores its own training negatives far lower than unseen text.
    corpus_docs = random.Random(quality.seed).sample(corpus_docs, len(corpus_docs))
    negatives = corpus_docs[: min(round(cfg.negatives_per_positive * len(positives)), len(corpus_docs) // 2)]
    if len(negatives) < 2:
        raise FatalError(
            f"quality: the corpus sample has {len(corpus_docs)} prose documents; the classifier needs at least 4 "
            "(2 negatives, 2 to calibrate): raise quality.corpus_sample_mb or add curate.inputs"
        )
    split = {
        name: (
            [d for d in docs if not is_heldout(d.id, cfg.heldout_fraction)],
            [d for d in docs if is_heldout(d.id, cfg.heldout_fraction)],
        )
        for name, docs in (("positives", positives), ("negatives", negatives))
    }
    (train_pos, held_pos), (train_neg, held_neg) = split["positives"], split["negatives"]
    if not train_pos or not train_neg:
        raise FatalError(
            f"quality: after holding out {cfg.heldout_fraction:.0%}, {len(train_pos)} positives and "
            f"{len(train_neg)} negatives are left to train on; add reference text or lower "
            "quality.classifier.heldout_fraction"
        )
    t0 = time.perf_counter()
    model = HashedClassifier.train([d.text for d in train_pos], [d.text for d in train_neg], cfg, seed=quality.seed)
    train_s = time.perf_counter() - t0
    model.save(stage.dir / MODEL)
    held = held_pos + held_neg
    labels = np.array([1] * len(held_pos) + [0] * len(held_neg))
    metrics = evaluate(labels, model.scores([d.text for d in held])) if len(held_pos) and len(held_neg) else {}
    if not metrics:
        log.warning(
            "quality classifier: no held-out %s; precision, recall and AUC are not measured",
            "positives" if not held_pos else "negatives",
        )
    trained = {d.id for d in train_neg}
    calibration = [d for d in corpus_docs if d.id not in trained]
    t0 = time.perf_counter()
    scores = np.sort(model.scores([d.text for d in calibration]))
    score_s = time.perf_counter() - t0
    save_npy(stage.dir / CLASSIFIER_SCORES, scores)
    calibrated = describe(calibration)
    counts = {
        "positives": describe(positives),
        "negatives": describe(negatives),
        "corpus_sample": describe(corpus_docs),
        "calibration": calibrated,
        "train": {"positives": len(train_pos), "negatives": len(train_neg)},
        "heldout": {k: round(float(v), 4) for k, v in metrics.items()},
        "corpus_score": _percentiles(scores, (50, 90)),
        "train_seconds": round(train_s, 2),
        "score_mb_s": round(calibrated["bytes"] / 1e6 / max(score_s, 1e-9), 2),
    }
    report = stage.dir / "report.json"
    report.write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    held_line = (
        (
            f"held out ({len(held_pos)} positives, {len(held_neg)} negatives): precision {metrics['precision']:.3f}, "
            f"recall {metrics['recall']:.3f}, AUC {metrics['auc']:.3f}"
        )
        if metrics
        else "held out: not measured (one class has no held-out documents)"
    )
    summary = (
        f"classifier ({cfg.ngrams}-grams, {cfg.buckets:,} buckets) on {len(train_pos):,} positives and "
        f"{len(train_neg):,} negatives in {train_s:.1f} s\n"
        f"{held_line}\ncorpus sample not trained on: {len(calibration):,} documents scored at "
        f"{counts['score_mb_s']} MB/s; " + ", ".join(f"score {k} {v:.3f}" for k, v in counts["corpus_score"].items())
    )
    return stage.finish([stage.dir / MODEL, stage.dir / CLASSIFIER_SCORES, report], counts, summary)


def train_labels(quality: QualityConfig, run_dir: Path, force: bool = False) -> dict[str, Any]:
    """`kiln quality train-labels`: each classifier of quality.labels, a stage of its own under quality/labels/
    (skipped when its file and settings are unchanged); every labelled file is read and checked first."""
    if not quality.labels:
        raise FatalError(
            "quality.labels is empty: name a labelled file, e.g. --set 'quality.labels={toxicity: {path: toxic.jsonl}}'"
        )
    checked = {}
    for name, cfg in quality.labels.items():
        rows = read_rows(cfg)
        checked[name] = (rows, *label_kind(rows, cfg.kind, cfg.path))
    results = []
    for name, cfg in quality.labels.items():
        rows, kind, labels, scale = checked[name]
        results.append(_train_one(name, cfg, rows, kind, labels, scale, quality.seed, run_dir, force))
    return results[0] if len(results) == 1 else {"stages": results}


def _train_one(
    name: str,
    cfg: LabelledConfig,
    rows: list[Row],
    kind: str,
    labels: list[str],
    scale: tuple[float, float],
    seed: int,
    run_dir: Path,
    force: bool,
) -> dict[str, Any]:
    # What makes this model: its own settings and the training order's seed (quality.seed), nothing else of quality.
    hashed = QualityConfig(seed=seed, labels={name: cfg})
    stage = Stage(run_dir, f"{LABELS_DIR}/{name}", {"quality": hashed}, inputs=[Path(cfg.path).expanduser()])
    if done := stage.up_to_date(force):
        return done
    stage.begin()
    train = [r for r in rows if not is_heldout(r.id, cfg.heldout_fraction)]
    held = [r for r in rows if is_heldout(r.id, cfg.heldout_fraction)]
    if kind == "scale" and len({float(r.label) for r in train}) < 2:
        raise FatalError(
            f"quality.labels.{name}: after holding out {cfg.heldout_fraction:.0%} of {cfg.path}, the rows left to "
            "train on have one score; add rows or lower heldout_fraction"
        )
    if kind == "classes" and len({class_of(r) for r in train}) < 2:
        raise FatalError(
            f"quality.labels.{name}: after holding out {cfg.heldout_fraction:.0%} of {cfg.path}, one class is left "
            "to train on; add rows or lower heldout_fraction"
        )
    t0 = time.perf_counter()
    model = LabelModel.train(train, kind, labels, scale, cfg.classifier, seed)
    train_s = time.perf_counter() - t0
    files = model.save(stage.dir)
    report = held_out_report(model, held)
    counts = {
        "kind": kind,
        "labels": labels,
        "scale": list(scale),
        "rows": len(rows),
        "train_rows": len(train),
        "per_label": {label: sum(class_of(r) == label for r in rows) for label in labels} if kind == "classes" else {},
        "heldout": report,
        "train_seconds": round(train_s, 2),
    }
    (stage.dir / "report.json").write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    if kind == "scale":
        measured = (
            f"held out ({report.get('rows', 0)} rows): Pearson {report.get('pearson', float('nan')):.3f}, "
            f"Spearman {report.get('spearman', float('nan')):.3f}, mean absolute error {report.get('mae', 0):.3f}"
        )
    else:
        measured = f"held out ({report.get('rows', 0)} rows): " + "; ".join(
            f"{label} precision {m['precision']:.3f}, recall {m['recall']:.3f}, AUC {m['auc']:.3f}"
            for label, m in report.get("labels", {}).items()
        )
    summary = (
        f"{name}: {kind} model ({', '.join(labels)}{f' from {scale[0]:g} to {scale[1]:g}' if kind == 'scale' else ''})"
        f" on {len(train):,} of {len(rows):,} rows of {cfg.path} in {train_s:.1f} s\n{measured}"
    )
    return stage.finish([*files, stage.dir / "report.json"], counts, summary)
