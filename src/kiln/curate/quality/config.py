"""The `quality` recipe section: what reference text the quality models learn from, and how.

`kiln quality train-lm` trains an n-gram language model on the reference text; `kiln quality
train-classifier` trains a linear classifier telling reference text from the raw corpus. Both
are later used by the curate steps `perplexity` and `quality_classifier`.
Not handled here: the models (kiln.curate.quality.ngram, kiln.curate.quality.classifier) and the steps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kiln.core.config import Section
from kiln.core.layout import QUALITY
from kiln.curate.readers.config import InputConfig

LM_DIR, CLASSIFIER_DIR = f"{QUALITY}/lm", f"{QUALITY}/classifier"  # stage folders under the run directory
LABELS_DIR = f"{QUALITY}/labels"  # a labelled classifier's stage: LABELS_DIR/<name>


class NGramConfig(Section):
    order: int = Field(default=5, ge=1, le=8, description="Longest n-gram of the language model, in words (CCNet: 5).")
    fold_digits: bool = Field(
        default=True, description="Fold every digit to 0 before counting, so numbers do not scatter the counts."
    )
    max_train_mb: float = Field(
        default=64.0,
        gt=0,
        description="Reference text the model is trained on, at most (MB of UTF-8 after normalization).",
    )


class ClassifierConfig(Section):
    ngrams: int = Field(
        default=2,
        ge=1,
        le=4,
        description="Word n-grams up to this length are features (fastText's wordNgrams; DCLM: 2).",
    )
    buckets: int = Field(
        default=1 << 20,
        ge=1 << 10,
        le=1 << 26,
        description="Hash buckets the n-gram features fall into (the weight vector's length).",
    )
    epochs: int = Field(default=5, ge=1, description="Passes over the training documents.")
    lr: float = Field(default=0.5, gt=0, description="Adagrad learning rate.")
    l2: float = Field(default=1e-6, ge=0, description="L2 penalty on the weights, per document seen.")
    heldout_fraction: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description=(
            "Fraction of positives and negatives held out (by id hash) for the precision, recall and AUC report."
        ),
    )
    negatives_per_positive: float = Field(
        default=1.0,
        gt=0,
        description="Negatives sampled from the raw corpus per reference document (the corpus sample caps it).",
    )
    max_train_mb: float = Field(
        default=64.0, gt=0, description="Reference text used as positives, at most (MB of UTF-8 after normalization)."
    )


class LabelledConfig(Section):
    path: str = Field(description="The labelled file: JSONL (one object a line) or CSV (.csv, with a header row).")
    text_key: str = Field("text", description="The column (key) holding the text.")
    label_key: str = Field("label", description="The column (key) holding the label.")
    id_key: str | None = Field(
        None, description="A column of row ids for the held-out split; None: the row's line number."
    )
    kind: Literal["auto", "classes", "scale"] = Field(
        "auto", description="classes, scale (numbers: a score), or auto (a scale when numbers of more than 2 values)."
    )
    heldout_fraction: float = Field(
        0.2, gt=0, lt=1, description="Rows held out (by a hash of their id) for the precision, recall or correlation."
    )
    classifier: ClassifierConfig = Field(
        default_factory=ClassifierConfig, description="The linear model's features and training."
    )


class QualityConfig(Section):
    reference_source: str | None = Field(
        default=None,
        description=(
            "The source of curate.inputs whose documents are reference text (e.g. wiki); the other sources are the "
            "raw corpus. Ignored when `reference` is set."
        ),
    )
    reference: tuple[InputConfig, ...] = Field(
        default=(),
        description=(
            "Reference text read from these inputs (same keys as curate.inputs) instead of a source of curate.inputs."
        ),
    )
    corpus_sample_mb: float = Field(
        default=32.0,
        gt=0,
        description=(
            "Raw corpus text (MB, after normalization) drawn from curate.inputs, read task by read task in a seeded "
            "order: the classifier's negatives and the sample the filters' percentile cutoffs come from."
        ),
    )
    seed: int = Field(default=0, ge=0, description="Seed of the corpus sample and of the classifier's training order.")
    lm: NGramConfig = Field(
        default_factory=NGramConfig, description="The n-gram language model of the perplexity filter."
    )
    classifier: ClassifierConfig = Field(
        default_factory=ClassifierConfig, description="The linear classifier of the quality_classifier filter."
    )
    labels: dict[str, LabelledConfig] = Field(
        default_factory=dict,
        description=(
            "Classifiers trained on labelled files by `kiln quality train-labels`, by name (toxicity: {path: "
            "toxic.jsonl}); curate.classifiers applies them."
        ),
    )
