"""`kiln report`: the run's page, with what the report borrows from other stages handed in.

The report package reads manifests and metrics only; this module gives it the run's PII
redaction for removed examples, `kiln curate --explain` for every id shown, the planner's figures
for the trained model (kiln.train_plan) and the order of a run's stages (kiln.verbs). The run's
own recipe.yaml decides the redaction and layout; a recipe kiln can no longer read leaves the
defaults, with a warning. Not handled here: building the page (kiln.report.build).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from kiln.core import storage
from kiln.core.errors import FatalError, KilnError
from kiln.core.layout import CURATE, RunLayout
from kiln.core.mirror import url_of

log = logging.getLogger("kiln")


def report_hooks(run_dir: Path) -> Any:
    """What `kiln report` borrows from other stages: the run's PII redaction for removed examples,
    `kiln curate --explain` for every id shown, the planner's figures for the trained model, and
    the order of the stages."""
    from kiln.curate.explain import explain_many
    from kiln.curate.steps.pii import PIIConfig, RedactPII
    from kiln.recipe import load_recipe
    from kiln.report.run_files import Hooks
    from kiln.train.parallel import ParallelConfig
    from kiln.train_plan import plan_estimate
    from kiln.verbs import stage_order

    layout = RunLayout(run_dir)
    try:  # the run's own recipe; a recipe kiln can no longer read leaves the defaults
        recipe = load_recipe(str(layout.recipe_yaml)) if layout.recipe_yaml.is_file() else None
    except KilnError as e:
        log.warning("report: %s: %s; PII redaction and the layout use their defaults", layout.recipe_yaml, e)
        recipe = None
    pii = RedactPII(recipe.curate.pii if recipe else PIIConfig())
    parallel = recipe.parallel if recipe else ParallelConfig()
    explain = partial(explain_many, layout.stage(CURATE))
    return Hooks(
        redact=lambda text: pii.redact(text)[0],
        explain=explain,
        estimate=partial(plan_estimate, parallel),
        stages=stage_order(),
    )


def build_report(run_dir: Path, watch_s: float | None = None) -> Path:
    """`kiln report`: write <run>/report/index.html; with watch_s, rebuild it every watch_s seconds
    until interrupted."""
    from kiln.report.build import build_report as build
    from kiln.report.build import watch

    url = url_of(run_dir)  # a run in a store is there whether or not this machine's mirror holds any of it
    if not (storage.exists(url + "/") if url is not None else Path(run_dir).is_dir()):
        raise FatalError(
            f"{url or run_dir}: no such run directory; give the run's name with --run NAME (and "
            "runs_dir with --set runs_dir=DIR)"
        )
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    hooks = report_hooks(run_dir)
    return watch(run_dir, hooks, watch_s) if watch_s else build(run_dir, hooks)
