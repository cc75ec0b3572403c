"""Data parallelism through torchrun on the CPU (gloo): DDP and FSDP2 with 2 processes train the
same model as 1 process with the same global batch.

Each launch is a real `torchrun --standalone --nproc-per-node 2 -m kiln train` (or `kiln train
--nproc 2`) on a copy of the shared miniature run; the losses are read from metrics.jsonl. One
process accumulates 4 micro-batches of 4 rows; two take 2 each, so every step sees the same 16
rows (the sampler deals the global stream by rank). Measured: about 12 s per launch on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from kiln.train.distributed import ParallelConfig

pytestmark = pytest.mark.slow

KILN = Path(sys.executable).with_name("kiln")
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS = 20
RECIPE = """\
name: run
runs_dir: {runs_dir}
curate: {{inputs: [{{source: code, format: text, path: c.py}}, {{source: legal, format: text, path: l.txt}}]}}
model: {{d_model: 64, n_layers: 2, n_heads: 2, n_kv_heads: 1, max_seq_len: 64}}
train:
  steps: {steps}
  seq_len: 64
  micro_batch_size: {micro}
  global_batch_tokens: 1024
  eval_at_start: false
  optim: {{lr: 1.0e-2}}
  schedule: {{warmup_steps: 4}}
  precision: {{device: cpu}}
eval: {{max_tokens_per_source: 512}}
"""


def copy_run(tokenized_run: Path, runs_dir: Path) -> None:
    """The shared run's upstream stages (curate, tokenizer, tokenize) as runs_dir/run, ready to train."""
    for stage in ("curate", "tokenizer", "tokenize"):
        shutil.copytree(tokenized_run / stage, runs_dir / "run" / stage)


