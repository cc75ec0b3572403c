"""`kiln report`: one self-contained HTML page for a run, at `<run>/report/index.html`.

The page is built from what the run directory holds now: finished stages from their manifests
and audit files, a stage in progress from what it has written so far (training's metrics grow
in `train.partial/`). It is written atomically, so a browser reloading during `--watch` never
sees half a page. Measured on this machine: the demo run's page builds in about 1 s; a synthetic
run of a million steps and a hundred sources in about 10 s, to a page of about 1 MB
(tests/report/test_large_run.py).
Not handled here: serving the page (open the file), runs on remote storage.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kiln.core.atomic import write_atomically
from kiln.report.curation import curation_sections
from kiln.report.html import Section, page
from kiln.report.results import evaluation, lineage, samples, tokenizer
from kiln.report.run_files import Hooks, now_utc, scan_run
from kiln.report.series import read_metrics
from kiln.report.training import metrics_path, training_sections

REPORT_DIR = "report"
INDEX = "index.html"
log = logging.getLogger("kiln.report")


def build_sections(run_dir: Path, hooks: Hooks) -> list[Section]:
    run = scan_run(Path(run_dir))
    path = metrics_path(run)
    metrics = read_metrics(path) if path else None
    train = training_sections(run, metrics, hooks)
    rest = [
        *curation_sections(run, hooks),
        tokenizer(run),
        train[0],  # the realized mixture
        train[1],  # curves
        evaluation(run),
        samples(run, metrics.probes if metrics else []),
        train[2],  # planned and measured
    ]
    return [lineage(run), *rest]  # lineage last: it lists the files the other sections could not read


def build_report(run_dir: Path, hooks: Hooks | None = None) -> Path:
    """Write `<run_dir>/report/index.html` and return its path."""
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    sections = build_sections(run_dir, hooks or Hooks())
    running = sorted(p.name.removesuffix(".partial") for p in run_dir.glob("*.partial") if p.is_dir())
    state = f"; in progress: {', '.join(running)}" if running else ""
    html = page(f"kiln run {run_dir.name}", f"{run_dir.resolve()}, built {now_utc()}{state}", sections)
    out = run_dir / REPORT_DIR / INDEX
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, lambda tmp: tmp.write_text(html, encoding="utf-8"))
    log.info("report: %s (%.0f KB, %.1f s)", out, out.stat().st_size / 1024, time.perf_counter() - t0)
    return out


def watch(run_dir: Path, hooks: Hooks, every_s: float, rounds: int | None = None) -> Path:
    """Rebuild the page every `every_s` seconds until interrupted (or `rounds` times)."""
    done = 0
    while True:
        out = build_report(run_dir, hooks)
        done += 1
        if rounds is not None and done >= rounds:
            return out
        time.sleep(every_s)
