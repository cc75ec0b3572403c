"""kiln.core.executors: local (inline and process pool) and Ray give the same results for the same tasks."""

from __future__ import annotations

import json

import pytest

from kiln.core.executors import ExecutorConfig, build_executor


def square(x: int) -> tuple[int, int]:
    return x, x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("task 3 failed")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_local_runs_every_task(workers):
    executor = build_executor(ExecutorConfig(workers=workers), "test.executor")
    try:
        assert sorted(executor.imap_unordered(square, range(10))) == [(i, i * i) for i in range(10)]
        assert sorted(executor.imap_unordered(square, range(3, 6))) == [(i, i * i) for i in range(3, 6)]  # the pool is reused
    finally:
        executor.close()


def test_local_task_error_propagates():
    executor = build_executor(ExecutorConfig(workers=2), "test.executor")
    try:
        with pytest.raises(ValueError, match="task 3 failed"):
            list(executor.imap_unordered(fail_on_three, range(6)))
    finally:
        executor.close()


def test_ray_runs_every_task_on_a_local_instance(ray_local):
    # Ray workers import task functions by module; a test module is not importable there, so
    # the task is a standard-library Python function.
    assert sorted(ray_local.imap_unordered(json.loads, [str(i) for i in range(10)])) == list(range(10))
    with pytest.raises(Exception, match="Expecting value"):
        list(ray_local.imap_unordered(json.loads, ["1", "not json", "3"]))


def test_a_missing_ray_is_named_by_the_section_that_asked_for_it(monkeypatch: pytest.MonkeyPatch):
    import builtins

    from kiln.core.errors import FatalError

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(FatalError, match=r"^tokenize\.executor\.kind=ray needs the `ray` package"):
        build_executor(ExecutorConfig(kind="ray"), "tokenize.executor")
