"""Executors map shard tasks onto workers. They know nothing about steps.

`local` is a process pool (the default); a `ray` executor joins later with the same seam.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        """Results in task order; a task's exception propagates."""
        ...
