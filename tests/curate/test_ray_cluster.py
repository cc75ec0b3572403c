"""kiln on a Ray cluster of nodes that share no disk, started with the commands docs/storage.md gives, as written
there (token authentication included), with the corpus and the run in an object store (the S3 API of a server on
localhost, tests/conftest.py).

One head (no CPU: it only schedules) serves the module; each test starts the worker nodes it needs, of one CPU each
and each with its own KILN_CACHE (its mirror of the run), and stops them after; the driver, a `kiln` process of its
own, has a third cache. Every task reads from and writes to the bucket.
- Two workers curate and tokenize; one worker's raylet is killed (SIGKILL) mid-run (its tasks run again on the
  other), then the other stops: the run says the cluster has no CPU and stops. With a worker back the re-run says
  what each phase skips, and the outputs are byte-identical to a local run of the same recipe.
- What stops a run stops it in one line, no traceback: a head alone (no CPU for a task), a driver without the
  cluster's token (nothing written in the bucket), a worker whose kiln reports another version (before any task),
  a worker whose KILN_CACHE is a regular file (naming it and the node).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from curate_corpus import write_corpus

from kiln import __version__ as KILN_VERSION

s3fs = pytest.importorskip("s3fs")
pytest.importorskip("ray")
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
DOCS = Path(__file__).parents[2] / "docs" / "storage.md"
RECIPE = {
    "name": "cluster",
    "curate": {"shard_mb": 0.01, "sources": {}},
    "tokenizer": {"vocab_size": 400, "sample_mb": 1},
    "tokenize": {"val_fraction": 0.2},
}
# Flags for nodes sharing one machine, beside the documented ones: one address, none of the extras.
LOCAL_NODE = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", "--include-log-monitor=false"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def documented() -> tuple[dict[str, str], list[str], list[str]]:
    """docs/storage.md's Ray commands as written: the environment every node and the driver get (its `export`
    line), the head's `ray start` and a worker's."""
    block = next(b for b in DOCS.read_text().split("```")[1::2] if "ray start --head" in b)
    env: dict[str, str] = {}
    starts = []
    for line in block.splitlines():
        if line.startswith("export "):
            env.update(word.split("=", 1) for word in shlex.split(line, comments=True)[1:])
        elif line.startswith("ray start"):
            starts.append(shlex.split(line, comments=True))
    head = next(s for s in starts if "--head" in s)
    worker = next(s for s in starts if "--head" not in s)
    return env, head, worker


@dataclass
class Cluster:
    """The module's head, and how to start worker nodes on it and `kiln` drivers for it."""

    address: str
    env: dict[str, str]  # every node's and a driver's: the documented settings, the test's token
    worker: list[str]  # the documented worker command, for this head
    root: Path

    @contextmanager
    def workers(self, *caches: Path, **extra: str) -> Iterator[list[int]]:
        """Worker nodes of one CPU, one per KILN_CACHE given (`extra`: more of their environment); yields their
        node-manager ports and stops them after (SIGTERM to a raylet: the head marks its node dead at once, where
        a killed one is noticed by the head's health checks, in about 3 s). One at a time: two starting at once on
        a loaded machine have overrun Ray's 30 s for a raylet to register."""
        managers: list[int] = []
        try:
            for cache in caches:
                managers.append(free_port())
                started = subprocess.run(
                    [str(BIN / "ray"), *self.worker[1:], "--num-cpus=1", f"--node-manager-port={managers[-1]}"]
                    + LOCAL_NODE,
                    env={**self.env, "KILN_CACHE": str(cache), **extra},
                    capture_output=True,
                    text=True,
                )
                assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
            yield managers
        finally:
            for m in managers:
                stop_node(m)

    def driver(
        self, recipe: Path, verb: str, bucket: str, *sets: str, env: dict[str, str] | None = None, address: str = ""
    ) -> subprocess.Popen[str]:
        """`kiln VERB` on this cluster (or `address`), its run in `bucket`, in `env` (else driver_env's)."""
        on_ray = [f"runs_dir=s3://{bucket}/runs"]
        for stage in ("curate", "tokenize"):
            on_ray += [f"{stage}.executor.kind=ray", f"{stage}.executor.ray_address={address or self.address}"]
        return kiln(recipe, verb, env or self.driver_env(bucket), *on_ray, *sets)

    def driver_env(self, bucket: str) -> dict[str, str]:
        """A driver's environment: the nodes' (the documented settings), no GPU, a cache of its own."""
        return {**self.env, "CUDA_VISIBLE_DEVICES": "", "KILN_CACHE": str(self.driver_cache(bucket))}

    def driver_cache(self, bucket: str) -> Path:
        return self.root / f"driver-{bucket}"


