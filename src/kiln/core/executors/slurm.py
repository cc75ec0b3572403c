"""The Slurm executor: a stage's shard tasks as one Slurm job array, on a cluster with a shared disk.

The recipe's `slurm` section describes the cluster once for every stage (partition, account, QoS,
time, CPUs and memory per task, extra sbatch arguments, a setup command). `imap_unordered` writes
the task function and each task, pickled, into a folder of `slurm.jobs_dir`, submits one array
(`--array=0-N%workers`, each element running `python -m kiln.core.executors.slurm FOLDER INDEX`
with this Python, in the submitting environment), and yields each element's result as its file
appears. An element that raised leaves its traceback: the phase fails naming the element's log. An
element that left the queue with neither (killed, preempted, its node lost, out of time) is submitted
again, up to `max_retries` times; tasks redo their output from scratch, so nothing counts twice. A
relaunch of the stage skips finished tasks through the stage's own completion markers, as on the
other executors. Plain sbatch and squeue calls: no library between kiln and the cluster's commands.
Not handled here: a run with no shared disk (the folder must be readable from every node), training
jobs (kiln.train), chains of stages.
"""

from __future__ import annotations

import logging
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from kiln.core.config import Section
from kiln.core.errors import FatalError

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("kiln.executors")

POLL_S = 0.5  # how often the driver looks for results and asks squeue (a task takes seconds to minutes)


class SlurmConfig(Section):
    """The Slurm cluster every stage with `executor.kind: slurm` submits to."""

    partition: str | None = Field(default=None, description="Partition (sbatch --partition); None: the default.")
    account: str | None = Field(default=None, description="Account charged (sbatch --account).")
    qos: str | None = Field(default=None, description="Quality of service (sbatch --qos).")
    time: str | None = Field(
        default=None, description="Time limit per array element (sbatch --time, e.g. 2:00:00); None: the partition's."
    )
    cpus_per_task: int = Field(default=1, ge=1, description="CPUs per array element (sbatch --cpus-per-task).")
    mem: str | None = Field(default=None, description="Memory per array element (sbatch --mem, e.g. 4G).")
    sbatch_args: list[str] = Field(
        default_factory=list, description="More sbatch arguments, each as one word (e.g. --constraint=cpu)."
    )
    setup: str | None = Field(
        default=None,
        description="Shell lines run before each element's task (module load ..., source venv/bin/activate).",
    )
    status_every_s: float = Field(
        default=30.0, gt=0, description="Seconds between the driver's lines of tasks done, running and pending."
    )
    jobs_dir: str = Field(
        default="kiln-slurm",
        description=(
            "Folder for the arrays' pickled tasks, results and logs, one subfolder per array; on a disk every node "
            "reads (relative: to the folder kiln runs in)."
        ),
    )


_config = SlurmConfig()


def configure(cfg: SlurmConfig) -> None:
    """Use `cfg` for the arrays this process submits (the recipe's slurm section, set as it loads)."""
    global _config
    _config = cfg


def sbatch_lines(cfg: SlurmConfig, folder: Path, n_tasks: int, workers: int | None, name: str) -> list[str]:
    """The array script's #SBATCH header and body for `n_tasks` elements, at most `workers` at once."""
    cap = f"%{workers}" if workers else ""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array=0-{n_tasks - 1}{cap}",
        f"#SBATCH --output={folder}/log-%a.txt",
        f"#SBATCH --cpus-per-task={cfg.cpus_per_task}",
        *(
            f"#SBATCH --{key}={value}"
            for key in ("partition", "account", "qos", "time", "mem")
            if (value := getattr(cfg, key))
        ),
        *(f"#SBATCH {arg}" for arg in cfg.sbatch_args),
        *([cfg.setup] if cfg.setup else []),
        f"exec {shlex.quote(sys.executable)} -m kiln.core.executors.slurm {shlex.quote(str(folder))} "
        '"$SLURM_ARRAY_TASK_ID"',
    ]
    return lines


