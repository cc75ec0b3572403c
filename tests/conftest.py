"""Shared fixtures: one local Ray instance (2 CPUs) for every Ray test (curate and quality), and one
miniature `kiln demo` run (tests/minidemo.py) for tests/test_demo.py and tests/report/."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from minidemo import DEMO_STAGES, KILN, kiln_demo


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    from kiln.core.executors.ray import RayExecutor

    executor = RayExecutor(workers=2)
    yield executor
    executor.close()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not KILN.is_file():
        pytest.skip(f"no kiln script beside {sys.executable}")
    runs_dir = tmp_path_factory.mktemp("pipeline") / "runs"
    done, seconds = kiln_demo(runs_dir)
    run_dir = runs_dir / "demo"
    manifests = {s: json.loads((run_dir / s / "manifest.json").read_text()) for s in DEMO_STAGES}
    return {
        "runs_dir": runs_dir,
        "run_dir": run_dir,
        "stdout": done.stdout,
        "seconds": seconds,
        "manifests": manifests,
        "summary": json.loads((run_dir / "summary.json").read_text()),
    }
