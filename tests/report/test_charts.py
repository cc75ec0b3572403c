"""Reading metrics.jsonl, downsampling with min/max kept, axis ticks and the SVG charts: hand-worked
examples and properties."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.report.series import SOURCE_SAMPLES, STEP_FIELDS, minmax, read_metrics, read_slowly
from kiln.report.svg import Bars, Marker, Series, bar_chart, line_chart, log_ticks, nice_ticks


def test_minmax_keeps_each_buckets_lowest_and_highest_in_step_order() -> None:
    x, y = minmax(np.arange(6), np.array([1.0, 5, 2, 2, 9, 0]), buckets=2)
    assert x.tolist() == [0, 1, 4, 5] and y.tolist() == [1, 5, 9, 0]


def test_minmax_drops_nan_and_leaves_short_series_whole() -> None:
    x, y = minmax(np.arange(4), np.array([1.0, np.nan, 3, 4]), buckets=10)
    assert x.tolist() == [0, 2, 3] and y.tolist() == [1, 3, 4]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=3000), st.integers(1, 200))
def test_minmax_is_an_ordered_subset_with_the_extremes(values: list[float], buckets: int) -> None:
    y = np.array(values)
    xs, ys = minmax(np.arange(len(y)), y, buckets)
    assert len(xs) <= max(2 * buckets, len(y)) and len(xs) <= len(y)
    assert np.all(np.diff(xs) > 0)  # strictly increasing steps: nothing duplicated or reordered
    assert np.array_equal(y[xs], ys)
    assert ys.max() == y.max() and ys.min() == y.min()  # a one-step spike survives


def test_ticks_are_round_numbers_covering_the_range() -> None:
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.13, 0.91) == [0.2, 0.4, 0.6000000000000001, 0.8]
    assert log_ticks(0, 1) == [1, 2, 5, 10]  # 10^0 .. 10^1
    assert log_ticks(-3, 6) == [0.001, 0.01, 0.1, 1, 10, 100, 1000, 10000, 100000, 1000000]


def test_line_chart_escapes_names_and_draws_series_and_markers() -> None:
    svg = line_chart(
        "loss <all>",
        [Series("a&b", [1, 2, 3], [3.0, 2.0, 1.0]), Series("one", [2], [2.5])],
        "step",
        "nats",
        [Marker(2, "step 2: loss is nan")],
    )
    assert "loss &lt;all&gt;" in svg and "a&amp;b" in svg and "<all>" not in svg
    assert svg.count("<polyline") == 1 and svg.count('<circle class="series"') == 1  # one point draws a dot
    assert svg.count('r="2.5"') == 3  # and a short line a dot per point
    assert 'class="marker"' in svg and "loss is nan" in svg
    assert line_chart("empty", [Series("x", [], [])], "step", "y") == ""


def test_bar_chart_skips_missing_values() -> None:
    svg = bar_chart("funnel", Bars(["read", "code/pii"], {"code": [10.0, 8.0], "prose": [5.0, None]}), "documents")
    assert svg.count('class="bar"') == 3


step_records = st.lists(
    st.tuples(
        st.floats(0.01, 20, allow_nan=False),
        st.dictionaries(
            st.sampled_from(["code", "docs", "prose", "ünï"]), st.floats(0.01, 20, allow_nan=False), max_size=3
        ),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(step_records)
def test_the_fast_metrics_reader_agrees_with_the_line_by_line_one(
    records: list[tuple[float, dict[str, float], bool, bool]],
) -> None:
    lines = []
    for step, (loss, by_source, evaluate, rollback) in enumerate(records, 1):
        lines.append(
            json.dumps(
                {
                    "step": step,
                    "loss": loss,
                    "loss_by_source": by_source,
                    "lr": 1e-3,
                    "grad_norm": 1.5,
                    "tokens": 64,
                    "seq_len": 8,
                    "tokens_per_s": 100.0,
                    "mfu": None,
                    "data_wait_s": 0.0,
                    "peak_memory_mb": None,
                    "rollbacks": 0,
                    "elapsed_s": step * 0.1,
                }
            )
        )
        if evaluate:
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        "kind": "periodic",
                        "eval": {"sources": {s: {"loss": v} for s, v in by_source.items()}, "all": {"loss": loss}},
                    }
                )
            )
        if rollback:
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        "kind": "rollback",
                        "rollback": {
                            "at_step": step,
                            "to_step": step - 1,
                            "reason": "loss is nan",
                            "rows": [],
                            "sources": [],
                        },
                    }
                )
            )
    text = "\n".join(lines) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.jsonl"
        path.write_text(text, encoding="utf-8")
        fast, slow = read_metrics(path), read_slowly(path)
    assert fast.steps.tolist() == slow.steps.tolist() == list(range(1, len(records) + 1))
    for name in STEP_FIELDS:
        assert np.array_equal(fast.fields[name], slow.fields[name], equal_nan=True), name
    assert {s: (c.x.tolist(), c.y.tolist()) for s, c in fast.train_loss_by_source.items()} == {
        s: (c.x.tolist(), c.y.tolist()) for s, c in slow.train_loss_by_source.items()
    }
    assert {s: c.y.tolist() for s, c in fast.val_loss.items()} == {s: c.y.tolist() for s, c in slow.val_loss.items()}
    assert fast.rollbacks == slow.rollbacks and len(fast.rollbacks) == sum(r[3] for r in records)
    assert fast.bad_lines == slow.bad_lines == []


def write_metrics(tmp: Path, text: str) -> Path:
    path = tmp / "metrics.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


STEP = (
    '{"step": %d, "loss": 2.5, "loss_by_source": {"a": 2.0}, "lr": 0.001, "grad_norm": 1.0, "tokens": 8, "seq_len": '
    '8, "tokens_per_s": 1.0, "mfu": null, "data_wait_s": 0.0, "peak_memory_mb": null, "rollbacks": 0, "elapsed_s": '
    "1.0}"
)


def test_blank_lines_strange_records_and_torn_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    start = '{"step": 0, "kind": "start", "eval": {"sources": {"a": {"loss": 9.0}}, "all": {"loss": 9.0}}}'
    text = "\n".join([start, "", STEP % 1, '{"foo": 1}', "[1, 2]", STEP % 2]) + "\n"
    for metrics in (read_metrics(write_metrics(tmp_path, text)), read_slowly(tmp_path / "metrics.jsonl")):
        assert metrics.steps.tolist() == [1, 2] and metrics.val_loss["a"].y.tolist() == [9.0]
        assert metrics.bad_lines == [4, 5]  # line 2 is blank; 4 and 5 are JSON but no record of the trainer's
    torn = read_metrics(write_metrics(tmp_path, text + '{"step": 3, "lo'))  # the trainer is writing line 7
    assert torn.steps.tolist() == [1, 2] and torn.bad_lines == [4, 5, 7]
    only_start = read_metrics(write_metrics(tmp_path, start + "\n"))
    assert len(only_start.steps) == 0 and only_start.val_loss["all"].x.tolist() == [0]


def test_per_source_losses_of_a_long_run_are_read_from_evenly_spaced_steps(tmp_path: Path) -> None:
    n = 3 * SOURCE_SAMPLES
    metrics = read_metrics(write_metrics(tmp_path, "".join(STEP % step + "\n" for step in range(1, n + 1))))
    assert len(metrics.steps) == n  # every step's loss
    assert metrics.train_loss_by_source["a"].x.tolist() == list(
        range(1, n + 1, 3)
    )  # every third line's per-source loss
