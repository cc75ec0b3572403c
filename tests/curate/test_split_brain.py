"""Split brain on a curate whose run is in a bucket (the S3 server on localhost, tests/conftest.py), the lock's
lifetime set to 2 s: the driver is frozen (SIGSTOP) once its first task has stored its marker, while its pool
workers go on; past the lock's expiry a second machine (another KILN_CACHE) takes the lock over, resumes and
publishes; then the first is continued (SIGCONT). It must stop without writing an object, and what the second
published must be a local run's outputs, byte for byte, and stay current."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

s3fs = pytest.importorskip("s3fs")
pytestmark = pytest.mark.slow
KILN = Path(sys.executable).with_name("kiln")


def curate(root: Path, runs_dir: str, corpus: Path) -> list[str]:
    inputs = [{"source": s, "format": "text", "path": str(corpus / s / "*")} for s in ("email", "json")]
    recipe = {"name": "r", "runs_dir": runs_dir, "curate": {"inputs": inputs, "executor": {"workers": 2}}}
    (root / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    return [str(KILN), "curate", "--recipe", str(root / "recipe.yaml")]


def test_a_curate_frozen_past_its_locks_expiry_stops_without_writing_and_the_rightful_run_is_exact(
    s3_store: str, tmp_path: Path
) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("email", "json"):
        shutil.copytree(stdlib / package, tmp_path / "corpus" / package, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the S3 server's, set by s3_store
    fs = s3fs.S3FileSystem()
    bucket = f"split-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    (tmp_path / "local").mkdir()
    cmd = [*curate(tmp_path, f"s3://{bucket}/runs", tmp_path / "corpus"), "--set", "storage.lock_seconds=2"]

    first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**env, "KILN_CACHE": str(tmp_path / "a")})
    deadline = time.monotonic() + 120
    while not (fs.invalidate_cache() or fs.glob(f"{bucket}/runs/r/curate.partial/work/*/*.done")):
        assert first.poll() is None, first.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)
    try:
        # Past the lock's expiry (the frozen driver's workers finish what they were given); meanwhile the same
        # curate on local disk, in this process (a subprocess spends 4 s on imports).
        expired = time.monotonic() + 2.5
        from kiln.cli import main

        assert main(curate(tmp_path / "local", str(tmp_path / "local" / "runs"), tmp_path / "corpus")[1:]) == 0
        time.sleep(max(0.0, expired - time.monotonic()))
        second = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env={**env, "KILN_CACHE": str(tmp_path / "b")}
        )
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"taking over s3://{bucket}/runs/r/curate.lock" in second.stderr
        fs.invalidate_cache()
        published = {p: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/runs")}
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 2 and "was lost while the stage ran" in err, err[-3000:]
    fs.invalidate_cache()
    assert {p: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/runs")} == published  # not one object written

    ours = json.loads(fs.cat(f"{bucket}/runs/r/curate/manifest.json"))
    theirs = json.loads((tmp_path / "local" / "runs" / "r" / "curate" / "manifest.json").read_text())
    assert ours["outputs"] == theirs["outputs"] and ours["counts"] == theirs["counts"]
    again = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**env, "KILN_CACHE": str(tmp_path / "c")}
    )
    assert again.returncode == 0 and "curate: up to date" in again.stderr, again.stderr[-3000:]