def raylet(manager: int) -> tuple[list[str], str]:
    """The raylet of the node with this node-manager port: its pids, and its Ray node id."""
    found = subprocess.run(
        ["pgrep", "-af", f"raylet.*node_manager_port={manager}( |$)"], capture_output=True, text=True
    ).stdout
    ids = re.findall(r"--node_id=(\w+)", found)
    return [line.split()[0] for line in found.splitlines()], ids[0] if ids else ""


def children(pids: list[str]) -> list[str]:
    return [c for p in pids for c in subprocess.run(["pgrep", "-P", p], capture_output=True, text=True).stdout.split()]


def stop_node(manager: int) -> None:
    """Stop a worker node: SIGTERM to its raylet, then SIGKILL to whatever of it is left."""
    pids, _ = raylet(manager)
    below = children(pids)
    for pid in pids:
        subprocess.run(["kill", "-TERM", pid], capture_output=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    for pid in {*pids, *below} - {str(os.getpid())}:
        subprocess.run(["kill", "-KILL", pid], capture_output=True)


def stop(pattern: str) -> None:
    """SIGKILL the processes whose command line matches, and their children (a raylet's agents rename
    themselves and outlive it)."""
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    for pid in {*found, *children(found)} - {str(os.getpid())}:
        subprocess.run(["kill", "-KILL", pid], capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_store: str, ray_local: object) -> Iterator[Cluster]:
    """The head, started as docs/storage.md says (its `export` line and `ray start --head`), on a free port.
    Beside the suite's own Ray instance (ray_local: its group runs the Ray tests one at a time), with a
    temporary folder of its own, by which its processes and its workers', and only they, are stopped after."""
    documented_env, head, worker = documented()
    assert documented_env.get("RAY_AUTH_MODE") == "token", "docs/storage.md: every node needs RAY_AUTH_MODE=token"
    port = free_port()
    address = f"127.0.0.1:{port}"
    # The documented placeholders: the token (`...`), the head's address and port.
    token = {"...": secrets.token_hex(32)}
    # The head checks its nodes every second and marks one dead after 3 failed checks: a killed raylet is noticed
    # in about 3 s, not Ray's default 15 s (5 checks 3 s apart), which the loses-its-workers test spent waiting.
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    env.update({k: token.get(v, v) for k, v in documented_env.items()})
    head = [w.replace("--port=6379", f"--port={port}") for w in head]
    worker = [w.replace("HEAD:6379", address) for w in worker]
    temp = tempfile.mkdtemp(prefix="kiln-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    try:
        subprocess.run(
            [str(BIN / "ray"), *head[1:], "--include-dashboard=false", f"--temp-dir={temp}", *LOCAL_NODE],
            env=env,
            check=True,
            capture_output=True,
        )
        yield Cluster(address, env, worker, tmp_path_factory.mktemp("cluster"))
    finally:
        stop(f"{temp}|:{port}( |$)")
        shutil.rmtree(temp, ignore_errors=True)


def kiln(recipe: Path, verb: str, env: dict[str, str], *sets: str) -> subprocess.Popen[str]:
    args = [str(BIN / "kiln"), verb, "--recipe", str(recipe)]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str], code: int = 0) -> str:
    try:
        _, err = process.communicate(timeout=400)
    finally:
        process.kill()  # a command that overran, or a test that failed while it ran, leaves nothing behind
    assert process.returncode == code, err[-4000:]
    return err


