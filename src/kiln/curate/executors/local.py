"""The local executor: a process pool on this machine.

Processes are spawned, not forked: a parent that already imported torch or started tokenizer
threads cannot fork safely. With one worker tasks run inline, which keeps tracebacks plain.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class LocalExecutor:
    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1

    def map(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if self.workers == 1 or len(tasks) <= 1:
            yield from map(fn, tasks)
            return
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(self.workers, len(tasks)), mp_context=ctx) as pool:
            yield from pool.map(fn, tasks)
