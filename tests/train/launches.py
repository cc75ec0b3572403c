"""Launching real training runs for the distributed tests: `kiln train` on one process, or
`torchrun --standalone --nproc-per-node N -m kiln train`, on a copy of the shared miniature run
(tests/train/conftest.py), and reading back the step records of metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from kiln.model.config import ModelConfig
from kiln.train_plan import layout_memory

KILN = Path(sys.executable).with_name("kiln")
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS = 20
# The data-parallel tests' model; the model-parallel ones train the tiny preset (4 heads, 2 key/value heads).
SMALL = "{d_model: 64, n_layers: 2, n_heads: 2, n_kv_heads: 1, max_seq_len: 64}"
TINY = "{preset: tiny, max_seq_len: 64}"
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
RECIPE = """\
name: run
runs_dir: {runs_dir}
curate: {{inputs: [{{source: code, format: text, path: c.py}}, {{source: legal, format: text, path: l.txt}}]}}
model: {model}
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


def write_recipe(root: Path, steps: int = STEPS, micro: int = 4, model: str = SMALL) -> Path:
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(runs_dir=root / "runs", steps=steps, micro=micro, model=model))
    return recipe


def command(recipe: Path, nproc: int, *overrides: str, via_kiln: bool = False) -> list[str]:
    """`kiln train` on one process, else torchrun (or `kiln train --nproc`) with nproc."""
    args = ["train", "--recipe", str(recipe), *(a for o in overrides for a in ("--set", o))]
    if nproc == 1:
        return [str(KILN), *args]
    if via_kiln:
        return [str(KILN), *args, "--nproc", str(nproc)]
    return [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", "-m", "kiln", *args]


def nodes_command(recipe: Path, nodes: int, nproc_per_node: int, port: int, *overrides: str) -> list[str]:
    """One "node" of a multi-node launch on this machine: torchrun with a c10d rendezvous at localhost:port."""
    args = ["train", "--recipe", str(recipe), *(a for o in overrides for a in ("--set", o))]
    return [
        str(TORCHRUN),
        f"--nnodes={nodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=localhost:{port}",
        f"--rdzv-id=kiln-test-{port}",
        "-m",
        "kiln",
        *args,
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def failed_lines(stderr: str) -> str:
    # The progress bars fill stderr: show the lines that say what failed.
    return "\n".join(line for line in stderr.splitlines() if "train:" not in line)[-4000:]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, failed_lines(done.stderr)
    return done


def run_nodes(commands: list[list[str]]) -> list[str]:
    """Start every node's command at once (the rendezvous waits for all of them); their stderr."""
    processes = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV) for c in commands
    ]
    stderr = [p.communicate(timeout=300)[1] for p in processes]
    for p, err in zip(processes, stderr, strict=True):
        assert p.returncode == 0, failed_lines(err)
    return stderr


def step_records(runs_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (runs_dir / "run" / "train" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "loss" in r]


def launch(
    tokenized_run: Path,
    root: Path,
    nproc: int,
    *overrides: str,
    micro: int = 4,
    steps: int = STEPS,
    model: str = SMALL,
    via_kiln: bool = False,
) -> list[dict[str, Any]]:
    """Train on a fresh copy of the run with nproc processes; the step records of metrics.jsonl.
    One process trains in this one (run_here)."""
    copy_run(tokenized_run, root / "runs")
    cmd = command(write_recipe(root, steps, micro, model), nproc, *overrides, via_kiln=via_kiln)
    if nproc > 1:
        run(cmd)
    else:
        run_here(cmd)
    return step_records(root / "runs")


def run_here(cmd: list[str]) -> None:
    """A `kiln` command run in this process, on one torch thread as every launched process has
    (OMP_NUM_THREADS=1), so its numbers are theirs: a subprocess would spend 4 s on imports."""
    import torch

    from kiln.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(cmd[1:]) == 0
    finally:
        torch.set_num_threads(threads)


def assert_same_weights(root: Path, reference: Path, atol: float = 1e-4) -> None:
    """The final checkpoints of the runs under root and reference (each holding runs/run) have the
    same tensors, within 1e-3 relative and atol absolute."""
    ours, theirs = (
        load_file(r / "runs" / "run" / "train" / "checkpoint" / "model.safetensors") for r in (root, reference)
    )
    assert ours.keys() == theirs.keys()
    assert all(torch.allclose(ours[k], theirs[k], rtol=1e-3, atol=atol) for k in ours), [
        k for k in ours if not torch.allclose(ours[k], theirs[k], rtol=1e-3, atol=atol)
    ]


def assert_same_losses(got: list[dict[str, Any]], want: list[dict[str, Any]], steps: int = STEPS) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, steps + 1))
    for g, w in zip(got, want, strict=True):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), (g["step"], g["loss"], w["loss"])
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-3)
        assert g["tokens"] == w["tokens"] == 1024
    assert want[-1]["loss"] < want[0]["loss"] - 0.5  # it trained


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


def kill_after(command: list[str], metrics: Path, step: int) -> str:
    """Run a training command and SIGKILL it as soon as metrics.jsonl has logged `step`; its stderr."""
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=ENV)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            if metrics.is_file() and any(
                json.loads(line).get("step", 0) >= step and "loss" in json.loads(line)
                for line in metrics.read_text().splitlines()
                if line.strip()
            ):
                for pid in [*descendants(process.pid), process.pid]:  # the workers first: torchrun would restart them
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        process.wait()
        stderr.seek(0)
        logged = stderr.read()
    assert process.returncode != 0, "the run finished before it could be killed"
    return logged


def assert_states_as_planned(manifest: dict[str, Any], tolerance: float) -> None:
    """Each rank's weights, gradients and optimizer states, measured after its first step, are what
    the planner's memory model gives for the layout (a CPU has no allocator peak: activations are
    not measured)."""
    counts, train = manifest["counts"], manifest["config"]["train"]
    planned = layout_memory(
        ModelConfig.model_validate(manifest["model"]),
        counts["parallel"],
        True,
        True,
        train["micro_batch_size"],
        train["seq_len"],
        "fp32",
        "none",
    )
    held = [sum(r.values()) * 2**20 for r in counts["model_states_mb"]]
    assert len(held) == counts["processes"] and all(
        abs(h / (planned["model_states_gb"] * 1e9) - 1) < tolerance for h in held
    ), (held, planned["model_states_gb"])
