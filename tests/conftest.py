"""Shared fixtures: one local Ray instance (2 CPUs) for every Ray test (curate and quality)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    pytest.importorskip("ray")
    from kiln.core.executors.ray import RayExecutor

    executor = RayExecutor(workers=2)
    yield executor
    executor.close()
