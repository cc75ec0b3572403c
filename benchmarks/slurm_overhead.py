"""The Slurm executor's overhead: the same tasks through 100-element arrays on a Slurm cluster started on this
machine (tests/slurm_cluster.py: slurmctld, two one-CPU slurmd, munge) and through the local executor's
process pool of two workers, side by side.

Each task burns `--task-s` seconds of one CPU (hashing), so both executors have the same work and the
same two CPUs; the ratio of their wall times is the overhead of submitting, scheduling, starting an
element (a Python that unpickles its task) and collecting its result. Run twice on Slurm: one task per
array element (the default), and `--group` tasks per element (slurm.tasks_per_element), which starts
fewer elements. Also printed: submit to start (submission to the first task's start on a node) and
marker to merge (a task's result written to the driver holding it, the mean over tasks). Needs root
and Debian's slurm-wlm and munge, as the tests do.
Usage: .venv/bin/python benchmarks/slurm_overhead.py [--tasks 100] [--task-s 2] [--group 4]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def burn(seconds: float) -> tuple[float, float]:
    """One CPU busy for `seconds` (SHA-256 of a 1 MB block, over and over); returns when it started and ended
    (wall clock: the cluster's nodes are this machine)."""
    start, began = time.perf_counter(), time.time()
    block = b"k" * (1 << 20)
    while time.perf_counter() - start < seconds:
        block = hashlib.sha256(block).digest() * (1 << 15)
    return began, time.time()


def on_slurm(slurm: object, task: object, work: list[float], jobs: Path, group: int) -> tuple[float, float, float]:
    """Wall seconds of the work as arrays of `group` tasks per element; submit to start; mean marker to merge."""
    slurm.configure(slurm.SlurmConfig(jobs_dir=str(jobs), tasks_per_element=group))  # type: ignore[attr-defined]
    submitted = time.time()
    starts, merges = [], []
    for began, ended in slurm.SlurmExecutor(2, "bench.executor").imap_unordered(task, work):  # type: ignore[attr-defined]
        starts.append(began)
        merges.append(time.time() - ended)
    return time.time() - submitted, min(starts) - submitted, sum(merges) / len(merges)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--task-s", type=float, default=2.0)
    parser.add_argument("--group", type=int, default=4, help="tasks per array element in the second Slurm run")
    args = parser.parse_args()
    sys.path[:0] = [str(HERE.parent / "tests"), str(HERE)]
    from slurm_cluster import start
    from slurm_overhead import burn as task  # by its module's name: the array's elements import it from there

    from kiln.core.executors import slurm
    from kiln.core.executors.local import LocalExecutor

    # the daemons write their state as they stop: the folder goes once they have
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        cluster = start(Path(tmp) / "cluster")
        if isinstance(cluster, str):
            sys.exit(f"slurm_overhead: {cluster}")
        try:
            os.environ.update(SLURM_CONF=cluster.env["SLURM_CONF"], PYTHONPATH=str(HERE))
            work = [args.task_s] * args.tasks
            t0 = time.perf_counter()
            local = LocalExecutor(2)
            list(local.imap_unordered(task, work))
            local.close()
            local_s = time.perf_counter() - t0
            one = on_slurm(slurm, task, work, Path(tmp) / "jobs", 1)
            grouped = on_slurm(slurm, task, work, Path(tmp) / "jobs", args.group)
        finally:
            cluster.stop()
    per_element = (one[0] - local_s) / (args.tasks / 2)  # two elements run at once
    print(
        f"{args.tasks} tasks of {args.task_s} s on 2 CPUs: local {local_s:.1f} s, Slurm arrays {one[0]:.1f} s "
        f"(1 task per element), {grouped[0]:.1f} s ({args.group} per element)"
    )
    print(f"submit to start {one[1]:.1f} s; marker to merge {one[2]:.2f} s; overhead per element {per_element:.2f} s")
    print(
        f"RESULT local_s={local_s:.1f} slurm_s={one[0]:.1f} ratio={one[0] / local_s:.2f} "
        f"grouped_s={grouped[0]:.1f} grouped_ratio={grouped[0] / local_s:.2f} submit_to_start_s={one[1]:.1f} "
        f"marker_to_merge_s={one[2]:.2f} per_element_s={per_element:.2f}"
    )


if __name__ == "__main__":
    main()
