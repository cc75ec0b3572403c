"""Report sections on training: the realized mixture against the intended one, the curves (loss,
validation per source, lr, grad norm, tokens/s, MFU) with rollbacks and spikes marked, and the
planner's estimate beside what the run measured.

They read train's metrics.jsonl, from `train.partial/` while the run is going, and its manifest
once it has finished. Curves are downsampled with min/max kept (kiln.report.series), so a page for
a million steps holds a few thousand points per chart.
Not handled here: TensorBoard's event files, and runs whose metrics.jsonl was deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kiln.core.errors import KilnError
from kiln.core.layout import TRAIN
from kiln.report.html import CHART_SOURCES, Section, missing, para, table
from kiln.report.run_files import Hooks, RunFiles
from kiln.report.series import TrainMetrics, minmax
from kiln.report.svg import Marker, Series, line_chart

PER_SOURCE_BUCKETS = 150  # per-source curves are thinner than the main loss curve


def metrics_path(run: RunFiles) -> Path | None:
    """train's metrics.jsonl: in train.partial/ while a run is going, else in train/."""
    where = run.latest_dir(TRAIN)
    return where / "metrics.jsonl" if where and (where / "metrics.jsonl").is_file() else None


def training_sections(run: RunFiles, metrics: TrainMetrics | None, hooks: Hooks) -> list[Section]:
    path = metrics_path(run)
    if metrics is None or path is None:
        why = (
            "training has started but written no step yet"
            if TRAIN in run.running
            else "training has not run in this run directory (kiln train)"
        )
        return [Section(sid, missing(why)) for sid in ("mixture", "training", "throughput")]
    manifest = run.manifests.get(TRAIN) if TRAIN not in run.running else None
    state = (
        para(f"Training {run.state(TRAIN)}: {len(metrics.steps):,} steps so far (read from {path}).", "missing")
        if manifest is None
        else ""
    )
    damaged = (
        para(
            (
                f"{len(metrics.bad_lines):,} line(s) of {path.name} are not JSON records and were skipped (first: "
                f"line {metrics.bad_lines[0]})."
            ),
            "missing",
        )
        if metrics.bad_lines
        else ""
    )
    return [
        mixture(metrics, manifest),
        Section("training", state + damaged + curves(metrics)),
        throughput(metrics, manifest, hooks),
    ]


def top_sources(metrics: TrainMetrics) -> list[str]:
    """The CHART_SOURCES sources drawn in the most steps (of those read for per-source losses)."""
    counts = {s: len(c.x) for s, c in metrics.train_loss_by_source.items()}
    return sorted(counts, key=lambda s: -counts[s])[:CHART_SOURCES]


def mixture(metrics: TrainMetrics, manifest: dict[str, Any] | None) -> Section:
    windows = metrics.mixture
    if not windows and manifest is None:
        return Section("mixture", missing("No window of the mixture report has closed yet (train.mix report_windows)."))
    sources = sorted(
        {s for w in windows for s in w["tokens"]}, key=lambda s: -sum(w["tokens"].get(s, 0) for w in windows)
    )
    ends = [w["steps"][1] for w in windows]
    series = []
    for s in sources[:CHART_SOURCES]:
        series.append(Series(f"{s} realized", ends, [w["share"].get(s, 0.0) for w in windows]))
        series.append(Series(f"{s} intended", ends, [w["intended"].get(s, 0.0) for w in windows], dashed=True))
    chart = (
        line_chart(
            "Share of tokens per source, per window of steps",
            series,
            "step (window end)",
            "share of the window's tokens",
        )
        if len(windows) > 0
        else ""
    )
    rows = []
    planned = (manifest or {}).get("counts", {}).get("mixture", {}).get("planned", {})
    read = (manifest or {}).get("counts", {}).get("tokens_by_source") or {
        s: sum(w["tokens"].get(s, 0) for w in windows) for s in sources
    }
    planned_total, read_total = max(sum(p["tokens"] for p in planned.values()), 1), max(sum(read.values()), 1)
    for s in sorted(set(planned) | set(read), key=lambda s: -read.get(s, 0)):
        p = planned.get(s, {})
        rows.append(
            [
                s,
                p.get("tokens"),
                f"{p['tokens'] / planned_total:.1%}" if p else "",
                read.get(s, 0),
                f"{read.get(s, 0) / read_total:.1%}",
                p.get("epochs"),
            ]
        )
    body = (
        chart
        + para(
            "Solid: the share each source gave in the window; dashed: the share the mixture's schedule asked for.",
            "note",
        )
        if chart
        else ""
    )
    body += table(["source", "planned tokens", "planned share", "tokens read", "share read", "planned epochs"], rows)
    return Section("mixture", body)


def markers(metrics: TrainMetrics) -> list[Marker]:
    """Each rollback at the step that faulted: a spike in orange, NaN/Inf in red."""
    return [
        Marker(
            r["at_step"],
            f"step {r['at_step']}: {r['reason']}; rolled back to step {r['to_step']}",
            "#ee7733" if str(r["reason"]).startswith("loss spike") else "#cc3311",
        )
        for r in metrics.rollbacks
    ]


