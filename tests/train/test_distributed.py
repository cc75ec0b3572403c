"""Data parallelism through torchrun on the CPU (gloo): DDP and FSDP2 with 2 processes train the
same model as 1 process with the same global batch, on one "node" or two.

Each launch is a real `torchrun -m kiln train` (or `kiln train --nproc 2`) on a copy of the shared
miniature run (tests/train/launches.py); the losses are read from metrics.jsonl. One
process accumulates 4 micro-batches of 4 rows; two take 2 each, so every step sees the same 16
rows (the sampler deals the global stream by rank). Measured: about 12 s per launch on 2 cores.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from launches import (
    ENV,
    STEPS,
    assert_same_losses,
    assert_same_weights,
    command,
    copy_run,
    free_port,
    kill_after,
    launch,
    nodes_command,
    run_here,
    run_nodes,
    step_records,
    write_recipe,
)

# On one pytest-xdist worker: the module's single-process run is trained once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("train_distributed")]


@pytest.fixture(scope="module")
def single(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("single")
    return launch(tokenized_run, root, 1), root


@pytest.mark.parametrize(
    ("layout", "overrides"),
    [("ddp", ("parallel.dp_replicate=2", "parallel.dp_shard=1")), ("fsdp2", ("parallel.dp_shard=-1",))],
)
def test_two_processes_match_one_with_the_same_global_batch(
    layout: str, overrides: tuple[str, ...], single: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    # DDP through `kiln train --nproc 2` (which runs torchrun); FSDP2 as two torchrun "nodes" of
    # one process each on this machine, meeting at a c10d rendezvous (--nnodes 2), as on a cluster.
    one, one_root = single
    if layout == "ddp":
        two = launch(tokenized_run, tmp_path, 2, *overrides, micro=2, via_kiln=True)
    else:
        copy_run(tokenized_run, tmp_path / "runs")
        recipe, port = write_recipe(tmp_path, micro=2), free_port()
        stderr = run_nodes([nodes_command(recipe, 2, 1, port, *overrides) for _ in range(2)])
        assert (
            sum("mesh pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 1 over 2 processes" in e for e in stderr) == 1
        )  # rank 0's node logs it
        two = step_records(tmp_path / "runs")
    assert_same_losses(two, one)
    # One writer, the same consolidated checkpoint format whatever the layout.
    assert_same_weights(tmp_path, one_root, atol=1e-5)
    manifest = json.loads((tmp_path / "runs" / "run" / "train" / "manifest.json").read_text())
    assert manifest["counts"]["processes"] == 2


def test_killed_run_resumes_exactly(
    single: tuple[list, Path], tokenized_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Resumable states every 5 steps; killed once step 12 is logged (on a busy machine the run may
    # have gone a few steps further, and may be writing step 15's state under its .tmp name), the
    # run resumes from its newest complete state and its losses from there on are those of the
    # uninterrupted run (1 process), for a state written by 2 processes and resumed by 1. A
    # half-written .tmp state is never the one resumed. (One process killed and resumed, bit for
    # bit: the SIGTERM test below; states written in the background, and across pipeline, context
    # and tensor-parallel layouts: test_pipeline_parallel.py.)
    first, second = 2, 1
    overrides = ["train.checkpoint.every=5", "parallel.dp_replicate=2", "parallel.dp_shard=1"]
    runs_dir = tmp_path / "runs"
    copy_run(tokenized_run, runs_dir)
    # micro-batches of 2 rows on either layout: the recipe (and so the stage's identity) stays the same.
    recipe = write_recipe(tmp_path, STEPS, micro=2)

    metrics = runs_dir / "run" / "train.partial" / "metrics.jsonl"
    kill_after(command(recipe, first, *overrides), metrics, 12)
    complete = sorted(
        p.name for p in (runs_dir / "run" / "train.partial" / "checkpoints").iterdir() if p.suffix != ".tmp"
    )
    last = int(complete[-1].removeprefix("step-"))
    assert last >= 10
    with caplog.at_level(logging.INFO, logger="kiln"):
        run_here(command(recipe, second, *overrides))  # the one process in this one: no 4 s of imports
    assert f"resuming after step {last}" in caplog.text
    steps = step_records(runs_dir)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # the killed run's steps after `last` were cut back
    uninterrupted = {r["step"]: r["loss"] for r in single[0]}
    assert [r["loss"] for r in steps[last:]] == pytest.approx(
        [uninterrupted[s] for s in range(last + 1, STEPS + 1)], rel=1e-4
    )


def test_sigterm_saves_a_resumable_state_and_the_run_continues_exactly(
    single: tuple[list, Path], tokenized_run: Path, tmp_path: Path
) -> None:
    # A scheduler's preemption notice: SIGTERM after step 8 is logged. The step in flight finishes,
    # a resumable state is written for it, the command exits 130; running it again resumes there.
    runs_dir = tmp_path / "runs"
    copy_run(tokenized_run, runs_dir)
    recipe = write_recipe(tmp_path, STEPS, micro=4)
    process = subprocess.Popen(
        command(recipe, 1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )
    metrics = runs_dir / "run" / "train.partial" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.is_file() and '"step": 8, "loss"' in metrics.read_text()):
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert "SIGTERM received" in stderr and "run the same command again to resume" in stderr
    saved = sorted(p.name for p in (runs_dir / "run" / "train.partial" / "checkpoints").iterdir())
    assert len(saved) == 1 and 8 <= int(saved[0].split("-")[1]) < STEPS
    run_here(command(recipe, 1))  # resumed in this process, as the uninterrupted run was trained
    steps = [
        json.loads(line)
        for line in (runs_dir / "run" / "train" / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line and '"eval"' not in line
    ]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in steps] == [r["loss"] for r in single[0]]  # bit for bit, one process both times


def test_two_machines_without_a_shared_disk_train_a_run_in_a_bucket(
    single: tuple[list, Path], tokenized_run: Path, tmp_path: Path, s3_store: str
) -> None:
    # FSDP2 over two torchrun "nodes" of one process each, each with its own KILN_CACHE (no disk between them),
    # the run in the S3 server on localhost (tests/conftest.py): the same losses as one process, and each
    # state in the bucket holds both ranks' shards, with complete.json listing them.
    import os

    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem()
    bucket = f"two-nodes-{free_port()}"
    fs.mkdir(bucket)
    for stage in ("curate", "tokenizer", "tokenize"):
        fs.put(str(tokenized_run / stage), f"{bucket}/runs/run/{stage}", recursive=True)
    recipe, port = write_recipe(tmp_path, micro=2), free_port()
    overrides = ("parallel.dp_shard=-1", f"runs_dir=s3://{bucket}/runs", "train.checkpoint.every=5")
    nodes = [
        subprocess.Popen(
            nodes_command(recipe, 2, 1, port, *overrides),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "CUDA_VISIBLE_DEVICES": "",
                "OMP_NUM_THREADS": "1",
                "KILN_CACHE": str(tmp_path / f"n{i}"),
            },
        )
        for i in range(2)
    ]
    for node in nodes:
        assert node.wait(timeout=300) == 0, node.stderr.read()[-3000:] if node.stderr else ""
    metrics = fs.cat(f"{bucket}/runs/run/train/metrics.jsonl").decode().splitlines()
    assert_same_losses([r for r in map(json.loads, metrics) if "loss" in r], single[0])
    state = f"{bucket}/runs/run/train/checkpoints/step-0000010"
    listed = json.loads(fs.cat(f"{state}/complete.json"))
    assert {"__0_0.distcp", "__1_0.distcp", "rng-0.json", "rng-1.json"} <= set(listed)
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(state)) == sorted([*listed, "complete.json"])
    assert not fs.exists(f"{bucket}/runs/run/train.partial")