def one_line_error(err: str) -> str:
    """The error a failed `kiln` ended with, checked to be one line after no traceback."""
    assert "Traceback" not in err, err[-4000:]
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith("kiln curate: error: "), err[-4000:]
    return last


def corpus_in_bucket(root: Path, pages: int, books: int) -> tuple[str, Path]:
    """A fresh bucket holding the corpus, and a recipe reading it there."""
    write_corpus(root, pages=pages, books=books)
    fs = s3fs.S3FileSystem()
    bucket = f"kiln-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    fs.put(str(root / "in"), f"{bucket}/in", recursive=True)
    recipe = root / "recipe.yaml"
    inputs = [{"path": f"s3://{bucket}/in/web/*.jsonl"}, {"path": f"s3://{bucket}/in/books"}]
    recipe.write_text(yaml.safe_dump({**RECIPE, "curate": {**RECIPE["curate"], "inputs": inputs}}))
    return bucket, recipe


def outputs(manifest: dict) -> list[tuple[str, int, str]]:
    return [(o["path"], o["bytes"], o["sha256"]) for o in manifest["outputs"]]


def test_a_cluster_with_no_cpu_for_tasks_stops_the_run_in_one_line(cluster: Cluster, tmp_path: Path) -> None:
    # The head alone (0 CPUs): the run said it ran on 1 CPU and waited in silence until killed.
    bucket, recipe = corpus_in_bucket(tmp_path, pages=8, books=1)
    err = finish(cluster.driver(recipe, "curate", bucket, "curate.executor.wait_for_cpus_s=1"), code=2)
    assert f"the Ray cluster at {cluster.address} has no CPU for a task" in err  # said while it waits
    assert "with 1 CPUs" not in err
    assert one_line_error(err).startswith(
        f"kiln curate: error: curate.executor: the Ray cluster at {cluster.address} had no CPU for a task for 1 s"
    )


def test_a_driver_that_cannot_join_stops_in_one_line_before_writing_anything(cluster: Cluster, tmp_path: Path) -> None:
    bucket, recipe = corpus_in_bucket(tmp_path, pages=8, books=1)
    # Without the cluster's token (RAY_AUTH_MODE unset), Ray trying once rather than 20 times; and an
    # address where nothing listens, which Ray would retry for about 13 minutes.
    tokenless = {k: v for k, v in cluster.driver_env(bucket).items() if not k.startswith("RAY_AUTH_")}
    refused = cluster.driver(recipe, "curate", bucket, env={**tokenless, "RAY_NUM_REDIS_GET_RETRIES": "1"})
    nowhere = f"127.0.0.1:{free_port()}"
    silent = cluster.driver(recipe, "curate", bucket, address=nowhere)
    line = one_line_error(finish(refused, code=2))
    assert line.startswith(f"kiln curate: error: curate.executor: the Ray cluster at {cluster.address} refused")
    assert "RAY_AUTH_MODE=token" in line
    line = one_line_error(finish(silent, code=2))
    assert line.startswith(f"kiln curate: error: curate.executor.ray_address={nowhere}: nothing answers there")
    assert not s3fs.S3FileSystem().find(f"{bucket}/runs")  # no lock, no curate.partial/in_progress.json


def test_a_worker_of_another_kiln_stops_the_run_before_any_task(cluster: Cluster, tmp_path: Path) -> None:
    # A worker whose `kiln` reports another version (its Python processes import this shim first).
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import kiln\n\nkiln.__version__ = '0.0.0+other'\n")
    bucket, recipe = corpus_in_bucket(tmp_path, pages=8, books=1)
    with cluster.workers(tmp_path / "node", PYTHONPATH=str(shim)) as managers:
        _, node = raylet(managers[0])
        line = one_line_error(finish(cluster.driver(recipe, "curate", bucket), code=2))
    assert re.match(
        rf"kiln curate: error: curate\.executor: Ray node {node[:8]} on {re.escape(socket.gethostname())} \(.+\) "
        rf"runs another version \(kiln 0\.0\.0\+other there, {re.escape(KILN_VERSION)} here\)",
        line,
    ), line
    assert not s3fs.S3FileSystem().find(f"{bucket}/runs")  # before any task: nothing written