def submit(script: Path, indices: str | None = None) -> str:
    """The job id of `script` submitted with sbatch (`indices`: the array's elements, when not the script's)."""
    if shutil.which("sbatch") is None:
        raise FatalError("executor slurm: sbatch is not on PATH; run kiln on a Slurm login node, or set executor.kind")
    cmd = ["sbatch", "--parsable", *([f"--array={indices}"] if indices else []), str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FatalError(f"executor slurm: sbatch refused {script}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def queued(job: str) -> dict[int, str]:
    """The array elements of `job` still in the queue, each with its state (PENDING, RUNNING, ...)."""
    done = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%K %T"], capture_output=True, text=True)
    if done.returncode != 0:  # squeue names a job that left the queue as an error: nothing of it is queued
        return {}
    rows = (line.split() for line in done.stdout.splitlines())
    return {int(row[0]): row[1] for row in rows if len(row) == 2 and row[0].isdigit()}


class SlurmExecutor:
    """Tasks as Slurm job arrays; `workers` caps the elements running at once (None: the cluster decides)."""

    def __init__(self, workers: int | None, section: str, max_retries: int = 3):
        self.workers = workers or 1
        self.cap, self.section, self.max_retries = workers, section, max_retries
        self._jobs: list[str] = []

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if not tasks:
            return
        cfg = _config
        folder = Path(cfg.jobs_dir).absolute() / f"{self.section.replace('.', '-')}-{uuid.uuid4().hex[:8]}"
        folder.mkdir(parents=True)
        (folder / "fn.pkl").write_bytes(pickle.dumps(fn))
        for i, task in enumerate(tasks):
            (folder / f"task-{i}.pkl").write_bytes(pickle.dumps(task))
        script = folder / "array.sh"
        script.write_text("\n".join(sbatch_lines(cfg, folder, len(tasks), self.cap, f"kiln-{self.section}")) + "\n")
        job = submit(script)
        self._jobs.append(job)
        log.info("%s: %d tasks as Slurm array %s (logs %s/log-*.txt)", self.section, len(tasks), job, folder)
        left = set(range(len(tasks)))
        tries = dict.fromkeys(left, 0)
        jobs = {i: job for i in left}
        said = time.monotonic()
        try:
            while left:
                time.sleep(POLL_S)
                states = {i: st for j in {jobs[i] for i in left} for i, st in queued(j).items() if jobs.get(i) == j}
                running = set(states)
                if time.monotonic() - said >= cfg.status_every_s:
                    said = time.monotonic()
                    counts = {state: list(states.values()).count(state) for state in ("RUNNING", "PENDING")}
                    log.info(
                        "%s: Slurm array %s: %d of %d tasks done, %d running, %d pending, %d submitted again "
                        "(logs %s/log-*.txt)",
                        self.section,
                        job,
                        len(tasks) - len(left),
                        len(tasks),
                        counts["RUNNING"],
                        counts["PENDING"],
                        sum(tries.values()),
                        folder,
                    )
                for i in sorted(left):
                    result, error = folder / f"result-{i}.pkl", folder / f"error-{i}.txt"
                    if result.is_file():
                        left.discard(i)
                        yield pickle.loads(result.read_bytes())
                    elif error.is_file():
                        raise FatalError(
                            f"{self.section}: task {i} of Slurm array {jobs[i]} failed: "
                            f"{error.read_text().strip().splitlines()[-1]} (log {folder}/log-{i}.txt)"
                        )
                    elif i not in running:
                        tries[i] += 1
                        if tries[i] > self.max_retries:
                            raise FatalError(
                                f"{self.section}: task {i} of Slurm array {jobs[i]} ended without a result "
                                f"{tries[i]} times (killed, preempted, out of time or its node lost); see "
                                f"{folder}/log-{i}.txt"
                            )
                        jobs[i] = submit(script, str(i))
                        self._jobs.append(jobs[i])
                        log.warning(
                            "%s: task %d of the Slurm array left the queue without a result; submitted again as %s "
                            "(try %d of %d)",
                            self.section,
                            i,
                            jobs[i],
                            tries[i],
                            self.max_retries,
                        )
        finally:
            if left:  # a failed task or a closed generator: nothing more of this array runs
                subprocess.run(["scancel", *sorted(set(self._jobs))], capture_output=True)
        shutil.rmtree(folder)  # every result read: the logs of a finished array are not kept

    def close(self) -> None:
        self._jobs.clear()


def run_element(folder: Path, index: int) -> int:
    """One array element: run its task, leave its result (or its traceback) where the driver looks."""
    try:
        # subtle: unpickling is inside: a function this Python cannot import is the task's error, said once,
        # not an element that dies without a word and is submitted again max_retries times
        fn = pickle.loads((folder / "fn.pkl").read_bytes())
        task: Any = pickle.loads((folder / f"task-{index}.pkl").read_bytes())
        result = fn(task)
    except BaseException:  # the driver reads it and fails the phase, naming this element's log
        (folder / f"error-{index}.txt").write_text(traceback.format_exc())
        raise
    partial = folder / f"result-{index}.pkl.partial"
    partial.write_bytes(pickle.dumps(result))
    os.replace(partial, folder / f"result-{index}.pkl")  # whole or absent: the driver never reads half
    return 0


if __name__ == "__main__":
    sys.exit(run_element(Path(sys.argv[1]), int(sys.argv[2])))
