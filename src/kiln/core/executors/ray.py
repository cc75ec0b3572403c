"""The Ray executor: the same shard tasks as `local`, run as Ray tasks.

It joins a running cluster when given an address, else starts a Ray instance on this machine
with `workers` CPUs (and stops it on close). Each task asks for one CPU, so the cluster's CPU
count bounds the parallelism. Task functions and arguments travel by pickle, as with the
process pool, so workers need kiln installed at the same version: before any task, every live
node with CPUs runs a version check of its own (a node that joins later is checked by each task
before it unpickles its work).
What goes wrong says so in one line: a cluster it cannot join (nothing at the address, or token
authentication refusing this process), a cluster with no CPU for its tasks (none yet, or every
worker node gone: it waits up to `wait_for_cpus_s`, warning every 30 s), and a task's own
KilnError or OSError on a worker, named with that node.
A task whose worker or node dies runs again, up to `max_retries` times (3).
Not handled here: placement across nodes (Ray schedules), object-store data transfer (tasks
exchange data through files, which must be on storage every node can reach).
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from kiln.core.errors import FatalError, KilnError
from kiln.core.mirror import cache_root

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("kiln.executors")

POLL_S = 2.0  # a run with no task finishing asks the cluster for its CPUs this often (one small GCS request)
WARN_EVERY_S = 30.0  # a run waiting for a CPU repeats its warning this often
PROBE_S = 10.0  # the head's port must accept a TCP connection within this (Ray itself retries for minutes)
CHECK_S = 120.0  # a node's version check, including the start of its first worker process


def versions() -> dict[str, str]:
    """The versions a task's pickle depends on: Python's (minor) and kiln's."""
    import sys

    import kiln

    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "kiln": kiln.__version__}


def describe_node(node_id: str, host: str, ip: str) -> str:
    """A node as messages name it: its id (as `ray status` and the dashboard show it), host and address."""
    return f"Ray node {node_id[:8]} on {host} ({ip})"


def other_version(node: str, theirs: dict[str, str], ours: dict[str, str]) -> str:
    """What a node of another version is told, after the section that configured the executor."""
    differ = ", ".join(f"{k} {theirs.get(k)} there, {v} here" for k, v in ours.items() if theirs.get(k) != v)
    return (
        f"{node} runs another version ({differ}); tasks travel by pickle: install this machine's kiln and Python "
        "on every node, then restart that node (`ray stop`, then its `ray start --address=...`)"
    )


def check_worker_versions(ray: Any, section: str, ours: dict[str, str] | None = None) -> None:
    """Stop before any task when a node that can run tasks (alive, with CPUs) runs another Python or kiln
    than this process (ours: versions() unless given). subtle: one check per node, pinned to it; a check that
    asks for no CPU lands wherever Ray likes, typically on a head that runs no task."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ours = ours or versions()
    probe = ray.remote(num_cpus=0, max_retries=0)(versions)
    checks = {
        describe_node(n["NodeID"], n.get("NodeManagerHostname", "?"), n.get("NodeManagerAddress", "?")): probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in ray.nodes()
        if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
    }
    for node, ref in checks.items():
        try:
            theirs = ray.get(ref, timeout=CHECK_S)
        except ray.exceptions.GetTimeoutError:
            raise FatalError(
                f"{section}: {node} did not answer kiln's version check within {CHECK_S:.0f} s; its worker "
                "processes may fail to start: see that node's Ray logs (/tmp/ray/session_latest/logs/raylet.err)"
            ) from None
        except ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None) or e
            raise FatalError(
                f"{section}: {node} cannot run kiln ({type(cause).__name__}: {first_line(cause)}); install this "
                "machine's kiln and Python on every node, then restart that node"
            ) from None
        if theirs != ours:
            raise FatalError(f"{section}: {other_version(node, theirs, ours)}")


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def run_task(ours: dict[str, str], call: bytes) -> Any:
    """One task on a Ray worker: check this node's versions, then unpickle the function and its task and run it.
    The task's KilnError or OSError comes back as a FatalError naming this node (the driver shows it as one line);
    any other exception keeps its traceback."""
    import ray

    node = describe_node(ray.get_runtime_context().get_node_id(), socket.gethostname(), ray.util.get_node_ip_address())
    if (theirs := versions()) != ours:  # subtle: before unpickling, which another kiln may read wrongly
        raise FatalError(other_version(node, theirs, ours))
    fn, task = pickle.loads(call)
    try:
        return fn(task)
    except KilnError as e:
        raise FatalError(f"{node}: {e}") from None
    except OSError as e:
        raise FatalError(f"{node}: {os_error_line(e)}") from None


def os_error_line(error: OSError) -> str:
    """An OSError of a task as one line; a path in this node's KILN_CACHE names it, the usual cause."""
    where = f"{error.filename}: " if error.filename else ""
    line = f"{where}{error.strerror or first_line(error)} ({type(error).__name__})"
    cache = str(cache_root())
    if error.filename and (str(error.filename) + "/").startswith(cache.rstrip("/") + "/"):
        line += (
            f"; it lies in KILN_CACHE={cache}, this node's copy of the run, which must be a writable folder: point "
            "KILN_CACHE at one in the environment of this node's `ray start`, then restart the node"
        )
    return line


