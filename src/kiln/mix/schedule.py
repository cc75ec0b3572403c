"""Piecewise-linear schedules of training progress: a constant, or [progress, value] points.

Progress runs from 0 (before the first step) to 1 (the last step). Between two points the
value moves linearly; before the first point and after the last it stays at their values.
Two points at the same progress make a jump: `[[0, 0], [0.3, 0], [0.3, 1]]` is 0 until 30% of
training and 1 from there on ("code from 30% on"). Recipes write schedules as YAML lists.
Not handled here: what a schedule controls (source weights here; sequence lengths are phases
in kiln.train.geometry).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

Schedule = float | list[tuple[float, float]]


def check_schedule(value: Schedule, what: str) -> None:
    """Raise ValueError naming `what` unless value is a non-negative number or ordered [progress, value] points."""
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"{what} is {value}; it must be >= 0")
        return
    if not value:
        raise ValueError(f"{what} is an empty schedule; give a number or [progress, value] points")
    progress = [p for p, _ in value]
    if any(not 0 <= p <= 1 for p in progress) or progress != sorted(progress):
        raise ValueError(f"{what}: progress points {progress} must lie in [0, 1] in non-decreasing order")
    if any(v < 0 for _, v in value):
        raise ValueError(f"{what}: values {[v for _, v in value]} must be >= 0")


def value_at(schedule: Schedule, progress: float) -> float:
    """The schedule's value at `progress` in [0, 1]; at a jump, the value after it."""
    if isinstance(schedule, int | float):
        return float(schedule)
    points: Sequence[tuple[float, float]] = schedule
    xs = [p for p, _ in points]
    i = bisect.bisect_right(xs, progress)  # points[:i] are at or before progress
    if i == 0:
        return float(points[0][1])
    if i == len(points):
        return float(points[-1][1])
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return float(y0 + (y1 - y0) * (progress - x0) / (x1 - x0))  # x1 > x0: equal x's were passed by bisect_right


def breakpoints(schedule: Schedule) -> list[float]:
    """Progress values where the schedule changes slope or jumps."""
    return [] if isinstance(schedule, int | float) else sorted({p for p, _ in schedule})