def test_a_worker_whose_kiln_cache_is_a_file_stops_the_run_in_one_line_naming_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    cache = tmp_path / "cache-file"
    cache.write_text("not a folder")
    bucket, recipe = corpus_in_bucket(tmp_path, pages=8, books=1)
    with cluster.workers(cache) as managers:
        _, node = raylet(managers[0])
        line = one_line_error(finish(cluster.driver(recipe, "curate", bucket), code=2))
    assert line.startswith(f"kiln curate: error: curate.executor: Ray node {node[:8]} on {socket.gethostname()} ")
    assert "KILN_CACHE" in line and str(cache) in line
    s3fs.S3FileSystem().invalidate_cache()  # the failed run released its lock: another host is not refused
    assert not s3fs.S3FileSystem().glob(f"{bucket}/runs/*/curate.lock")


def test_curate_and_tokenize_on_a_cluster_that_loses_its_workers_match_a_local_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    bucket, recipe = corpus_in_bucket(tmp_path, pages=80, books=12)
    fs = s3fs.S3FileSystem()
    work = f"{bucket}/runs/cluster/curate.partial/work"
    wait = "curate.executor.wait_for_cpus_s=1"  # how long the run waits once no worker is left

    def wait_for(pattern: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not fs.glob(f"{work}/{pattern}"):
            fs.invalidate_cache()
            time.sleep(0.2)

    with cluster.workers(tmp_path / "node0", tmp_path / "node1") as managers:
        curate = cluster.driver(recipe, "curate", bucket, wait)
        wait_for("read/*.done")  # the first read task finished
        assert raylet(managers[0])[0], "no raylet found for the first worker node"
        stop(f"raylet.*node_manager_port={managers[0]}( |$)")  # killed: its tasks run again on the other node
        wait_for("filter/*.done")  # the read phase finished without it
        stop_node(managers[1])  # the last worker goes: no CPU left for a task
        err = finish(curate, code=2)
    assert f"the Ray cluster at {cluster.address} has no CPU for a task" in err
    assert one_line_error(err).startswith(
        f"kiln curate: error: curate.executor: the Ray cluster at {cluster.address} had no CPU for a task for 1 s"
    )
    assert not fs.exists(f"{bucket}/runs/cluster/curate/manifest.json")  # stopped mid-run

    # Every phase that has finished tasks says how many the re-run skips (the lines phase, as one).
    fs.invalidate_cache()
    done = {p: len(fs.glob(f"{work}/{p}/*.done")) for p in ("read", "filter", "dedup", "sign", "buckets")}
    assert done["filter"] and fs.exists(f"{work}/lines/boilerplate.npy")  # the lines phase had finished
    with cluster.workers(tmp_path / "node1"):  # a worker is back
        again = cluster.driver(recipe, "curate", bucket, wait)
        # Meanwhile the local reference, in this process (a kiln subprocess spends 4 s on imports), while the
        # re-run waits on its one worker.
        from kiln.cli import main

        local = tmp_path / "local"
        for verb in ("curate", "train-tokenizer", "tokenize"):
            assert main([verb, "--recipe", str(recipe), "--set", f"runs_dir={local}"]) == 0
        err = finish(again)
        for phase, count in done.items():
            assert not count or f"curate: {phase} phase: {count} of" in err, (phase, err[-4000:])
        assert "curate: lines phase: finished earlier" in err
        # Tasks ran on the worker nodes, each in its own mirror; the driver keeps no curated shard.
        assert list((tmp_path / "node1").rglob("work/read/*.done"))
        assert not list(cluster.driver_cache(bucket).rglob("shards/*.jsonl.zst"))
        for verb in ("train-tokenizer", "tokenize"):
            finish(cluster.driver(recipe, verb, bucket))

    for stage in ("curate", "tokenize"):
        stored = json.loads(fs.cat(f"{bucket}/runs/cluster/{stage}/manifest.json"))
        here = json.loads((local / "cluster" / stage / "manifest.json").read_text())
        assert outputs(stored) == outputs(here), stage
        assert stored["counts"] == here["counts"], stage
