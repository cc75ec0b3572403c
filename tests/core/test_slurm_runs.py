"""Slurm runs as users meet them, against the real local cluster (tests/slurm_cluster.py): a run that detaches and
is finished by the same command later, a run in a bucket whose nodes share no disk, more tasks than one array may
hold, and the faults (an element cancelled, a queue that takes no more jobs), each said in one line naming the job."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kiln.cli import main
from kiln.core.errors import FatalError
from kiln.core.executors import slurm as slurm_executor
from kiln.core.executors.slurm import SlurmConfig, SlurmExecutor

TESTS = Path(__file__).resolve().parents[1]
STAGE = {
    "inputs": [{"format": "gettext_messages", "locales": ["en", "fr"]}],
    "exact_dedup": {"enabled": False},
    "minhash_dedup": {"enabled": False},
}


@pytest.fixture
def cluster(slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's arrays go to the cluster, their folders under tmp_path; elements import tests/slurm_cluster.py."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setattr(slurm_executor, "_config", SlurmConfig(jobs_dir=str(tmp_path / "jobs"), status_every_s=0.5))
    sys.path.insert(0, str(TESTS))
    return tmp_path / "jobs"


def recipe(tmp_path: Path, kind: str = "slurm", **slurm: object) -> Path:
    path = tmp_path / f"{kind}.yaml"
    curate = {**STAGE, "executor": {"kind": kind, "workers": 2}}
    path.write_text(yaml.safe_dump({"name": "sl", "curate": curate, "slurm": {"status_every_s": 0.5, **slurm}}))
    return path


def test_a_detached_run_is_finished_by_the_same_command_later(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    command = ["curate", "--recipe", str(recipe(tmp_path, jobs_dir=str(cluster))), "--set", f"runs_dir={tmp_path}"]
    assert main([*command, "--detach"]) == 75
    said = capsys.readouterr().out
    array = re.search(
        r"kiln curate: curate\.executor: \d+ tasks submitted as Slurm array (\d+) \(logs .*\); this", said
    )
    assert array, said
    # At once again, with --detach: the array still runs, and says so (nothing submitted twice).
    assert main([*command, "--detach"]) == 75
    again = capsys.readouterr().out
    assert re.search(rf"\d+ tasks done, \d+ in the queue as Slurm array {array[1]}, submitted by a --detach run", again)
    with caplog.at_level(logging.INFO):
        assert main(command) == 0  # waits for the array, then goes on from its tasks' markers
    assert re.search(r"curate: read phase: (\d+) of \1 tasks already finished, skipped", caplog.text)
    manifest = json.loads((tmp_path / "sl" / "curate" / "manifest.json").read_text())
    assert manifest["counts"]["docs_in"] > 100
    assert not list(cluster.glob("*/task-*.pkl"))  # every array's folder removed once read


def kill_an_element(folder: str) -> threading.Thread:
    """A thread that kills the first element it sees of an array in folder (SIGKILL, as the OOM killer or a lost node
    would); other tests' elements, running beside this one, are left alone."""

    def kill() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if subprocess.run(["pkill", "-9", "-f", "-n", f"kiln.core.executors.slurm {folder}"]).returncode == 0:
                return
            time.sleep(0.05)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_a_run_in_a_bucket_on_nodes_that_share_no_disk_equals_a_local_run(
    cluster: Path, tmp_path: Path, s3_store: str, caplog: pytest.LogCaptureFixture
) -> None:
    import s3fs

    bucket = f"kiln-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem().mkdir(bucket)
    # Each node its own KILN_CACHE (its copy of the run); the tasks, results and logs beside the run, in the bucket.
    setup = f"export KILN_CACHE={tmp_path}/cache-$SLURMD_NODENAME"
    in_bucket = recipe(tmp_path, setup=setup)
    # An element killed: its task runs again, and nothing is counted twice (the counts equal a local run's).
    killer = kill_an_element(f"s3://{bucket}/")
    with caplog.at_level(logging.WARNING, "kiln.executors"):
        assert main(["curate", "--recipe", str(in_bucket), "--set", f"runs_dir=s3://{bucket}/runs"]) == 0
    killer.join()
    assert re.search(r"Slurm job \d+_\d+, ended without a result \(FAILED, exit 0:9; log /tmp/kiln-slurm-", caplog.text)
    assert main(["curate", "--recipe", str(recipe(tmp_path, "local")), "--set", f"runs_dir={tmp_path}/local"]) == 0
    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    there = json.loads(fs.cat_file(f"{bucket}/runs/sl/curate/manifest.json"))
    here = json.loads((tmp_path / "local" / "sl" / "curate" / "manifest.json").read_text())
    assert [(o["path"], o["sha256"]) for o in there["outputs"]] == [(o["path"], o["sha256"]) for o in here["outputs"]]
    assert there["counts"] == here["counts"]
    assert sorted(p.name for p in tmp_path.glob("cache-*")) == ["cache-n1", "cache-n2"]  # both nodes ran tasks
    assert not fs.glob(f"{bucket}/runs/.kiln-slurm/*/task-*.pkl")  # every array's objects removed once read


