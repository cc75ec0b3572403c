"""benchmarks/gpu_check.py's dry run: every part of the GPU check at toy sizes on the CPU, so the
minutes a GPU is lent for are never spent on a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_the_dry_run_builds_and_runs_every_part(tokenized_run: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, tmp_path, "--run", tokenized_run, "--dry-run"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    parts = report["parts"]
    assert list(parts) == ["tests", "fp8", "flex", "resume", "mfu"]
    assert not [p.get("error") for p in parts.values() if "error" in p]
    # The CUDA tests are found and collected (the fused loss, bf16 training, flex gradients).
    assert parts["tests"]["returncode"] == 0 and parts["tests"]["collected"] >= 7
    assert "tests/model/test_flex_attention.py" in parts["tests"]["files"]
    # fp8: the tiny preset's 4 blocks of 7 linear layers go through torchao; on the CPU the leg trains in fp32.
    assert parts["fp8"]["float8_layers"] == 28 and parts["fp8"]["loss_rel_diff"] == 0
    assert parts["fp8"]["llama_mfu"]["tokens_per_step"] == 512
    # flex's block mask and the dense mask give the same losses on rows of several documents.
    assert parts["flex"]["documents_per_row"] > 3
    assert parts["flex"]["loss_rel_diff"] < 1e-5
    assert parts["flex"]["attention_alone"]["flex_ms"] > 0
    # The run killed after its first resumable state, resumed, and the losses after the resume are the same.
    resume = parts["resume"]
    assert resume["killed_after_state"] == resume["resumed_from"] == 2
    assert resume["equal"] and resume["compared_steps"] == 4
    result = (tmp_path / "result.txt").read_text()
    assert result.startswith("RESULT ") and result == done.stdout.splitlines()[-1] + "\n"
    assert {kv.split("=")[0] for kv in result.split()[1:]} >= {"mfu_gpt2_124m", "fp8_speedup", "flex_speedup"}
