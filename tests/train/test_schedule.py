"""kiln.train.schedule.lr_at: linear warmup then cosine to a floor, worked by hand."""

from __future__ import annotations

import math

import pytest

from kiln.train.schedule import lr_at

# peak 1.0, 10 warmup steps, 110 steps in all, floor 0.1 of peak.
SCHEDULE = {"peak": 1.0, "warmup_steps": 10, "total_steps": 110, "min_lr_ratio": 0.1}


def lr(step: int) -> float:
    return lr_at(step, **SCHEDULE)


def test_hand_worked_values() -> None:
    assert lr(0) == 0.0
    assert lr(1) == pytest.approx(0.1)  # warmup is linear: step / warmup_steps
    assert lr(5) == pytest.approx(0.5)
    assert lr(10) == pytest.approx(1.0)  # peak exactly at the end of warmup
    # step 60: progress (60 - 10) / 100 = 0.5, cos(pi/2) = 0 -> 0.1 + 0.9 * 0.5 = 0.55
    assert lr(60) == pytest.approx(0.55)
    # step 35: progress 0.25 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/4)) = 0.1 + 0.45 * 1.70711 = 0.86820
    assert lr(35) == pytest.approx(0.1 + 0.45 * (1 + math.sqrt(0.5)))
    assert lr(110) == pytest.approx(0.1)  # the floor at the last step


def test_monotone_decreasing_after_warmup_and_clamped_at_floor() -> None:
    after = [lr(s) for s in range(10, 111)]
    assert all(a > b for a, b in zip(after, after[1:]))
    warmup = [lr(s) for s in range(0, 11)]
    assert all(a < b for a, b in zip(warmup, warmup[1:]))
    assert lr(500) == pytest.approx(0.1)  # past the end it stays at the floor


def test_no_warmup_starts_at_peak_and_zero_floor_reaches_zero() -> None:
    assert lr_at(1, 3e-3, 0, 100, 0.0) == pytest.approx(3e-3 * 0.5 * (1 + math.cos(math.pi / 100)))
    assert lr_at(100, 3e-3, 0, 100, 0.0) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(100, 3e-3, 0, 100, 1.0) == pytest.approx(3e-3)  # ratio 1: constant after warmup


def test_linear_and_wsd_by_hand() -> None:
    # peak 1, 10 warmup steps, 110 steps, floor 0.1.
    linear = {"kind": "linear", **SCHEDULE}
    assert lr_at(10, **linear) == pytest.approx(1.0)
    assert lr_at(60, **linear) == pytest.approx(0.55)  # halfway down the straight line
    assert lr_at(110, **linear) == pytest.approx(0.1)
    # wsd with 20% decay: stable at the peak until step 88 (110 - 22), then linear to 0.1 at 110.
    wsd = {"kind": "wsd", "decay_fraction": 0.2, **SCHEDULE}
    assert [lr_at(s, **wsd) for s in (5, 10, 50, 88)] == pytest.approx([0.5, 1.0, 1.0, 1.0])
    assert lr_at(99, **wsd) == pytest.approx(1.0 - 0.9 * 11 / 22)  # halfway through the decay: 0.55
    assert lr_at(110, **wsd) == pytest.approx(0.1)
