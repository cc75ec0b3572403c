"""The Slurm executor: a stage's shard tasks as Slurm job arrays, with the run on a shared disk or in a bucket.

The recipe's `slurm` section describes the cluster once for every stage (partition, account, QoS,
time, CPUs and memory per task, extra sbatch arguments, a setup command). `imap_unordered` writes
the task function and each task, pickled, into a folder of `slurm.jobs_dir` (a shared disk, or a
store URL when the nodes share none), submits them as arrays of at most the cluster's MaxArraySize
elements (each running `python -m kiln.core.executors.slurm FOLDER TASK` with this Python, in the
submitting environment), at most `workers` elements running at once over all of them, and yields
each task's result as its file appears. An element that raised leaves its traceback: the phase
fails naming the element's log. An element that left the queue with neither is asked about
(`scontrol show job`): cancelled, the phase stops naming it; otherwise (killed, preempted, out of
time or memory, its node lost) its task is submitted again, up to `max_retries` times; tasks redo
their output from scratch, so nothing counts twice. A relaunch skips finished tasks through the
stage's own completion markers, as on the other executors. With `--detach` the command stops once
the arrays are submitted (kiln.core.errors.Detached); the same command run later waits for them to
leave the queue, then goes on from their markers. Plain sbatch, squeue, scontrol and scancel calls:
no library between kiln and the cluster's commands.
Not handled here: training jobs and chains of stages (kiln.slurm_jobs).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from kiln.core import storage
from kiln.core.config import Section
from kiln.core.errors import Detached, FatalError

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("kiln.executors")

POLL_S = 0.5  # how often the driver looks for results and asks squeue (a task takes seconds to minutes)
JOBS_DIR = "kiln-slurm"
NODE_LOGS = "/tmp"  # elements of an array whose folder is on a store log here, on their node, and upload on error


class SlurmTrainConfig(Section):
    """The jobs `kiln train --slurm NODES` and `kiln submit` write for training: one task per process."""

    partition: str | None = Field(default=None, description="Partition of training jobs; None: slurm.partition.")
    tasks_per_node: int = Field(default=1, ge=1, description="Processes per node (one per GPU on a GPU node).")
    gpus_per_node: int = Field(default=0, ge=0, description="GPUs per node (sbatch --gpus-per-node); 0: none asked.")
    cpus_per_task: int | None = Field(default=None, ge=1, description="CPUs per process; None: slurm.cpus_per_task.")
    mem: str | None = Field(default=None, description="Memory per node (sbatch --mem); None: slurm.mem.")
    time: str | None = Field(default=None, description="Time limit of a training job; None: slurm.time.")
    warn_seconds: int = Field(
        default=120,
        ge=1,
        description=(
            "Seconds before the time limit Slurm sends SIGUSR1 (sbatch --signal=USR1@N): the run saves a state "
            "and requeues its job, which resumes from it."
        ),
    )
    sbatch_args: list[str] = Field(default_factory=list, description="More sbatch arguments of training jobs.")


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
    tasks_per_element: int = Field(
        default=1,
        ge=1,
        description=(
            "Tasks each array element runs one after another: more than 1 spreads an element's start (about a "
            "second) over several short tasks, and asks the queue for fewer jobs."
        ),
    )
    sbatch_args: list[str] = Field(
        default_factory=list, description="More sbatch arguments, each as one word (e.g. --constraint=cpu)."
    )
    setup: str | None = Field(
        default=None,
        description="Shell lines run before each element's task (module load ..., source venv/bin/activate).",
    )
    train: SlurmTrainConfig = Field(default_factory=SlurmTrainConfig, description="Training jobs' resources.")
    status_every_s: float = Field(
        default=30.0, gt=0, description="Seconds between the driver's lines of tasks done, running and pending."
    )
    jobs_dir: str = Field(
        default=JOBS_DIR,
        description=(
            "Where the arrays' pickled tasks, results and logs go, a folder per phase: on a disk every node reads "
            "(relative: to the folder kiln runs in), or a store URL; a run in a bucket puts them beside the run "
            f"(<runs_dir>/.{JOBS_DIR}) unless set."
        ),
    )


_config = SlurmConfig()
_detach = False


def configure(cfg: SlurmConfig, runs_dir: str | None = None, detach: bool = False) -> None:
    """Use `cfg` for the arrays this process submits (the recipe's slurm section, set as it loads); a run in a
    bucket (`runs_dir` a URL) keeps them beside it unless `cfg` names a place. `detach`: stop once submitted."""
    global _config, _detach
    if runs_dir and storage.is_url(runs_dir) and cfg.jobs_dir == JOBS_DIR:
        cfg = cfg.model_copy(update={"jobs_dir": f"{runs_dir.rstrip('/')}/.{JOBS_DIR}"})
    _config, _detach = cfg, detach


class Folder:
    """An array's folder: a path on a disk every node reads, or a prefix on a store."""

    def __init__(self, location: str):
        self.remote = storage.is_url(location)
        self.location = location.rstrip("/") if self.remote else str(Path(location).absolute())
        if not self.remote:
            Path(self.location).mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> str:
        return f"{self.location}/{name}"

    def put(self, name: str, data: bytes) -> None:
        if self.remote:
            storage.write_bytes(self.path(name), data)
            return
        partial = Path(self.path(name + ".partial"))
        partial.write_bytes(data)
        os.replace(partial, self.path(name))  # whole or absent: the driver never reads half

    def get(self, name: str) -> bytes | None:
        if self.remote:
            found = storage.read_bytes(self.path(name))
            return found[0] if found else None
        path = Path(self.path(name))
        return path.read_bytes() if path.is_file() else None

    def names(self) -> set[str]:
        """The files in it now: one listing, so a poll costs one request on a store, not one per task."""
        if self.remote:
            return set(storage.objects(self.location + "/"))
        return set(os.listdir(self.location)) if os.path.isdir(self.location) else set()

    def drop(self, name: str) -> None:
        if self.remote:
            storage.remove([self.path(name)])
        else:
            Path(self.path(name)).unlink(missing_ok=True)

    def remove(self) -> None:
        if self.remote:
            storage.remove([self.path(name) for name in self.names()])
        else:
            shutil.rmtree(self.location, ignore_errors=True)

    def log(self, job: str, element: int | str) -> str:
        """An element's log: beside its task, or for a folder on a store, on its node (uploaded beside the task
        when the task raised)."""
        if self.remote:
            return f"{NODE_LOGS}/kiln-slurm-{job}_{element}.txt"
        return self.path(f"log-{job}_{element}.txt")


def sbatch_lines(cfg: SlurmConfig, folder: Folder, name: str) -> list[str]:
    """The array script, #SBATCH header and body. Its arguments: the first task of element 0 and the tasks per
    element (element k runs that many from the first + k x that many); sbatch's --array, given at submission,
    says which elements run."""
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={folder.log('%A', '%a')}",
        f"#SBATCH --cpus-per-task={cfg.cpus_per_task}",
        *(
            f"#SBATCH --{key}={value}"
            for key in ("partition", "account", "qos", "time", "mem")
            if (value := getattr(cfg, key))
        ),
        *(f"#SBATCH {arg}" for arg in cfg.sbatch_args),
        *([cfg.setup] if cfg.setup else []),
        f"exec {shlex.quote(sys.executable)} -m kiln.core.executors.slurm {shlex.quote(folder.location)} "
        '"$(( $1 + SLURM_ARRAY_TASK_ID * $2 ))" "$2"',
    ]


