"""Shared fixtures: one local Ray instance (2 CPUs) for every Ray test (curate and quality), and one
miniature `kiln demo` run (tests/minidemo.py) for tests/test_demo.py and tests/report/.

And how the suite shares the machine when pytest-xdist runs it on several workers (`make test`:
one per core, `--dist loadgroup`): each worker's torch, and the processes its tests start, use one
thread; the tests of a shared session run go to one worker, which makes that run once; the long
tests are handed out first; a test marked `cores` is handed out last, and its call runs while the other
workers wait.
"""

from __future__ import annotations

import os

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch at import, and by every process a test starts

import fcntl
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from minidemo import DEMO_STAGES, KILN, kiln_demo

# Session fixtures that start something big (the demo's run, a Ray instance, a Slurm cluster): the tests using one
# run on one worker, so it is started once.
SHARED_RUNS = ("demo_run", "ray_local", "slurm")


def pytest_configure(config: pytest.Config) -> None:
    if WORKER:
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not WORKER:  # the controller, after its workers have stopped
        for lock in Path(tempfile.gettempdir()).glob(f"kiln-tests-{os.getpid()}.*"):
            lock.unlink()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in SHARED_RUNS:
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(fixture))
                item.add_marker(pytest.mark.slow)  # the end-to-end run, a Ray instance or Slurm: not `make test-fast`
    # Long first, so that no worker is left with one long test while the others have finished; a `cores` test
    # last, where what it waits for on the other workers is a quick test (handed out among the long ones, it once
    # waited 28 s for the other worker's two pipeline tests, then kept that worker idle for its own 8 s).
    items.sort(key=lambda item: (item.get_closest_marker("cores") is not None, not item.get_closest_marker("slow")))


@contextmanager
def machine_share(exclusive: bool) -> Iterator[None]:
    """Hold the workers' shared lock for a test, or the exclusive one for a `cores` test. A test
    waiting for the exclusive lock first takes the gate, which keeps other workers from starting
    their next test meanwhile (the wait ends when their current one does)."""
    if not WORKER:
        yield
        return
    # The workers are the controller's children: the locks are named after it.
    base = Path(tempfile.gettempdir()) / f"kiln-tests-{os.getppid()}"
    with open(f"{base}.gate", "a") as gate, open(f"{base}.run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases what is held


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if item.get_closest_marker("cores") is not None:
        return (yield)  # exclusive for its call alone (below): its fixtures are built beside the other tests
    with machine_share(exclusive=False):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    if item.get_closest_marker("cores") is None:
        return (yield)
    with machine_share(exclusive=True):
        return (yield)


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    from kiln.core.executors.ray import RayExecutor

    executor = RayExecutor(workers=2)
    yield executor
    executor.close()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Slurm cluster on this machine (tests/slurm_cluster.py) for this test process: the environment that
    reaches it; the daemons stop at the session's end. Skips, saying why, where it cannot run."""
    from slurm_cluster import start

    found = start(tmp_path_factory.mktemp("slurm"))
    if isinstance(found, str):
        pytest.skip(found)
    yield found.env
    found.stop()


@pytest.fixture(scope="session")
def s3_store() -> Iterator[str]:
    """An S3 API on localhost for this test process: moto's standalone server (the one s3fs's own tests
    run against), reached by the same client code users point at AWS or MinIO, through the environment
    it reads (AWS_ENDPOINT_URL and the keys). Yields the endpoint; the server stops at the session's end."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "kiln-test",
        "AWS_SECRET_ACCESS_KEY": "kiln-test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not KILN.is_file():
        pytest.skip(f"no kiln script beside {sys.executable}")
    runs_dir = tmp_path_factory.mktemp("pipeline") / "runs"
    done, seconds = kiln_demo(runs_dir)
    run_dir = runs_dir / "demo"
    manifests = {s: json.loads((run_dir / s / "manifest.json").read_text()) for s in DEMO_STAGES}
    return {
        "runs_dir": runs_dir,
        "run_dir": run_dir,
        "stdout": done.stdout,
        "seconds": seconds,
        "manifests": manifests,
        "summary": json.loads((run_dir / "summary.json").read_text()),
    }
