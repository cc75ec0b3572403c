"""The Slurm executor's overhead: the same tasks through a 100-element array on a Slurm cluster started on this
machine (tests/slurm_cluster.py: slurmctld, two one-CPU slurmd, munge) and through the local executor's
process pool of two workers, side by side.

Each task burns `--task-s` seconds of one CPU (hashing), so both executors have the same work and the
same two CPUs; the ratio of their wall times is the overhead of submitting, scheduling, starting an
element (a Python that unpickles its task) and collecting its result. Also printed: the time from
submission to the first result, and the overhead per element. Needs root and Debian's slurm-wlm and
munge, as the tests do. Usage: .venv/bin/python benchmarks/slurm_overhead.py [--tasks 100] [--task-s 2]
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


def burn(seconds: float) -> float:
    """One CPU busy for `seconds` (SHA-256 of a 1 MB block, over and over); returns the seconds it took."""
    start = time.perf_counter()
    block = b"k" * (1 << 20)
    while time.perf_counter() - start < seconds:
        block = hashlib.sha256(block).digest() * (1 << 15)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--task-s", type=float, default=2.0)
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
            slurm.configure(slurm.SlurmConfig(jobs_dir=str(Path(tmp) / "jobs")))
            work = [args.task_s] * args.tasks
            t0 = time.perf_counter()
            local = LocalExecutor(2)
            list(local.imap_unordered(task, work))
            local.close()
            local_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            first = None
            for _ in slurm.SlurmExecutor(2, "bench.executor").imap_unordered(task, work):
                first = first or time.perf_counter() - t0
            slurm_s = time.perf_counter() - t0
        finally:
            cluster.stop()
    per_element = (slurm_s - local_s) / (args.tasks / 2)  # two elements run at once
    print(f"{args.tasks} tasks of {args.task_s} s on 2 CPUs: local {local_s:.1f} s, Slurm array {slurm_s:.1f} s")
    print(f"first result after {first:.1f} s; overhead per element {per_element:.2f} s")
    print(f"RESULT local_s={local_s:.1f} slurm_s={slurm_s:.1f} ratio={slurm_s / local_s:.2f} first_s={first:.1f}")


if __name__ == "__main__":
    main()
