"""kiln.plan.checkpoint_interval: Young's and Daly's intervals, by hand and against brute force."""

from __future__ import annotations

import math

import pytest

from kiln.core.errors import ConfigError
from kiln.plan.checkpoint_interval import (
    daly_interval,
    format_interval,
    lost_fraction,
    plan_interval,
    young_interval,
)


def test_worked_example_by_hand() -> None:
    # d = 5 min, M = 1440 min (one failure a day).
    # Young: sqrt(2 * 5 * 1440) = sqrt(14400) = 120.
    # Daly: x = 5 / 2880; 120 * (1 + sqrt(x)/3 + x/9) - 5 = 120 * 1.014082 - 5 = 116.690.
    r = plan_interval(5, 1440)
    assert r["young_min"] == pytest.approx(120.0)
    assert r["daly_min"] == pytest.approx(116.690, abs=1e-3)
    assert r["checkpoints_per_day"] == pytest.approx(1440 / 121.690, rel=1e-4)
    assert 0.08 < r["lost_fraction_daly"] <= r["lost_fraction_young"] < 0.082
    assert "116.69" in format_interval(r)


@pytest.mark.parametrize(("write", "mtbf", "restart"), [(5, 1440, 0), (2, 176, 10), (30, 100, 5), (1, 10_000, 0)])
def test_daly_is_near_the_brute_force_optimum(write: float, mtbf: float, restart: float) -> None:
    # Daly's formula approximates the minimiser of his exact lost-time model; check it against
    # a scan, and that it loses no more than Young's first-order interval.
    grid = [mtbf * 3 * i / 20_000 for i in range(1, 20_000)]
    best = min(grid, key=lambda t: lost_fraction(t, write, mtbf, restart))
    assert daly_interval(write, mtbf) == pytest.approx(best, rel=0.01)
    assert (
        lost_fraction(daly_interval(write, mtbf), write, mtbf, restart)
        <= lost_fraction(young_interval(write, mtbf), write, mtbf, restart) + 1e-12
    )


def test_cluster_failure_rate_sets_the_mtbf() -> None:
    # 1024 GPUs each failing once per 1000 days: 1.024 failures a day, M = 1440 / 1.024 minutes.
    r = plan_interval(3, gpus=1024, failures_per_gpu_day=1e-3)
    assert r["mtbf_min"] == pytest.approx(1406.25)
    assert r["young_min"] == pytest.approx(math.sqrt(2 * 3 * 1406.25))


def test_checkpoints_costlier_than_failures_cap_at_the_mtbf() -> None:
    assert daly_interval(30, 10) == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"write_minutes": 0, "mtbf_minutes": 100}, "write_minutes = 0 must be above 0"),
        ({"write_minutes": 1, "mtbf_minutes": -5}, "mtbf_minutes = -5 must be above 0"),
        ({"write_minutes": 1}, "either mtbf_minutes"),
        ({"write_minutes": 1, "mtbf_minutes": 100, "gpus": 8, "failures_per_gpu_day": 1e-3}, "either mtbf_minutes"),
        ({"write_minutes": 1, "gpus": 8}, "either mtbf_minutes"),
        ({"write_minutes": 1, "gpus": 0, "failures_per_gpu_day": 1e-3}, "gpus = 0 must be at least 1"),
        ({"write_minutes": 1, "gpus": 8, "failures_per_gpu_day": 0}, "failures_per_gpu_day = 0 must be above 0"),
        ({"write_minutes": 1, "mtbf_minutes": 100, "restart_minutes": -1}, "restart_minutes = -1 must be 0 or more"),
    ],
)
def test_bad_inputs_name_the_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_interval(**kwargs)
