"""The miniature `kiln demo` run that tests/conftest.py's `demo_run` fixture makes once per session
through the installed command (kiln_demo), and its arguments (demo_args) for the demos tests/test_demo.py
and tests/test_store_run.py run.

The demo recipe reads text already on the machine (stdlib code, pydoc topics, /usr/share/doc),
capped here at 2 MB, trains a 512-token BPE and a 2-layer d_model 64 model for 60 steps on CPU.
Measured: about 10 s on 2 cores for the first run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEMO_STAGES = ("curate", "tokenizer", "tokenize", "train", "eval", "generate", "export")
KILN = Path(sys.executable).with_name("kiln")
COPIED = ("stdlib_code", "usr_share_doc")  # the built-in inputs read from the machine's own files
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


def snapshot_corpus(recipe: str, overrides: list[str], dest: Path) -> str:
    """Copy the built-in files the recipe would read (its cap applied) under dest/<format>/, once per
    format; returns the override pointing its inputs there, so that a package installed while the
    suite runs changes nothing the tests read. pydoc topics stay where they are: they come with
    this Python. A later recipe reuses a format's copy (with its own cap over it)."""
    import json

    from kiln.curate.readers import plan_reads
    from kiln.recipe import load_recipe

    r = load_recipe(recipe, overrides)
    inputs = [i.model_dump(exclude_none=True) for i in r.curate.inputs]
    missing = {i for i, cfg in enumerate(r.curate.inputs) if cfg.format in COPIED and not (dest / cfg.format).is_dir()}
    if missing:
        # Planned over the machine's own files, so the cap picks the files the recipe would read.
        for task in plan_reads(
            r.curate.inputs, None if r.curate.max_total_mb is None else int(r.curate.max_total_mb * 1_000_000), 1 << 40
        ):
            if task.input_index in missing:
                for unit in task.units:
                    target = dest / task.input.format / unit.name.split("/", 1)[1]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(unit.path, target)
        for i in missing:
            (dest / r.curate.inputs[i].format).mkdir(parents=True, exist_ok=True)
    for i, cfg in enumerate(r.curate.inputs):
        if cfg.format in COPIED:
            inputs[i]["path"] = str(dest / cfg.format)
    return "curate.inputs=" + json.dumps(inputs)


def demo_args(
    runs_dir: Path | str, recipe: str = "demo", overrides: list[str] = OVERRIDES, corpus: Path | None = None
) -> list[str]:
    """`kiln demo`'s arguments, its inputs a copy of the corpus (corpus, else runs_dir/../corpus; made on the first
    call)."""
    overrides = [*overrides, snapshot_corpus(recipe, overrides, corpus or Path(runs_dir).parent / "corpus")]
    args = ["demo", "--recipe", recipe, "--set", f"runs_dir={runs_dir}"]
    for override in overrides:
        args += ["--set", override]
    return args


def kiln_demo(
    runs_dir: Path, recipe: str = "demo", overrides: list[str] = OVERRIDES
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`kiln demo` through the installed command on a copy of the corpus (runs_dir/../corpus, made on the first
    call)."""
    args = [str(KILN), *demo_args(runs_dir, recipe, overrides)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # CPU only, whatever the machine has
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    seconds = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    return done, seconds
