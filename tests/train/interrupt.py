"""Interrupting an in-process training run as a failing disk would: mix's sampler wrapped to raise
once it has drawn a given number of rows, which leaves `train.partial/` with the states saved so
far (tests/train/test_resume.py, tests/train/test_state_safety.py)."""

from __future__ import annotations

from typing import Any


class Crash(Exception):
    pass


class CrashAfter:
    """mix's sampler that raises once `limit` rows have been drawn."""

    def __init__(self, inner: Any, limit: int):
        self.inner, self.limit = inner, limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_rows(self, lengths: Any, progress: float, keep: slice) -> Any:
        if self.inner.rows_drawn >= self.limit:
            raise Crash(f"disk gone after {self.limit} rows")
        return self.inner.next_rows(lengths, progress, keep)
