"""A curate job: one task of one phase, carrying the function it runs and only the settings that phase reads.

`Phase` names a phase (its folder under work/ and its progress label) and holds its function, a
module-level function so that a job pickles for the process pool and for Ray. `Job` adds the task's
index (a read task's, or a partition's), the stage's scratch folder (`WorkDir`), the phase's
settings (a small frozen record per phase, kiln.curate.phases) and, for the per-read-task phases,
the read task. `WorkDir` is the one place the scratch layout is spelled:
work/<phase>/<index:05d><suffix> for a task's files (its `.done` marker last), and the few files
between phases (the boilerplate line list, the decontamination index, the MinHash assignment).
Not handled here: what a phase does and what its files hold (kiln.curate.phases; the dedup modules
name the files inside the folders they are given), and running jobs (kiln.curate.run).
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from kiln.core.atomic import write_atomically
from kiln.curate.readers import ReadTask

S = TypeVar("S")


@dataclass(frozen=True)
class WorkDir:
    """The scratch folder of a curate stage, `<stage_dir>/work`, removed when the stage finishes."""

    stage_dir: Path

    @property
    def root(self) -> Path:
        return self.stage_dir / "work"

    def phase(self, name: str) -> Path:
        """The folder of one phase's task files."""
        return self.root / name

    def file(self, phase: str, index: int, suffix: str) -> Path:
        """A file of task (or partition) `index` of `phase`: work/<phase>/<index:05d><suffix>."""
        return self.root / phase / f"{index:05d}{suffix}"

    @property
    def boilerplate(self) -> Path:
        """The boilerplate line keys, merged from the lines phase's partitions (kiln.curate.run)."""
        return self.root / "lines" / "boilerplate.npy"

    @property
    def decontamination_index(self) -> Path:
        """The folder of the decontamination index (kiln.curate.dedup.ngram_index.build_index)."""
        return self.root / "decontaminate"

    @property
    def assignments(self) -> Path:
        """The MinHash cluster of every clustered document, the components phase's one output."""
        return self.root / "components" / "assign.parquet"


@dataclass(frozen=True)
class Phase(Generic[S]):
    """A phase of the curate stage: its name (its folder under work/, its progress label) and the function
    that runs one of its jobs, returning the job's marker content."""

    name: str
    run: Callable[[Job[S]], dict[str, Any]]


@dataclass(frozen=True)
class Job(Generic[S]):
    """One task of one phase. `index` is the read task's index, or the partition's."""

    phase: Phase[S]
    index: int
    work: WorkDir
    settings: S
    task: ReadTask | None = None  # the read task, for the phases that run one job per read task

    @property
    def folder(self) -> Path:
        return self.work.phase(self.phase.name)

    def file(self, suffix: str) -> Path:
        """This job's file with `suffix` in its phase's folder."""
        return self.work.file(self.phase.name, self.index, suffix)

    @property
    def marker(self) -> Path:
        return self.file(".done")

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the completion marker (after every other output of the task) and return its content,
        with the process's peak resident memory so far (the phase's memory figure)."""
        summary = {**summary, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        write_atomically(self.marker, lambda p: p.write_text(json.dumps(summary, ensure_ascii=False), encoding="utf-8"))
        return summary


def run_job(job: Job[Any]) -> tuple[int, dict[str, Any]]:
    """The executor's entry point: run the job's phase function on it; return its index and marker content."""
    return job.index, job.phase.run(job)
