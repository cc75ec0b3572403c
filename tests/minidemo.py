"""The miniature `kiln demo` run that tests/conftest.py's `demo_run` fixture makes once per session,
and the helper that runs `kiln demo` through the installed command (tests/test_pipeline.py reruns it).

The demo recipe reads text already on the machine (stdlib code, pydoc topics, /usr/share/doc),
capped here at 2 MB, trains a 512-token BPE and a 2-layer d_model 64 model for 60 steps on CPU.
Measured: about 10 s on 2 cores for the first run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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
    "train.schedule.warmup_fraction=0.1",  # 6 of the 60 steps
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