def check_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise FatalError("executor slurm: sbatch is not on PATH; run kiln on a Slurm login node, or set executor.kind")


# What sbatch says when the queue, or the account's share of it, holds as many jobs as allowed.
FULL_QUEUE = ("maxsubmit", "submit limit", "temporarily unable to accept", "maxjobcount", "resource temporarily")
SBATCH_WAIT_S = 30.0  # sbatch facing a full queue sleeps and tries again for minutes: this long, then it is said


def submit(script: str, elements: str, first: int, per_element: int = 1) -> str:
    """The job id of `script`'s array (`elements`, sbatch --array) whose element 0 runs `per_element` tasks
    from task `first`."""
    check_sbatch()
    cmd = ["sbatch", "--parsable", f"--array={elements}", script, str(first), str(per_element)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=SBATCH_WAIT_S)
    except subprocess.TimeoutExpired as e:  # a full queue: sbatch sleeps and tries again, for minutes
        said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        raise FatalError(
            f"executor slurm: the cluster took no job for {SBATCH_WAIT_S:.0f} s ({last_line(said) or 'no answer'}): "
            f"its queue is full; finished tasks are kept: run the same command again once it has room "
            f"(squeue --me) ({script}, --array={elements})"
        ) from None
    if done.returncode != 0:
        why = last_line(done.stderr or done.stdout) or f"exit status {done.returncode}"
        full = any(word in why.lower() for word in FULL_QUEUE)
        advice = "; the queue is full: finished tasks are kept, run the same command again once it has room" * full
        raise FatalError(f"executor slurm: sbatch refused {script} (--array={elements}): {why}{advice}")
    return done.stdout.strip().split(";")[0]