def test_more_tasks_than_one_array_holds_run_as_several_within_the_cap_two_tasks_per_element(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from slurm_cluster import square

    monkeypatch.setattr(slurm_executor, "max_array", lambda: 2)  # as a cluster whose MaxArraySize is 3
    two = SlurmConfig(jobs_dir=str(cluster), status_every_s=0.5, tasks_per_element=2)
    monkeypatch.setattr(slurm_executor, "_config", two)
    with caplog.at_level(logging.INFO, "kiln.executors"):
        assert sorted(SlurmExecutor(2, "test.executor").imap_unordered(square, range(7))) == [0, 1, 4, 9, 16, 25, 36]
    # Tasks 0-3 as two elements of one array, 4-6 as two elements (the last with one task) of another.
    assert re.search(r"7 tasks as Slurm array \d+, \d+ \(logs ", caplog.text)


def test_a_cancelled_element_stops_the_phase_naming_its_job_and_log(cluster: Path) -> None:
    from slurm_cluster import nap

    def cancel_the_first_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = subprocess.run(["squeue", "-h", "-r", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True)
            if running := rows.stdout.split():
                subprocess.run(["scancel", running[0]], check=True)
                return
            time.sleep(0.2)

    canceller = threading.Thread(target=cancel_the_first_running)
    canceller.start()
    cancelled = r"test\.executor: task \d, Slurm job \d+_\d, was cancelled \(CANCELLED.*; log .*/log-\d+_\d\.txt\)"
    with pytest.raises(FatalError, match=cancelled):
        list(SlurmExecutor(2, "test.executor").imap_unordered(nap, [30.0, 30.0, 30.0]))
    canceller.join()
    deadline = time.monotonic() + 10  # the rest of the array was cancelled too: gone once Slurm has ended them
    while (
        time.monotonic() < deadline
        and "kiln-test.executor" in subprocess.check_output(["squeue", "-h", "-o", "%j"]).decode()
    ):
        time.sleep(0.2)
    assert "kiln-test.executor" not in subprocess.check_output(["squeue", "-h", "-o", "%j"]).decode()


@pytest.fixture
def full_queue(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A second cluster whose queue holds two jobs, filled with held jobs (until sbatch waits for room)."""
    from slurm_cluster import start

    found = start(tmp_path_factory.mktemp("full"), settings="MaxJobCount=2\n")
    if isinstance(found, str):
        pytest.skip(found)
    try:
        for _ in range(3):
            held = ["sbatch", "--hold", "--wrap", "sleep 60", "-o", "/dev/null"]
            try:
                subprocess.run(held, env=found.env, check=True, capture_output=True, timeout=3)
            except subprocess.TimeoutExpired:
                break
        monkeypatch.setenv("SLURM_CONF", found.env["SLURM_CONF"])
        yield found.env
    finally:
        found.stop()


def test_a_full_queue_is_one_line(full_queue: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_executor, "_config", SlurmConfig(jobs_dir=str(tmp_path / "jobs")))
    monkeypatch.setattr(slurm_executor, "SBATCH_WAIT_S", 3.0)
    full = r"executor slurm: the cluster took no job for 3 s \(.*\): its queue is full; finished tasks are kept"
    with pytest.raises(FatalError, match=full):
        list(SlurmExecutor(1, "curate.executor").imap_unordered(abs, [1]))