def curves(metrics: TrainMetrics) -> str:
    steps, f, marks = metrics.steps, metrics.fields, markers(metrics)

    def one(name: str, key: str, y_label: str, log_y: bool = False) -> str:
        x, y = minmax(steps, f[key])
        return line_chart(name, [Series(key, x, y)], "step", y_label, marks, log_y)

    parts = []
    loss_x, loss_y = minmax(steps, f["loss"])
    per_source = [
        Series(s, *minmax(metrics.train_loss_by_source[s].x, metrics.train_loss_by_source[s].y, PER_SOURCE_BUCKETS))
        for s in top_sources(metrics)
    ]
    parts.append(
        line_chart("Training loss", [Series("all", loss_x, loss_y), *per_source], "step", "nats per token", marks)
    )
    val = metrics.val_loss
    val_sources = [
        "all",
        *sorted((s for s in val if s not in ("all", "objective")), key=lambda s: -len(val[s].x))[:CHART_SOURCES],
    ]
    val_series = [Series(s, *minmax(val[s].x, val[s].y, PER_SOURCE_BUCKETS)) for s in val_sources if s in val]
    if "objective" in val:
        val_series.append(
            Series("objective", *minmax(val["objective"].x, val["objective"].y, PER_SOURCE_BUCKETS), dashed=True)
        )
    parts.append(
        line_chart("Validation loss per source", val_series, "step", "nats per token", marks)
        or para("No validation has run yet (train.eval_every).", "note")
    )
    parts.append(one("Learning rate", "lr", "lr"))
    parts.append(one("Gradient norm before clipping", "grad_norm", "global L2 norm", log_y=True))
    parts.append(one("Tokens per second", "tokens_per_s", "tokens/s (all ranks)"))
    if np.isfinite(f["mfu"]).any():
        parts.append(one("Model FLOPs utilization", "mfu", "MFU"))
    else:
        parts.append(
            para(
                (
                    "MFU: not reported; it needs the device's dense peak, known for the listed GPUs only (this run "
                    "logged none)."
                ),
                "note",
            )
        )
    if np.isfinite(f["peak_memory_mb"]).any():
        parts.append(one("Peak memory per step", "peak_memory_mb", "MiB allocated (CUDA)"))
    parts.append(one("Time waiting for data", "data_wait_s", "seconds per step"))
    if metrics.rollbacks:
        rows = [
            [
                r["at_step"],
                r["to_step"],
                r["reason"],
                ", ".join(map(str, r.get("rows", [])[:8])),
                ", ".join(sorted(set(r.get("sources", [])))),
            ]
            for r in metrics.rollbacks
        ]
        parts.append(
            "<h3>Rollbacks</h3>"
            + table(["faulting step", "rolled back to", "reason", "skipped rows", "their sources"], rows)
        )
    else:
        parts.append(para("No rollback: no NaN, Inf or loss spike was met.", "note"))
    latest = {s: float(c.y[-1]) for s, c in val.items() if len(c.y)}
    if latest:
        parts.append(
            "<h3>Latest validation loss per source</h3>"
            + table(
                ["source", "loss (nats/token)", "at step"],
                [[s, round(v, 4), int(val[s].x[-1])] for s, v in sorted(latest.items())],
            )
        )
    return "".join(parts)


def throughput(metrics: TrainMetrics, manifest: dict[str, Any] | None, hooks: Hooks) -> Section:
    f = metrics.fields
    measured_tps = f["tokens_per_s"][1:] if len(f["tokens_per_s"]) > 1 else f["tokens_per_s"]  # step 1 pays for warm-up
    wall = f"{f['elapsed_s'][-1]:,.1f}" if len(f["elapsed_s"]) else ""
    rows: list[list[object]] = [
        ["tokens per second (median over steps)", f"{np.nanmedian(measured_tps):,.0f}" if len(measured_tps) else "", ""]
    ]
    if np.isfinite(f["mfu"]).any():
        rows.append(["MFU (median)", f"{np.nanmedian(f['mfu']):.1%}", ""])
    peak = f["peak_memory_mb"]
    rss = (manifest or {}).get("counts", {}).get("max_rss_mb")
    measured_memory = (
        f"{np.nanmax(peak) / 1024:.2f} GiB allocated (CUDA peak)"
        if np.isfinite(peak).any()
        else "no allocator peak on a CPU"
        + (
            (
                f"; the process's peak resident memory was {rss / 1024:.2f} GiB (weights, optimizer, activations, and "
                "the Python and torch runtime)"
            )
            if rss
            else ""
        )
    )
    estimate, why = None, "no estimate"
    if hooks.estimate and manifest:
        try:
            estimate = hooks.estimate(manifest)
        except (
            KeyError,
            TypeError,
            ValueError,
            KilnError,
        ) as e:  # a manifest from an older kiln, a shape the planner refuses
            why = f"no estimate: {type(e).__name__}: {e}"
    elif manifest is None:
        why = "the planner's estimate appears when training has finished"
    if estimate and manifest:
        counts = manifest["counts"]
        rows.insert(
            0, ["device", f"{counts.get('device_name') or counts.get('device', '')} x {counts.get('processes', 1)}", ""]
        )
        rows.append(["memory per device", measured_memory, f"{estimate['memory_gb']:.3f} GB ({estimate['layout']})"])
        rows.append(
            [
                "training FLOPs",
                f"{counts['train_flops']:.3e}",
                f"{estimate['train_flops']:.3e} ({estimate['flops_per_token']:,} per token)",
            ]
        )
        rows.append(["time of the steps (s)", wall, estimate["time_note"]])
    else:
        rows += [["memory per device", measured_memory, why], ["time of the steps (s)", wall, ""]]
    return Section("throughput", table(["", "measured", "planner (kiln plan)"], rows))