def last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1].strip()


def queued(name: str) -> dict[tuple[str, int], str]:
    """The array elements named `name` in the queue now: (job, element) -> state (PENDING, RUNNING, ...)."""
    done = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%F %K %T"], capture_output=True, text=True)
    if done.returncode != 0:
        raise FatalError(f"executor slurm: squeue failed: {done.stderr.strip() or done.returncode}")
    rows = [line.split() for line in done.stdout.splitlines()]
    return {(row[0], int(row[1])): row[2] for row in rows if len(row) == 3 and row[1].isdigit()}


def ended(job: str, element: int) -> str:
    """How an element that left the queue ended, as Slurm keeps it for a while (MinJobAge): its JobState
    (CANCELLED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY, COMPLETED...) with its exit code."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", f"{job}_{element}"], capture_output=True, text=True)
    fields = dict(f.split("=", 1) for f in shown.stdout.split() if "=" in f)
    state = fields.get("JobState", "UNKNOWN")
    return f"{state}, exit {fields['ExitCode']}" if "ExitCode" in fields else state


def max_array() -> int:
    """The most elements one array may have here: MaxArraySize - 1, the highest index (1000 by default)."""
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return max(1, int(value.strip()) - 1)
    return 1000


def shares(total: int | None, parts: int) -> list[int | None]:
    """`total` elements running at once split over `parts` arrays, each at least 1 (None: no cap)."""
    if total is None:
        return [None] * parts
    return [max(1, total // parts + (k < total % parts)) for k in range(parts)]


class SlurmExecutor:
    """Tasks as Slurm job arrays; `workers` caps the elements running at once (None: the cluster decides).
    `scope` names the stage (its folder): a later run of it first waits for the arrays a --detach run left."""

    def __init__(self, workers: int | None, section: str, max_retries: int = 3, scope: str | None = None):
        check_sbatch()
        self.workers = workers or 1
        self.cap, self.section, self.max_retries = workers, section, max_retries
        self._jobs: list[str] = []
        self._record = f"detached-{uuid.uuid5(uuid.NAMESPACE_URL, f'{scope}#{section}').hex[:16]}.json"
        if scope is not None:
            self._wait_for_detached()

    def _wait_for_detached(self) -> None:
        """Arrays a --detach run of this stage submitted: wait until they leave the queue (their tasks left
        completion markers, which the stage reads), or under --detach again, say that they still run."""
        root = Folder(_config.jobs_dir)
        found = root.get(self._record)
        if found is None:
            return
        record = json.loads(found)
        folder, said = Folder(record["folder"]), 0.0
        while in_queue := queued(record["name"]):
            done = sum(name.startswith("result-") for name in folder.names())
            line = (
                f"{self.section}: {done} of {record['tasks']} tasks done, {len(in_queue)} in the queue as Slurm "
                f"array {', '.join(record['jobs'])}, submitted by a --detach run (logs {folder.location})"
            )
            if _detach:
                raise Detached(f"{line}; run the same command again once they are done")
            if time.monotonic() - said >= _config.status_every_s:
                log.info("%s; waiting for them", line)
                said = time.monotonic()
            time.sleep(POLL_S)
        log.info("%s: the arrays of the --detach run left the queue; going on from their tasks' markers", self.section)
        folder.remove()
        root.drop(self._record)

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if not tasks:
            return
        cfg = _config
        name = f"kiln-{self.section}-{uuid.uuid4().hex[:8]}"
        folder = Folder(
            f"{cfg.jobs_dir.rstrip('/')}/{name}" if storage.is_url(cfg.jobs_dir) else f"{cfg.jobs_dir}/{name}"
        )
        folder.put("fn.pkl", pickle.dumps(fn))
        for i, task in enumerate(tasks):
            folder.put(f"task-{i}.pkl", pickle.dumps(task))
        lines = "\n".join(sbatch_lines(cfg, folder, name)) + "\n"
        if not folder.remote:  # beside the logs, for whoever reads them
            folder.put("array.sh", lines.encode())
            yield from self._run(fn, tasks, folder, name, folder.path("array.sh"))
            return
        with tempfile.TemporaryDirectory(prefix="kiln-slurm-") as here:
            # sbatch reads the script on this machine and the cluster keeps its text: the nodes need no copy
            script = Path(here) / "array.sh"
            script.write_text(lines)
            yield from self._run(fn, tasks, folder, name, str(script))

    def _run(self, fn: Callable[[T], R], tasks: list[T], folder: Folder, name: str, script: str) -> Iterator[R]:
        cfg = _config
        group = cfg.tasks_per_element
        size = max_array() * group  # tasks per array
        chunks = [range(a, min(a + size, len(tasks))) for a in range(0, len(tasks), size)]
        where: dict[int, tuple[str, int]] = {}  # task -> (job, element) of its latest submission
        caps: dict[str, int | None] = {}  # each array of the first submission -> its cap of running elements
        left = set(range(len(tasks)))
        tries = dict.fromkeys(left, 0)
        finished = False
        try:
            for chunk, cap in zip(chunks, shares(self.cap, len(chunks)), strict=True):
                elements = -(-len(chunk) // group)
                job = self._submit(script, f"0-{elements - 1}" + (f"%{cap}" if cap else ""), chunk.start, group)
                caps[job] = cap
                where.update({i: (job, (i - chunk.start) // group) for i in chunk})
            jobs = ", ".join(caps)
            log.info("%s: %d tasks as Slurm array %s (logs %s)", self.section, len(tasks), jobs, folder.log("JOB", "I"))
            if _detach:
                record = {"name": name, "folder": folder.location, "tasks": len(tasks), "jobs": list(caps)}
                Folder(cfg.jobs_dir).put(self._record, json.dumps(record).encode())
                finished = True  # the arrays run on without this process
                raise Detached(
                    f"{self.section}: {len(tasks)} tasks submitted as Slurm array {jobs} (logs {folder.location}); "
                    f"this command stops here: run it again to go on once they are done (squeue -n {name})"
                )
            said = time.monotonic()
            while left:
                time.sleep(POLL_S)
                states = queued(name)
                present = folder.names()
                self._rebalance(caps, {job for job, _ in states})
                if time.monotonic() - said >= cfg.status_every_s:
                    said = time.monotonic()
                    self._say(len(tasks), left, states, tries, folder, jobs)
                for i in sorted(left):
                    job, element = where[i]
                    if f"result-{i}.pkl" in present:
                        left.discard(i)
                        yield pickle.loads(folder.get(f"result-{i}.pkl") or b"")
                    elif f"error-{i}.txt" in present:
                        error = (folder.get(f"error-{i}.txt") or b"").decode(errors="replace").strip()
                        log_at = folder.path(f"log-{job}_{element}.txt") if folder.remote else folder.log(job, element)
                        raise FatalError(
                            f"{self.section}: task {i}, Slurm job {job}_{element}, failed: "
                            f"{(error.splitlines() or ['?'])[-1]} (log {log_at})"
                        )
                    elif (job, element) not in states:
                        self._again(i, job, element, ended(job, element), tries, where, folder, script)
            finished = True
        finally:
            if not finished:  # a failed task or a closed generator: nothing more of this stage runs
                subprocess.run(["scancel", *sorted(set(self._jobs))], capture_output=True)
        folder.remove()  # every result read: a finished array leaves nothing behind

    def _again(
        self,
        i: int,
        job: str,
        element: int,
        how: str,
        tries: dict[int, int],
        where: dict[int, tuple[str, int]],
        folder: Folder,
        script: str,
    ) -> None:
        """Task `i` left the queue as Slurm job `job`_`element` without a result, ending `how`: submitted again,
        unless it was cancelled or has used its retries."""
        log_at = folder.log(job, element)
        if how.startswith("CANCELLED"):
            raise FatalError(
                f"{self.section}: task {i}, Slurm job {job}_{element}, was cancelled ({how}; log {log_at}); the "
                "stage stops: finished tasks are kept, run the same command again to do the rest"
            )
        tries[i] += 1
        if tries[i] > self.max_retries:
            raise FatalError(
                f"{self.section}: task {i} ended without a result {tries[i]} times, last as Slurm job "
                f"{job}_{element} ({how}; log {log_at}): killed, out of time or memory, or its node lost"
            )
        where[i] = (self._submit(script, "0", i), 0)
        log.warning(
            "%s: task %d, Slurm job %s_%d, ended without a result (%s; log %s); submitted again as job %s "
            "(try %d of %d)",
            self.section,
            i,
            job,
            element,
            how,
            log_at,
            where[i][0],
            tries[i],
            self.max_retries,
        )

    def _rebalance(self, caps: dict[str, int | None], in_queue: set[str]) -> None:
        """The share of running elements of an array that left the queue goes to the arrays still there."""
        gone = [job for job in caps if job not in in_queue]
        if not gone or self.cap is None:
            return
        for job in gone:
            del caps[job]
        for job, cap in zip(caps, shares(self.cap, len(caps)), strict=True):
            if cap != caps[job]:
                caps[job] = cap
                subprocess.run(["scontrol", "update", f"JobId={job}", f"ArrayTaskThrottle={cap}"], capture_output=True)

    def _say(
        self,
        total: int,
        left: set[int],
        states: dict[tuple[str, int], str],
        tries: dict[int, int],
        folder: Folder,
        jobs: str,
    ) -> None:
        counts = {state: list(states.values()).count(state) for state in ("RUNNING", "PENDING")}
        log.info(
            "%s: Slurm array %s: %d of %d tasks done, %d running, %d pending, %d ended without a result and "
            "submitted again (logs %s)",
            self.section,
            jobs,
            total - len(left),
            total,
            counts["RUNNING"],
            counts["PENDING"],
            sum(tries.values()),
            folder.log("JOB", "I"),
        )

    def _submit(self, script: str, elements: str, first: int, per_element: int = 1) -> str:
        job = submit(script, elements, first, per_element)
        self._jobs.append(job)
        return job

    def close(self) -> None:
        self._jobs.clear()


def run_element(location: str, first: int, count: int) -> int:
    """One array element: run tasks `first` to `first + count - 1` (those that exist) one after another, leaving
    each one's result where the driver looks as it finishes; the first that raises leaves its traceback (and
    for a folder on a store, the element's log) instead, and ends the element."""
    folder = Folder(location)
    fn: Callable[[Any], Any] | None = None
    for index in range(first, first + count):
        try:
            # subtle: unpickling is inside: a function this Python cannot import is the task's error, said once,
            # not an element that dies without a word and is submitted again max_retries times
            fn = fn or pickle.loads(folder.get("fn.pkl") or b"")
            found = folder.get(f"task-{index}.pkl")
            if found is None:  # past the last task: the array's last element may hold fewer
                return 0
            task: Any = pickle.loads(found)
            result = fn(task)
        except BaseException:  # the driver reads it and fails the phase, naming this element's log
            error = traceback.format_exc()
            print(error, file=sys.stderr, flush=True)
            if folder.remote:  # the log is on this node: beside the task, for the driver's message
                job, element = os.environ.get("SLURM_ARRAY_JOB_ID", "?"), os.environ.get("SLURM_ARRAY_TASK_ID", "?")
                here = Path(folder.log(job, element))
                if here.is_file():
                    folder.put(f"log-{job}_{element}.txt", here.read_bytes())
            folder.put(f"error-{index}.txt", error.encode())
            return 1
        folder.put(f"result-{index}.pkl", pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_element(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
