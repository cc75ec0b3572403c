"""The trainer's metrics.jsonl read into arrays, and series cut down to what a chart can show.

metrics.jsonl (kiln.train.monitor) holds step lines (loss, lr, grad_norm, tokens_per_s, mfu, ...),
evaluation lines (`kind` start/periodic/adaptive/final with `eval`), probe lines, rollback lines
and realized-mixture windows. A million-step run's step columns are read by pyarrow (about 2 s
here) into numpy arrays; `minmax` then keeps, per bucket of steps, the lowest and
the highest point, so a spike of one step survives downsampling where an average would hide it.
A line that is not JSON (a run killed mid-write, a damaged file) is counted and skipped, never fatal.
Not handled here: TensorBoard event files (the same curves, in the same folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

STEP_FIELDS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "data_wait_s",
    "peak_memory_mb",
    "seq_len",
    "tokens",
    "elapsed_s",
)
# Points a chart keeps per series: min and max per bucket, so twice the buckets at most.
CHART_BUCKETS = 400
# Step lines whose per-source losses are read (evenly spaced); the rest of each line is read in full.
SOURCE_SAMPLES = 20000


@dataclass(frozen=True)
class Curve:
    x: np.ndarray
    y: np.ndarray


@dataclass
class TrainMetrics:
    steps: np.ndarray
    fields: dict[str, np.ndarray]
    train_loss_by_source: dict[str, Curve]
    val_loss: dict[str, Curve]  # source (and "all", "objective") -> loss per evaluation
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    mixture: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)  # 1-based numbers of lines that were not JSON records


Points = dict[str, tuple[list[int], list[float]]]  # series name -> (steps, values), as they are read


def add_point(points: Points, name: str, step: int, value: float) -> None:
    xs, ys = points.setdefault(name, ([], []))
    xs.append(step)
    ys.append(float(value))


def curves(points: Points) -> dict[str, Curve]:
    return {name: Curve(np.asarray(x, np.int64), np.asarray(y)) for name, (x, y) in sorted(points.items())}


def read_metrics(path: Path) -> TrainMetrics:
    """The step columns through pyarrow's JSON reader (C++: about 2 s for a million lines here, where
    json.loads line by line takes 12 s); the rare other lines with json; the per-source losses of
    SOURCE_SAMPLES lines evenly spaced through the file. A file pyarrow refuses (a damaged line, a
    NaN) is read line by line instead."""
    data = path.read_bytes()  # once: a growing file must not change between the readings
    schema = pa.schema([("step", pa.int64()), *((name, pa.float64()) for name in STEP_FIELDS)])
    try:
        columns = pa_json.read_json(
            pa.BufferReader(data),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except pa.ArrowInvalid:
        return read_slowly(path)
    steps_only = columns.filter(pc.and_(pc.is_valid(columns["loss"]), pc.is_valid(columns["step"])))
    metrics = TrainMetrics(
        steps_only["step"].to_numpy(),
        {name: steps_only[name].to_numpy(zero_copy_only=False).astype(np.float64) for name in STEP_FIELDS},
        {},
        {},
    )
    by_source: Points = {}
    val: Points = {}
    lines = data.split(b"\n")
    # A step line has "loss" right after its step number; find() with bounds keeps this scan in C (0.3 s a million).
    others = [i for i, line in enumerate(lines) if line.find(b'"loss": ', 0, 40) < 0 and line.strip()]
    for i in others:
        try:
            add_other(metrics, json.loads(lines[i]), val)
        except (ValueError, KeyError, TypeError, AttributeError):
            metrics.bad_lines.append(i + 1)  # valid JSON (pyarrow read it), but not a record the trainer writes
    sampled = (
        range(len(lines))
        if len(lines) <= SOURCE_SAMPLES
        else sorted({i * len(lines) // SOURCE_SAMPLES for i in range(SOURCE_SAMPLES)})
    )
    for i in sampled:
        if lines[i].find(b'"loss": ', 0, 40) < 0:
            continue  # not a step line (evenly spaced lines land on an evaluation line now and then)
        record = json.loads(lines[i])
        for source, value in (record.get("loss_by_source") or {}).items():
            add_point(by_source, source, int(record["step"]), value)
    metrics.train_loss_by_source, metrics.val_loss = curves(by_source), curves(val)
    return metrics


def add_other(metrics: TrainMetrics, record: dict[str, Any], val: Points) -> None:
    """An evaluation, rollback, mixture-window or probe line into `metrics` (validation losses into `val`)."""
    step = int(record["step"])
    if "eval" in record:
        results = record["eval"]
        named = {
            **{s: r["loss"] for s, r in results.get("sources", {}).items()},
            "all": results.get("all", {}).get("loss"),
        }
        if "objective" in results:
            named["objective"] = results["objective"]["loss"]
        for source, value in named.items():
            if value is not None:
                add_point(val, source, step, value)
    elif record.get("kind") == "rollback":
        metrics.rollbacks.append(record["rollback"])
    elif "mixture" in record:
        metrics.mixture.append(record["mixture"])
    elif record.get("kind") == "probe":
        metrics.probes.append({"step": step, **record["probe"]})


def read_slowly(path: Path) -> TrainMetrics:
    """Line by line with json: every line checked, the damaged ones counted."""
    steps: list[int] = []
    columns: dict[str, list[float]] = {name: [] for name in STEP_FIELDS}
    by_source: Points = {}
    val: Points = {}
    metrics = TrainMetrics(np.zeros(0, np.int64), {}, {}, {})
    nan = float("nan")
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError):
                if line.strip():
                    metrics.bad_lines.append(number)
                continue
            if "loss" in record:
                steps.append(step)
                for name in STEP_FIELDS:
                    value = record.get(name)
                    columns[name].append(nan if value is None else float(value))
                for source, value in (record.get("loss_by_source") or {}).items():
                    add_point(by_source, source, step, value)
            else:
                try:
                    add_other(metrics, record, val)
                except (ValueError, KeyError, TypeError, AttributeError):
                    metrics.bad_lines.append(number)
    metrics.steps = np.asarray(steps, dtype=np.int64)
    metrics.fields = {name: np.asarray(values, dtype=np.float64) for name, values in columns.items()}
    metrics.train_loss_by_source, metrics.val_loss = curves(by_source), curves(val)
    return metrics


def minmax(x: np.ndarray, y: np.ndarray, buckets: int = CHART_BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """At most 2 x `buckets` points of (x, y) in x order: each bucket's lowest and highest y.

    Non-finite y (a NaN loss) are dropped here; the chart marks such steps from the rollback lines.
    Worked example: y = [1, 5, 2, 2, 9, 0] in 2 buckets keeps [1, 5] and [9, 0] (x order kept).
    """
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) <= 2 * buckets:
        return x, y
    bucket = np.arange(len(x)) * buckets // len(x)
    order = np.lexsort((y, bucket))  # by bucket, then by y: each bucket's first is its min, last its max
    starts = np.flatnonzero(np.r_[True, np.diff(bucket[order]) != 0])
    ends = np.r_[starts[1:], len(order)] - 1
    chosen = np.unique(np.concatenate([order[starts], order[ends]]))  # back in x order
    return x[chosen], y[chosen]
