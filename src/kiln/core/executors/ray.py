"""The Ray executor: the same shard tasks as `local`, run as Ray tasks.

It joins a running cluster when given an address, else starts a Ray instance on this machine
with `workers` CPUs (and stops it on close). Each task asks for one CPU, so the cluster's CPU
count bounds the parallelism. Task functions and arguments travel by pickle, as with the
process pool, so workers need kiln installed at the same version: a worker's Python and kiln
versions are checked against this process's before any task.
A task whose worker or node dies runs again, up to `max_retries` times (3).
Not handled here: placement across nodes (Ray schedules), object-store data transfer (tasks
exchange data through files, which must be on storage every node can reach).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from kiln.core.errors import FatalError

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("kiln.executors")


def versions() -> dict[str, str]:
    """The versions a task's pickle depends on: Python's (minor) and kiln's."""
    import sys

    import kiln

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "kiln": kiln.__version__}


def check_worker_versions(ray: Any, section: str, ours: dict[str, str] | None = None) -> None:
    """Stop before any task when a worker runs another Python or kiln than this process (ours:
    versions() unless given): task functions and arguments travel by pickle, and another version
    would read them wrongly."""
    theirs = ray.get(ray.remote(num_cpus=0)(versions).remote())
    ours = ours or versions()
    if theirs != ours:
        differ = ", ".join(f"{k} {theirs.get(k)} there, {v} here" for k, v in ours.items() if theirs.get(k) != v)
        raise FatalError(
            f"{section}: the Ray workers run another version ({differ}); install the same kiln and Python on every node"
        )


def call(fn: Callable[[T], R], task: T) -> R:
    """A task as Ray runs it: `fn` may be any callable (ray.remote takes only functions, not a partial)."""
    return fn(task)


class RayExecutor:
    """Shard tasks as Ray tasks of one CPU each, at most `workers` in flight."""

    def __init__(
        self, workers: int | None = None, address: str | None = None, section: str = "executor", max_retries: int = 3
    ):
        try:
            import ray
        except ImportError:
            raise FatalError(f"{section}.kind=ray needs the `ray` package: pip install 'ray>=2.9'") from None
        self._ray = ray
        self._started = False
        self.max_retries = max_retries
        if ray.is_initialized() and address:
            log.warning(
                "%s: ray is already initialized in this process; using that cluster, not ray_address=%s",
                section,
                address,
            )
        if not ray.is_initialized():
            if address:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                )
                self._started = True
        check_worker_versions(ray, section)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = min(workers, cpus) if workers else cpus
        log.info(
            "%s: ray executor on %s with %d CPUs",
            section,
            "a local instance" if self._started else address or "the current cluster",
            cpus,
        )

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        ray = self._ray
        # A dead worker or node: the task runs again (a task's own exception is not retried). Tasks write
        # under their own task's names, over what an attempt left, and their completion marker last, and
        # the stage counts what the returned result says: a retry counts nothing twice.
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(call)
        queue = list(tasks)
        running: list[Any] = []
        try:
            # subtle: at most `workers` tasks in flight, so `workers` bounds parallelism on a
            # bigger cluster too, and a failure leaves the rest of the queue unstarted.
            while queue or running:
                while queue and len(running) < self.workers:
                    running.append(remote.remote(fn, queue.pop(0)))
                done, running = ray.wait(running, num_returns=1)
                yield ray.get(done[0])
        finally:
            for ref in running:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
