"""What a run directory holds right now, for the report: each stage's manifest, or its unfinished attempt.

A stage that finished has `<stage>/manifest.json`; one that is running (or was stopped) has
`<stage>.partial/in_progress.json`, and the trainer's metrics.jsonl grows in that folder. The
report shows finished outputs, and for a stage in progress what it has written so far, labelled.
A manifest that is not JSON is reported as unreadable, not raised (a report never stops a run).
Not handled here: runs on remote storage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kiln.core.layout import MANIFEST, RunLayout
from kiln.core.manifest import IN_PROGRESS


@dataclass(frozen=True)
class Hooks:
    """What the report needs from other stages' code, handed in by the caller (kiln.report_hooks)."""

    redact: Callable[[str], str] = lambda text: text
    explain: Callable[[list[str]], dict[str, str]] | None = None  # ids -> what `kiln curate --explain` prints
    estimate: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None  # train manifest -> planner figures
    stages: tuple[str, ...] = ()  # stage folders in the order a run makes them (kiln.verbs); others follow by name


@dataclass
class RunFiles:
    root: Path
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[str, Path] = field(default_factory=dict)  # stage -> its .partial folder (an attempt not finished)
    stopped: set[str] = field(
        default_factory=set
    )  # of those, the ones no process holds (<stage>.lock is gone): interrupted
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.root.name

    def stage_dir(self, stage: str) -> Path:
        return RunLayout(self.root).stage(stage)

    def state(self, stage: str) -> str:
        return "interrupted" if stage in self.stopped else "in progress"

    def latest_dir(self, stage: str) -> Path | None:
        """Where the stage's newest files are: the attempt in progress, else the finished folder."""
        if stage in self.running:
            return self.running[stage]
        return self.stage_dir(stage) if stage in self.manifests else None

    def read_json(self, path: Path) -> Any | None:
        """A JSON file of the run, or None when it is missing or damaged (noted in `problems`)."""
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            self.problems.append(f"{path}: not readable as JSON ({e})")
            return None


def scan_run(root: Path) -> RunFiles:
    run = RunFiles(Path(root))
    if not run.root.is_dir():
        return run
    for folder in sorted(run.root.iterdir()):
        if folder.name.endswith(".partial") and (folder / IN_PROGRESS).is_file():
            stage = folder.name.removesuffix(".partial")
            run.running[stage] = folder
            if not (run.root / f"{stage}.lock").is_file():
                run.stopped.add(stage)
        elif "." in folder.name:
            continue  # <stage>.old, train.old-<time>: set aside, not the run's current stages
        elif (folder / MANIFEST).is_file():
            manifest = run.read_json(folder / MANIFEST)
            if isinstance(manifest, dict):
                run.manifests[folder.name] = manifest
    return run


def in_stage_order(stages: Iterable[str], order: Sequence[str]) -> list[str]:
    """These stage folders in the run's order (Hooks.stages); folders it does not name after them, by name."""
    rank = {stage: i for i, stage in enumerate(order)}
    return sorted(stages, key=lambda stage: (rank.get(stage, len(rank)), stage))


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
