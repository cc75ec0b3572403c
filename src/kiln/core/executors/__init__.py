"""Executors map shard tasks onto workers. They know nothing about steps.

`local` is a process pool on this machine (the default); `ray` runs the same tasks on a Ray
cluster, an existing one by address or one started on this machine; `slurm` as Slurm job arrays.
All yield results as tasks finish, in any order: callers key results by task, so outputs never
depend on the executor, the worker count or the finishing order.
A task that raises fails the phase (the re-run resumes from the completion markers); on Ray or
Slurm a task whose worker, node or array element dies is run again, up to `max_retries` times, and
a Ray run whose cluster has no CPU for its tasks waits up to `wait_for_cpus_s`, saying so, then
stops. Not handled here: data transfer (tasks read and write files).
Logs go to `kiln.executors`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Protocol, TypeVar

from pydantic import Field

from kiln.core.config import Section

T = TypeVar("T")
R = TypeVar("R")


class ExecutorConfig(Section):
    """Which executor runs a stage's shard tasks, and how wide."""

    kind: Literal["local", "ray", "slurm"] = Field(
        default="local",
        description=(
            "local: a process pool on this machine; ray: a Ray cluster (see ray_address); slurm: Slurm job arrays "
            "(the recipe's slurm section)."
        ),
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Parallel tasks; None means one per CPU core (local), per CPU of the Ray cluster, or as many array "
            "elements at once as Slurm runs."
        ),
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description=(
            "ray and slurm: times a task is run again when its worker, node or array element dies (a task's own error "
            "is not retried); "
            "tasks redo their output from scratch, so nothing is counted twice."
        ),
    )
    ray_address: str | None = Field(
        default=None,
        description=(
            "For ray: address of a running cluster (e.g. 10.0.0.5:6379 or auto); None starts a local Ray instance."
        ),
    )
    wait_for_cpus_s: float = Field(
        default=600.0,
        ge=0,
        description=(
            "ray: seconds a run waits while no live node of the cluster has a CPU for its tasks (none joined yet, "
            "or all gone), warning every 30 s, before it stops naming the cluster."
        ),
    )


class Executor(Protocol):
    workers: int

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        """fn(task) for every task, yielded as each finishes; a task's exception propagates."""
        ...

    def close(self) -> None: ...


def build_executor(cfg: ExecutorConfig, section: str, scope: str | None = None) -> Executor:
    """The executor `cfg` describes; `section` is the recipe key that configured it (e.g.
    `tokenize.executor`), named in its log lines and error messages; `scope` the stage's folder (slurm: where
    a run detached from arrays still in the queue, the next run of that stage waits for them)."""
    if cfg.kind == "slurm":
        from kiln.core.executors.slurm import SlurmExecutor

        return SlurmExecutor(cfg.workers, section, cfg.max_retries, scope)
    if cfg.kind == "ray":
        from kiln.core.executors.ray import RayExecutor

        return RayExecutor(cfg.workers, cfg.ray_address, section, cfg.max_retries, cfg.wait_for_cpus_s)
    from kiln.core.executors.local import LocalExecutor

    return LocalExecutor(cfg.workers)
