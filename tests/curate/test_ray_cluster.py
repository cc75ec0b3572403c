"""curate and tokenize on a Ray cluster of three nodes that share no disk, with the corpus and the run in an
object store (the S3 API of a server on localhost, tests/conftest.py).

The test starts a head node (no CPU: it only schedules) and two worker nodes of one CPU each, each worker with
its own KILN_CACHE (its mirror of the run); the driver, a `kiln` process of its own, has a third. Every task
reads from and writes to the bucket. One worker node's raylet is killed (SIGKILL) while curate runs: its tasks
run again on the other node. The outputs must be byte-identical to a local run of the same recipe."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from curate_corpus import write_corpus

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("ray")
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
# A cluster on localhost for this test: Ray's token authentication off (a real cluster keeps it on, with the
# token given to every node and to the driver, as Ray's docs say).
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
RECIPE = {
    "name": "cluster",
    "curate": {"shard_mb": 0.01, "sources": {}},
    "tokenizer": {"vocab_size": 400, "sample_mb": 1},
    "tokenize": {"val_fraction": 0.2},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kiln(recipe: Path, verb: str, env: dict[str, str], *sets: str) -> subprocess.Popen[str]:
    args = [str(BIN / "kiln"), verb, "--recipe", str(recipe)]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> str:
    try:
        _, err = process.communicate(timeout=400)
    finally:
        process.kill()  # a command that overran, or a test that failed while it ran, leaves nothing behind
    assert process.returncode == 0, err[-4000:]
    return err


def outputs(manifest: dict) -> list[tuple[str, int, str]]:
    return [(o["path"], o["bytes"], o["sha256"]) for o in manifest["outputs"]]


@pytest.fixture
def cluster(tmp_path: Path, s3_store: str, ray_local: object) -> Iterator[tuple[str, list[int]]]:
    """A head and two worker nodes on this machine; yields (address, the worker nodes' node-manager ports).
    Beside the suite's own Ray instance (ray_local: its group runs the Ray tests one at a time), with a
    temporary folder of its own, by which its processes, and only they, are stopped after."""
    port, managers = free_port(), [free_port(), free_port()]
    temp = tempfile.mkdtemp(prefix="kiln-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, **RAY_ENV}
    ray = str(BIN / "ray")
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--include-log-monitor=false"]
    head = [f"--port={port}", "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={temp}"]
    try:
        subprocess.run([ray, "start", "--head", *head, *common], env=env, check=True, capture_output=True)
        for i, manager in enumerate(managers):
            subprocess.run(
                [
                    ray,
                    "start",
                    f"--address=127.0.0.1:{port}",
                    "--num-cpus=1",
                    f"--node-manager-port={manager}",
                    *common,
                ],
                env={**env, "KILN_CACHE": str(tmp_path / f"node{i}")},
                check=True,
                capture_output=True,
            )
        yield f"127.0.0.1:{port}", managers
    finally:
        stop(f"{temp}|:{port}( |$)")
        shutil.rmtree(temp, ignore_errors=True)


def stop(pattern: str) -> None:
    """SIGKILL the processes whose command line matches, and their children (a raylet's agents rename
    themselves and outlive it)."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    children = [subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split() for pid in found]
    for pid in {*found, *(c for group in children for c in group)} - {str(os.getpid())}:
        subprocess.run(["kill", "-KILL", pid], capture_output=True)


def test_curate_and_tokenize_on_three_nodes_without_shared_disk_match_a_local_run(
    cluster: tuple[str, list[int]], tmp_path: Path
) -> None:
    address, managers = cluster
    write_corpus(tmp_path, pages=80, books=12)
    fs = s3fs.S3FileSystem()
    bucket = f"kiln-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    fs.put(str(tmp_path / "in"), f"{bucket}/in", recursive=True)
    recipe = tmp_path / "recipe.yaml"
    inputs = [{"path": f"s3://{bucket}/in/web/*.jsonl"}, {"path": f"s3://{bucket}/in/books"}]
    recipe.write_text(yaml.safe_dump({**RECIPE, "curate": {**RECIPE["curate"], "inputs": inputs}}))
    env = {**os.environ, **RAY_ENV, "CUDA_VISIBLE_DEVICES": ""}

    from kiln.cli import main  # the local reference in this process: a kiln subprocess spends 4 s on imports

    local = tmp_path / "local"
    for verb in ("curate", "train-tokenizer", "tokenize"):
        assert main([verb, "--recipe", str(recipe), "--set", f"runs_dir={local}"]) == 0

    on_ray = [
        f"runs_dir=s3://{bucket}/runs",
        "curate.executor.kind=ray",
        f"curate.executor.ray_address={address}",
        "tokenize.executor.kind=ray",
        f"tokenize.executor.ray_address={address}",
    ]
    driver = {**env, "KILN_CACHE": str(tmp_path / "driver")}
    curate = kiln(recipe, "curate", driver, *on_ray)
    markers = f"{bucket}/runs/cluster/curate.partial/work/read/*.done"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not fs.glob(markers, refresh=True):  # the first read task finished
        fs.invalidate_cache()
        time.sleep(0.2)
    raylet = subprocess.run(["pgrep", "-f", f"raylet.*node_manager_port={managers[0]}"], capture_output=True, text=True)
    assert raylet.stdout.split(), "no raylet found for the first worker node"
    stop(f"raylet.*node_manager_port={managers[0]}")
    assert not fs.exists(f"{bucket}/runs/cluster/curate/manifest.json")  # mid-run
    finish(curate)
    # Tasks ran on the worker nodes, each in its own mirror; the driver keeps no curated shard.
    assert list((tmp_path / "node1").rglob("work/read/*.done"))
    assert not list((tmp_path / "driver").rglob("shards/*.jsonl.zst"))
    for verb in ("train-tokenizer", "tokenize"):
        finish(kiln(recipe, verb, driver, *on_ray))

    for stage in ("curate", "tokenize"):
        stored = json.loads(fs.cat(f"{bucket}/runs/cluster/{stage}/manifest.json"))
        here = json.loads((local / "cluster" / stage / "manifest.json").read_text())
        assert outputs(stored) == outputs(here), stage
        assert stored["counts"] == here["counts"], stage
