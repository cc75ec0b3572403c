"""kiln.core.executors: local (inline and process pool) and Ray give the same results for the same tasks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiln.core.executors import ExecutorConfig, build_executor


def square(x: int) -> tuple[int, int]:
    return x, x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("task 3 failed")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_local_runs_every_task(workers):
    executor = build_executor(ExecutorConfig(workers=workers), "test.executor")
    try:
        assert sorted(executor.imap_unordered(square, range(10))) == [(i, i * i) for i in range(10)]
        assert sorted(executor.imap_unordered(square, range(3, 6))) == [
            (i, i * i) for i in range(3, 6)
        ]  # the pool is reused
    finally:
        executor.close()


def test_local_task_error_propagates():
    executor = build_executor(ExecutorConfig(workers=2), "test.executor")
    try:
        with pytest.raises(ValueError, match="task 3 failed"):
            list(executor.imap_unordered(fail_on_three, range(6)))
    finally:
        executor.close()


def test_ray_runs_every_task_on_a_local_instance(ray_local):
    # Ray workers import task functions by module; a test module is not importable there, so
    # the task is a standard-library Python function.
    assert sorted(ray_local.imap_unordered(json.loads, [str(i) for i in range(10)])) == list(range(10))
    with pytest.raises(Exception, match="Expecting value"):
        list(ray_local.imap_unordered(json.loads, ["1", "not json", "3"]))


def die_once(marker: str) -> int:
    """The first attempt kills its own worker process, as a lost node would; a later one returns its pid."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(1)
    return os.getpid()


def test_ray_runs_a_task_again_when_its_worker_dies(ray_local, tmp_path: Path):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import a test module
    try:
        markers = [str(tmp_path / f"task{i}") for i in range(3)]
        pids = list(ray_local.imap_unordered(die_once, markers))
        assert len(pids) == 3 and all(Path(m).read_text() == "died" for m in markers)  # each died once, ran again
        ray_local.max_retries = 0
        with pytest.raises(Exception, match="(?i)worker.*(died|crashed|exit)"):
            list(ray_local.imap_unordered(die_once, [str(tmp_path / "again")]))
    finally:
        ray_local.max_retries = 3
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_workers_of_another_kiln_version_are_refused_before_any_task(ray_local):
    import ray

    from kiln.core.errors import FatalError
    from kiln.core.executors import ray as ray_executor

    ray_executor.check_worker_versions(ray, "curate.executor")  # the local instance runs this very kiln
    newer = {"python": ray_executor.versions()["python"], "kiln": "999.0"}  # this process, as if upgraded
    refused = r"^curate\.executor: Ray node \w{8} on .+ runs another version \(kiln .* there, 999\.0 here\)"
    with pytest.raises(FatalError, match=refused):
        ray_executor.check_worker_versions(ray, "curate.executor", newer)
    # Each task checks too (a node may join after the first check), before it unpickles its work.
    ray_local._versions = newer
    try:
        with pytest.raises(FatalError, match=refused.replace(r"curate\.", "", 1)):
            list(ray_local.imap_unordered(json.loads, ["1"]))
    finally:
        ray_local._versions = ray_executor.versions()


def test_a_task_error_on_a_ray_node_is_one_line_naming_the_node(ray_local, tmp_path: Path):
    from kiln.core.errors import FatalError

    missing = tmp_path / "missing"
    with pytest.raises(FatalError) as caught:
        list(ray_local.imap_unordered(os.listdir, [str(missing)]))
    # not a RayTaskError carrying the worker's traceback
    assert type(caught.value) is FatalError
    assert re.fullmatch(
        rf"executor: Ray node \w{{8}} on .+ \(.+\): {re.escape(str(missing))}: "
        r"No such file or directory \(FileNotFoundError\)",
        str(caught.value),
    )


def test_a_missing_ray_is_named_by_the_section_that_asked_for_it(monkeypatch: pytest.MonkeyPatch):
    import builtins

    from kiln.core.errors import FatalError

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(FatalError, match=r"^tokenize\.executor\.kind=ray needs the `ray` package"):
        build_executor(ExecutorConfig(kind="ray"), "tokenize.executor")


# A parent that starts a local pool on two slow tasks: each worker records its pid, then keeps
# appending to a file (as a shard task writes its output) for a minute.
POOL_PARENT = """
import os, sys, time
from pathlib import Path
from kiln.core.executors.local import LocalExecutor

def write_on(folder):
    folder = Path(folder)
    (folder / f"{os.getpid()}.pid").touch()
    with open(folder / f"{os.getpid()}.out", "a") as out:
        for _ in range(1200):
            out.write("x")
            out.flush()
            time.sleep(0.05)

if __name__ == "__main__":
    list(LocalExecutor(2).imap_unordered(write_on, [sys.argv[1]] * 2))
"""


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")
def test_pool_workers_end_with_a_killed_parent(tmp_path: Path) -> None:
    # kill -9 of `kiln tokenize` left its pool workers writing into tokenize.partial while the next
    # run took the lock. SIGKILL gives the parent no chance to stop them: they must go by themselves.
    script = tmp_path / "parent.py"
    script.write_text(POOL_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    deadline = time.monotonic() + 60
    while len(pids := [int(p.stem) for p in tmp_path.glob("*.pid")]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids) == 2, "the workers did not start"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not any(alive(p) for p in pids), "a worker outlived its killed parent"
        sizes = [p.stat().st_size for p in tmp_path.glob("*.out")]
        time.sleep(0.3)
        assert [p.stat().st_size for p in tmp_path.glob("*.out")] == sizes  # nothing writes on
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
