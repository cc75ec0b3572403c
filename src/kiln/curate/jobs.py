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

A run on a store (kiln.core.mirror): a job may run on any machine. `WorkDir` then names the stage
folder by its place in the mirror, which each machine resolves to its own mirror; `run_job` first
downloads the files the phase reads (`Phase.reads`, globs under work/), and after the phase uploads
the job's own files (those named for its index, and what its summary lists under `files`), its
completion marker last. So the store holds every finished task, a re-run on any machine resumes
from it, and a task run twice (its worker died) writes the same names again: nothing counts twice.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from kiln.core.atomic import write_atomically
from kiln.core.mirror import local_path, pull, push_files
from kiln.core.storage import task_traffic, traffic_since
from kiln.curate.readers import ReadTask

S = TypeVar("S")


@dataclass(frozen=True)
class WorkDir:
    """The scratch folder of a curate stage, `<stage_dir>/work`, removed when the stage finishes."""

    path: Path  # the stage folder, on the machine that planned the run
    place: tuple[str, str] | None = None  # a run on a store: the folder's place in the mirror (kiln.core.mirror)

    @property
    def stage_dir(self) -> Path:
        """The stage folder on the machine running this code (its own mirror, for a run on a store)."""
        return self.path if self.place is None else local_path(self.place)

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
    # Globs under work/ of the files it reads (fetched first in a run on a store); module-level, so a job pickles.
    reads: Callable[[Job[S]], list[str]] | None = None


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

    def own_files(self, summary: dict[str, Any]) -> list[Path]:
        """The files this job wrote: in its phase's folder (at any depth) those named for its index (or for
        no task, as the one-job components phase names its output), and those its summary lists under
        `files` (paths relative to the stage folder); the marker last."""
        prefix = f"{self.index:05d}"
        found = [
            p
            for p in self.folder.rglob("*")
            if p.is_file() and p != self.marker and (p.name.startswith(prefix) or not p.name[:5].isdigit())
        ]
        return sorted(found) + [self.work.stage_dir / f for f in summary.get("files", [])] + [self.marker]

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the completion marker (after every other output of the task) and return its content,
        with the process's peak resident memory so far (the phase's memory figure)."""
        summary = {**summary, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        write_atomically(self.marker, lambda p: p.write_text(json.dumps(summary, ensure_ascii=False), encoding="utf-8"))
        return summary


def run_job(job: Job[Any]) -> tuple[int, dict[str, Any]]:
    """The executor's entry point: run the job's phase function on it; return its index and marker content.
    A run on a store: the phase's reads are fetched first, the job's files and marker stored after."""
    before = traffic_since()
    if job.work.place is None:
        return job.index, {**job.phase.run(job), "traffic": task_traffic(before)}
    job.folder.mkdir(parents=True, exist_ok=True)
    pull(job.work.root, job.phase.reads(job) if job.phase.reads else [])
    summary = job.phase.run(job)
    push_files(job.work.stage_dir, job.own_files(summary))
    return job.index, {**summary, "traffic": task_traffic(before)}


def finished(jobs: list[Job[Any]]) -> dict[int, dict[str, Any]]:
    """The marker content of every job that finished earlier: its marker is in the mirror (a local run),
    or on the store (a run on one: fetched; a marker this machine has but the store lacks does not count)."""
    if not jobs:
        return {}
    work, phase = jobs[0].work, jobs[0].phase.name
    stored = None if work.place is None else set(pull(work.root, [f"{phase}/*.done"]))
    return {
        job.index: json.loads(job.marker.read_text(encoding="utf-8"))
        for job in jobs
        if job.marker.is_file() and (stored is None or f"{phase}/{job.marker.name}" in stored)
    }
