"""The local executor: a process pool on this machine.

Processes are spawned, not forked: a parent that already imported torch or started tokenizer
threads cannot fork safely. The pool lives for the executor's lifetime, so the several phases
of one stage pay the start-up (about 1 s per worker for imports) once. With one worker, tasks
run inline, which keeps tracebacks plain. A worker ends with the process that started it, even
one killed by SIGKILL, which can stop nothing: it would otherwise write on into the stage's
partial folder under the next run's lock.
`ThreadExecutor` runs tasks on threads of this process instead, for a stage whose tasks spend
their time in code that releases the GIL and are too few to pay for starting processes.
Not handled here: other machines (the Ray executor), memory limits per worker.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(parent: int) -> None:
    """Pool initializer: this worker ends when `parent` (the process that started it) does.

    On Linux the kernel sends SIGKILL at once (prctl PR_SET_PDEATHSIG), even to a worker busy in C
    code. subtle: it is sent when the *thread* that started the worker ends; the pool starts its
    workers in the thread that submits the tasks, the caller of imap_unordered (kiln's main thread).
    Elsewhere, or if prctl fails, a thread polls the parent's pid once a second."""
    if (
        sys.platform != "linux"
        or ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0
    ):
        threading.Thread(target=_watch_parent, args=(parent,), name="kiln-watch-parent", daemon=True).start()
    if os.getppid() != parent:  # it ended before the signal was asked for: none will come
        os._exit(1)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:  # an orphan is adopted by another process
        time.sleep(1.0)
    os._exit(1)


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
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=end_with_parent,
                initargs=(os.getpid(),),
            )
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


class ThreadExecutor:
    """Tasks on `workers` threads of this process: no start-up, shared memory, one GIL between them."""

    def __init__(self, workers: int):
        self.workers = workers

    def imap_unordered(self, fn: Callable[[T], R], tasks: Iterable[T]) -> Iterator[R]:
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kiln-task") as pool:
            futures = [pool.submit(fn, task) for task in tasks]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:  # a failed task or a closed generator: do not start the rest
                    future.cancel()

    def close(self) -> None:
        pass
