"""Split brain on a run in a bucket (the S3 server on localhost, tests/conftest.py), with the lock's lifetime
set to 2 s: `kiln train` is frozen (SIGSTOP) after its first stored state, past its lock's expiry; a second
machine (another KILN_CACHE) takes the lock over, resumes from that state and publishes; then the first is
continued (SIGCONT). It must stop without writing a single object, and the second's published stage must
hold only its own states and the losses of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from launches import KILN, RECIPE, SMALL, copy_run, failed_lines, run_here

s3fs = pytest.importorskip("s3fs")
pytestmark = pytest.mark.slow

STEPS, EVERY = 40, 10  # frozen at its first state (step 10), the first run is still 30 steps from its end


def train(root: Path, runs_dir: str, *sets: str) -> list[str]:
    """`kiln train` of the shared run under runs_dir, a state every EVERY steps, the last 2 kept."""
    (root / "recipe.yaml").write_text(RECIPE.format(runs_dir=runs_dir, model=SMALL, steps=STEPS, micro=4))
    sets = (f"train.checkpoint.every={EVERY}", "train.checkpoint.keep_last=2", *sets)
    return [str(KILN), "train", "--recipe", str(root / "recipe.yaml"), *(a for s in sets for a in ("--set", s))]


def losses(metrics: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, metrics.splitlines()) if "loss" in r}


def wait_for(found: callable, what: str, process: subprocess.Popen | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not s3fs.S3FileSystem().invalidate_cache() and not found():
        assert process is None or process.poll() is None, f"exited before {what}: {process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


def test_a_run_frozen_past_its_locks_expiry_stops_without_writing_and_the_rightful_run_is_exact(
    tokenized_run: Path, s3_store: str, tmp_path: Path
) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # the S3 server's, set by s3_store
    fs = s3fs.S3FileSystem()
    bucket = f"split-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    copy_run(tokenized_run, tmp_path / "local")
    fs.put(str(tmp_path / "local" / "run"), f"{bucket}/runs/run", recursive=True)
    cmd = train(tmp_path, f"s3://{bucket}/runs", "storage.lock_seconds=2")

    first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**env, "KILN_CACHE": str(tmp_path / "a")})
    wait_for(lambda: fs.glob(f"{bucket}/runs/run/train.partial/checkpoints/*/complete.json"), "stored state", first)
    first.send_signal(signal.SIGSTOP)
    try:
        expired = time.monotonic() + 2.5  # past the lock's expiry
        run_here(train(tmp_path / "local", str(tmp_path / "local")))  # the uninterrupted run, meanwhile
        time.sleep(max(0.0, expired - time.monotonic()))
        second = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env={**env, "KILN_CACHE": str(tmp_path / "b")}
        )
        assert second.returncode == 0, failed_lines(second.stderr)
        assert f"taking over s3://{bucket}/runs/run/train.lock" in second.stderr
        published = {p: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/runs")}
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 2, err[-3000:]
    assert "was lost while the stage ran" in err, err[-3000:]
    fs.invalidate_cache()
    assert {p: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/runs")} == published  # not one object written

    states = sorted(p.split("/")[-2] for p in fs.glob(f"{bucket}/runs/run/train/checkpoints/*/complete.json"))
    assert states == [f"step-{s:07d}" for s in (STEPS - 2 * EVERY, STEPS - EVERY)]  # keep_last 2, the last run's
    reference = losses((tmp_path / "local" / "run" / "train" / "metrics.jsonl").read_text())
    resumed = losses(fs.cat(f"{bucket}/runs/run/train/metrics.jsonl").decode())
    assert resumed and resumed == {s: v for s, v in reference.items() if s >= min(resumed)}
