"""The local executor: a process pool on this machine.

Processes are spawned, not forked: a parent that already imported torch or started tokenizer
threads cannot fork safely. The pool lives for the executor's lifetime, so the several phases
of one stage pay the start-up (about 1 s per worker for imports) once. With one worker, tasks
run inline, which keeps tracebacks plain.
Not handled here: other machines (the Ray executor), memory limits per worker.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


class LocalExecutor:
    """A spawned process pool, kept for the executor's lifetime; `close` shuts it down."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        tasks = list(tasks)
        if self.workers == 1 or len(tasks) <= 1:
            yield from map(fn, tasks)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"))
        pending: set[Future[R]] = {self._pool.submit(fn, task) for task in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            for future in pending:  # a failed task or a closed generator: do not start the rest
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
