"""Shared fixtures: one local Ray instance (2 CPUs) for every Ray test (curate and quality), and one
miniature `kiln demo` run (tests/test_pipeline.py, tests/report/) through the installed command.

The demo recipe reads text already on the machine (stdlib code, pydoc topics, /usr/share/doc),
capped here at 2 MB, trains a 512-token BPE and a 2-layer d_model 64 model for 60 steps on CPU.
Measured: about 10 s on 2 cores for the first run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    from kiln.core.executors.ray import RayExecutor

    executor = RayExecutor(workers=2)
    yield executor
    executor.close()


DEMO_STAGES = ("curate", "tokenizer", "tokenize", "train", "eval", "generate", "export")
KILN = Path(sys.executable).with_name("kiln")
OVERRIDES = [
    "curate.max_total_mb=2",
    "tokenizer.vocab_size=512",
    "tokenizer.sample_mb=1",
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.max_seq_len=64",
    "train.seq_len=64",
    "train.micro_batch_size=8",
    "train.global_batch_tokens=512",
    "train.steps=60",
    "train.schedule.warmup_steps=6",
    "eval.max_tokens_per_source=4096",
    "generate.max_new_tokens=20",
    "train.probe_every=20",
    'eval.probe.prompts=["def "]',
]


def kiln_demo(runs_dir: Path, recipe: str = "demo", overrides: list[str] = OVERRIDES) -> tuple[subprocess.CompletedProcess[str], float]:
    args = [str(KILN), "demo", "--recipe", recipe, "--set", f"runs_dir={runs_dir}"]
    for override in overrides:
        args += ["--set", override]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # CPU only, whatever the machine has
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    seconds = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    return done, seconds


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not KILN.is_file():
        pytest.skip(f"no kiln script beside {sys.executable}")
    runs_dir = tmp_path_factory.mktemp("pipeline") / "runs"
    done, seconds = kiln_demo(runs_dir)
    run_dir = runs_dir / "demo"
    manifests = {s: json.loads((run_dir / s / "manifest.json").read_text()) for s in DEMO_STAGES}
    return {"runs_dir": runs_dir, "run_dir": run_dir, "stdout": done.stdout, "seconds": seconds, "manifests": manifests, "summary": json.loads((run_dir / "summary.json").read_text())}