class RayExecutor:
    """Shard tasks as Ray tasks of one CPU each, at most `workers` in flight."""

    def __init__(
        self,
        workers: int | None = None,
        address: str | None = None,
        section: str = "executor",
        max_retries: int = 3,
        wait_for_cpus_s: float = 600.0,
    ):
        try:
            import ray
        except ImportError:
            raise FatalError(f"{section}.kind=ray needs the `ray` package: pip install 'ray>=2.9'") from None
        self._ray = ray
        self._started = False
        self.section = section
        self.max_retries = max_retries
        self.wait_for_cpus_s = wait_for_cpus_s
        joined = ray.is_initialized()
        if joined and address:
            log.warning(
                "%s: ray is already initialized in this process; using that cluster, not ray_address=%s",
                section,
                address,
            )
        if not joined:
            if address:
                self._join(address)
            else:
                ray.init(
                    num_cpus=workers or os.cpu_count() or 1,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                )
                self._started = True
        # The cluster as given, unless `auto` or one this process had joined already: then as Ray found it.
        given = address not in (None, "auto") and not joined
        self.address = address if given else ray.get_runtime_context().gcs_address
        self.where = f"the Ray cluster at {self.address}"
        if self._started:
            self.where = "the Ray instance started on this machine"
        cpus = self._wait_for_cpus()
        check_worker_versions(ray, section)
        self._versions = versions()
        self.workers = min(workers, cpus) if workers else cpus
        log.info("%s: ray executor on %s with %d CPUs", section, self.where.removeprefix("the "), cpus)

    def _join(self, address: str) -> None:
        """ray.init on a running cluster, or a FatalError naming the address and the likely cause."""
        ray = self._ray
        host, _, port = address.rpartition(":")
        if host and port.isdigit() and "://" not in address:  # not `auto`, not a Ray Client URL
            # Ray 2.60 tries a silent address 20 times, about 40 s each, before it says anything.
            try:
                socket.create_connection((host, int(port)), timeout=PROBE_S).close()
            except OSError as e:
                raise FatalError(
                    f"{self.section}.ray_address={address}: nothing answers there ({e.strerror or e}); start the "
                    f"cluster's head there (`ray start --head --port={port}`) or correct {self.section}.ray_address"
                ) from None
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as e:  # a boundary: whatever stopped the join, the user gets one line
            ray.shutdown()
            chain, cause = [], e
            while cause is not None and len(chain) < 5:
                chain.append(cause)
                cause = cause.__cause__ or cause.__context__
            refused = getattr(ray.exceptions, "AuthenticationError", ())  # absent from older Ray
            if any(isinstance(c, refused) or "InvalidAuthToken" in str(c) for c in chain):
                raise FatalError(
                    f"{self.section}: the Ray cluster at {address} refused this process's token (or its lack of "
                    "one): the cluster uses token authentication; set RAY_AUTH_MODE=token and the cluster's token "
                    "(RAY_AUTH_TOKEN, or the file ~/.ray/auth_token) here as on every node (docs/storage.md)"
                ) from None
            raise FatalError(
                f"{self.section}: cannot join the Ray cluster at {address} ({type(e).__name__}: {first_line(e)}); "
                f"check that its head runs Ray {ray.__version__} as here, and where the cluster uses token "
                "authentication set RAY_AUTH_MODE=token and its token here as on every node (docs/storage.md)"
            ) from None

    def _cpus(self) -> int:
        """The CPUs of the cluster's live nodes: 0 on a head started with --num-cpus=0 alone (Ray then lists no
        CPU at all), or once every worker node is gone (at once for one stopped, about 13 s after one killed)."""
        return int(self._ray.cluster_resources().get("CPU", 0))

    def _wait_for_cpus(self) -> int:
        """The cluster's CPU count once it has any; meanwhile a warning every WARN_EVERY_S, and a FatalError
        naming the cluster after wait_for_cpus_s."""
        started, warned = time.monotonic(), None
        while (cpus := self._cpus()) == 0:
            now = time.monotonic()
            left = self.wait_for_cpus_s - (now - started)
            if left <= 0:
                raise FatalError(
                    f"{self.section}: {self.where} had no CPU for a task for {self.wait_for_cpus_s:g} s (no live "
                    f"worker node): start worker nodes (`ray start --address={self.address}` on each, docs/storage.md)"
                    f", or raise {self.section}.wait_for_cpus_s to wait longer"
                )
            if warned is None or now - warned >= WARN_EVERY_S:
                log.warning(
                    "%s: %s has no CPU for a task (no live worker node); waiting up to %.0f s more for one "
                    "(%s.wait_for_cpus_s)",
                    self.section,
                    self.where,
                    left,
                    self.section,
                )
                warned = now
            time.sleep(min(POLL_S, left))
        return cpus

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        ray = self._ray
        # A dead worker or node: the task runs again (a task's own exception is not retried). Tasks write
        # under their own task's names, over what an attempt left, and their completion marker last, and
        # the stage counts what the returned result says: a retry counts nothing twice.
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries)(run_task)
        queue = list(tasks)
        running: list[Any] = []
        try:
            # subtle: at most `workers` tasks in flight, so `workers` bounds parallelism on a
            # bigger cluster too, and a failure leaves the rest of the queue unstarted.
            while queue or running:
                while queue and len(running) < self.workers:
                    # Pickled here, unpickled by run_task after its version check. `fn` may be any callable (a
                    # partial: ray.remote takes only functions); ray.cloudpickle honours register_pickle_by_value.
                    call = ray.cloudpickle.dumps((fn, queue.pop(0)))
                    running.append(remote.remote(self._versions, call))
                done, running = ray.wait(running, num_returns=1, timeout=POLL_S)
                if not done:  # nothing finished for POLL_S: are there still nodes to run the tasks?
                    if self._cpus() == 0:
                        self._wait_for_cpus()
                    continue
                yield self._result(done[0])
        finally:
            for ref in running:
                ray.cancel(ref, force=True)

    def _result(self, ref: Any) -> Any:
        """A finished task's result; its KilnError (a FatalError naming the node, from run_task) as one line."""
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, KilnError):
                raise FatalError(f"{self.section}: {e.cause}") from None
            raise

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False