def launch(tokenized_run: Path, root: Path, nproc: int, *overrides: str, micro: int = 4, steps: int = STEPS, via_kiln: bool = False) -> list[dict[str, Any]]:
    """Train on a fresh copy of the run with nproc processes; the step records of metrics.jsonl."""
    runs_dir = root / "runs"
    copy_run(tokenized_run, runs_dir)
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(runs_dir=runs_dir, steps=steps, micro=micro))
    args = ["train", "--recipe", str(recipe), *(a for o in overrides for a in ("--set", o))]
    if nproc == 1:
        command = [str(KILN), *args]
    elif via_kiln:
        command = [str(KILN), *args, "--nproc", str(nproc)]
    else:
        command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", "-m", "kiln", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    # The progress bars fill stderr: show the lines that say what failed.
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "train:" not in line)[-4000:]
    lines = [json.loads(line) for line in (runs_dir / "run" / "train" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "loss" in r]


@pytest.fixture(scope="module")
def single(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    root = tmp_path_factory.mktemp("single")
    return launch(tokenized_run, root, 1), root


def assert_same_losses(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), (g["step"], g["loss"], w["loss"])
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-3)
        assert g["tokens"] == w["tokens"] == 1024
    assert want[-1]["loss"] < want[0]["loss"] - 0.5  # it trained


@pytest.mark.parametrize(("layout", "overrides"), [("ddp", ("parallel.dp_replicate=2", "parallel.dp_shard=1")), ("fsdp2", ("parallel.dp_shard=-1",))])
def test_two_processes_match_one_with_the_same_global_batch(layout: str, overrides: tuple[str, ...], single: tuple[list, Path], tokenized_run: Path, tmp_path: Path) -> None:
    one, one_root = single
    two = launch(tokenized_run, tmp_path, 2, *overrides, micro=2)
    assert_same_losses(two, one)
    # One writer, the same consolidated checkpoint format whatever the layout.
    ours = load_file(tmp_path / "runs" / "run" / "train" / "checkpoint" / "model.safetensors")
    theirs = load_file(one_root / "runs" / "run" / "train" / "checkpoint" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.allclose(ours[k], theirs[k], rtol=1e-3, atol=1e-5) for k in ours), layout
    manifest = json.loads((tmp_path / "runs" / "run" / "train" / "manifest.json").read_text())
    assert manifest["counts"]["processes"] == 2


def test_kiln_train_nproc_execs_torchrun(single: tuple[list, Path], tokenized_run: Path, tmp_path: Path) -> None:
    two = launch(tokenized_run, tmp_path, 2, micro=2, via_kiln=True)
    assert_same_losses(two, single[0])


def test_a_layout_that_does_not_fit_the_processes_is_refused() -> None:
    with pytest.raises(Exception, match=r"parallel.dp_replicate \(3\) x parallel.dp_shard \(-1\) must equal the 2 processes"):
        ParallelConfig(dp_replicate=3).layout(2)
    assert ParallelConfig(dp_replicate=2).layout(8) == (2, 4)  # HSDP: 2 replicas of 4 shards
    assert ParallelConfig().layout(4) == (1, 4)


def descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (torchrun's workers run in their own process groups)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_after(command: list[str], metrics: Path, step: int) -> None:
    """Run a training command and SIGKILL it as soon as metrics.jsonl has logged `step`."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and any(json.loads(line).get("step", 0) >= step and "loss" in json.loads(line) for line in metrics.read_text().splitlines() if line.strip()):
            for pid in [*descendants(process.pid), process.pid]:  # the workers first: torchrun would restart them
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    process.wait()
    assert process.returncode != 0, "the run finished before it could be killed"


@pytest.mark.parametrize(("first", "second", "async_save"), [(1, 1, False), (2, 2, False), (2, 1, False), (2, 2, True)])
def test_killed_run_resumes_bit_identically(first: int, second: int, async_save: bool, single: tuple[list, Path], tokenized_run: Path, tmp_path: Path) -> None:
    # Resumable states every 5 steps; killed once step 12 is logged (on a busy machine the run may
    # have gone a few steps further, and may be writing step 15's state under its .tmp name), the
    # run resumes from its newest complete state and its losses from there on are exactly those
    # of the uninterrupted run (1 process), whether the state was written by 1 or 2 processes and
    # resumed by as many or by 1, and whether it was written in the background (its own process
    # group) or not. A half-written .tmp state is never the one resumed.
    overrides = ["train.checkpoint.every=5", "parallel.dp_replicate=2", "parallel.dp_shard=1", f"train.checkpoint.async_save={str(async_save).lower()}"]
    runs_dir = tmp_path / "runs"
    copy_run(tokenized_run, runs_dir)
    recipe = tmp_path / "recipe.yaml"

    def command(nproc: int) -> list[str]:
        # micro-batches of 2 rows on either layout: the recipe (and so the stage's identity) stays the same.
        recipe.write_text(RECIPE.format(runs_dir=runs_dir, steps=STEPS, micro=2 if first != second else 4 // nproc))
        args = ["train", "--recipe", str(recipe), *(a for o in overrides for a in ("--set", o))]
        return [str(KILN), *args] if nproc == 1 else [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", "-m", "kiln", *args]

    metrics = runs_dir / "run" / "train.partial" / "metrics.jsonl"
    kill_after(command(first), metrics, 12)
    complete = sorted(p.name for p in (runs_dir / "run" / "train.partial" / "checkpoints").iterdir() if p.suffix != ".tmp")
    last = int(complete[-1].removeprefix("step-"))
    assert last >= 10
    done = subprocess.run(command(second), capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "train:" not in line)[-4000:]
    assert f"resuming after step {last}" in done.stderr
    resumed = [json.loads(line) for line in (runs_dir / "run" / "train" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in resumed if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # the killed run's steps after `last` were cut back
    uninterrupted = {r["step"]: r["loss"] for r in single[0]}
    if first == second == 1:
        assert [r["loss"] for r in steps[last:]] == [uninterrupted[s] for s in range(last + 1, STEPS + 1)]  # bit for bit
    else:
        assert [r["loss"] for r in steps[last:]] == pytest.approx([uninterrupted[s] for s in range(last + 1, STEPS + 1)], rel=1e-4)


def test_sigterm_saves_a_resumable_state_and_the_run_continues_exactly(single: tuple[list, Path], tokenized_run: Path, tmp_path: Path) -> None:
    # A scheduler's preemption notice: SIGTERM after step 8 is logged. The step in flight finishes,
    # a resumable state is written for it, the command exits 130; running it again resumes there.
    runs_dir = tmp_path / "runs"
    copy_run(tokenized_run, runs_dir)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(runs_dir=runs_dir, steps=STEPS, micro=4))
    command = [str(KILN), "train", "--recipe", str(recipe)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
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
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (runs_dir / "run" / "train" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line and '"eval"' not in line]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in steps] == [r["loss"] for r in single[0]]  # bit for bit, one process both times
