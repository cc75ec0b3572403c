"""The Slurm executor against a real Slurm on this machine (tests/slurm_cluster.py: slurmctld, two slurmd, munge):
tasks come back as array elements finish, an element that ends without a result is submitted again, a task's
own error names its element's log, and curate and tokenize runs across arrays equal local runs byte for byte."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

from kiln.core.errors import FatalError
from kiln.core.executors import slurm as slurm_executor
from kiln.core.executors.slurm import SlurmConfig, SlurmExecutor
from kiln.curate.config import CurateConfig
from kiln.curate.readers import InputConfig
from kiln.curate.run import run
from kiln.tokenize.config import TokenizeConfig, TokenizerConfig
from kiln.tokenize.encode import run as tokenize
from kiln.tokenize.train import run as train_tokenizer

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def cluster(slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's arrays go to the cluster, their folders under tmp_path; elements import tests/slurm_cluster.py."""
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setattr(slurm_executor, "_config", SlurmConfig(jobs_dir=str(tmp_path / "jobs"), status_every_s=0.5))
    return tmp_path / "jobs"


def test_tasks_run_as_array_elements_and_each_result_comes_back(
    cluster: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sys.path.insert(0, str(TESTS))
    from slurm_cluster import die_once, refuse, square

    executor = SlurmExecutor(2, "test.executor")
    with caplog.at_level(logging.INFO, "kiln.executors"):
        assert sorted(executor.imap_unordered(square, range(5))) == [0, 1, 4, 9, 16]
    assert re.search(r"test\.executor: Slurm array \d+: \d of 5 tasks done, \d running, \d pending", caplog.text)
    assert not list(cluster.glob("*/result-*.pkl"))  # a finished array leaves no folder behind

    # An element that ends without a result (its node lost, as far as the driver can tell) runs again.
    marks = cluster.parent / "marks"
    marks.mkdir()
    assert sorted(executor.imap_unordered(die_once, [(str(marks), 3), (str(marks), 4)])) == [3, 4]
    assert sorted(p.name for p in marks.iterdir()) == ["ran-3", "ran-4"]

    failed = r"test\.executor: task 0, Slurm job \d+_0, failed: ValueError: task 1 refuses \(log .*log-\d+_0\.txt\)"
    with pytest.raises(FatalError, match=failed):
        list(executor.imap_unordered(refuse, [1]))
    assert list(cluster.glob("*/log-*_0.txt"))  # kept, for the failure it names


def test_no_sbatch_on_path_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(slurm_executor, "_config", SlurmConfig(jobs_dir=str(tmp_path / "jobs")))
    with pytest.raises(FatalError, match="executor slurm: sbatch is not on PATH"):
        list(SlurmExecutor(1, "curate.executor").imap_unordered(abs, [1]))


def test_curate_and_tokenize_across_slurm_arrays_equal_a_local_run_byte_for_byte(cluster: Path, tmp_path: Path) -> None:
    # Read, lines, filter and write phases as four arrays (the dedup phases run as the local executor's tests say)
    inputs = (InputConfig(format="gettext_messages", locales=("en", "fr")),)
    common = {"inputs": inputs, "exact_dedup": {"enabled": False}, "minhash_dedup": {"enabled": False}}
    on_slurm = run(CurateConfig(**common, executor={"kind": "slurm", "workers": 2}), tmp_path / "slurm")
    local = run(CurateConfig(**common, executor={"workers": 1}), tmp_path / "local")
    assert on_slurm["outputs"] == local["outputs"] and on_slurm["counts"] == local["counts"]
    assert on_slurm["counts"]["docs_in"] > 100
    tokens = {}
    for where, kind in (("slurm", "slurm"), ("local", "local")):
        train_tokenizer(TokenizerConfig(vocab_size=512, sample_mb=1), tmp_path / where)
        tokens[where] = tokenize(TokenizeConfig(executor={"kind": kind, "workers": 2}), tmp_path / where)
    assert tokens["slurm"]["outputs"] == tokens["local"]["outputs"] and tokens["slurm"]["counts"]["train_tokens"] > 0


def test_an_unknown_partition_is_one_line_naming_what_sbatch_said(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slurm_executor, "_config", SlurmConfig(jobs_dir=str(cluster), partition="nosuch"))
    refused = r"executor slurm: sbatch refused .*/array\.sh \(--array=0-0%1\): .*[Pp]artition"
    with pytest.raises(FatalError, match=refused):
        list(SlurmExecutor(1, "curate.executor").imap_unordered(abs, [1]))


def only_here(x: int) -> int:
    """A function the array's elements cannot import (this folder is not on their path)."""
    return x


def test_a_task_function_the_elements_cannot_import_is_said_once(cluster: Path) -> None:
    with pytest.raises(FatalError, match=r"failed: ModuleNotFoundError: No module named 'test_slurm_executor'"):
        list(SlurmExecutor(1, "curate.executor", max_retries=3).imap_unordered(only_here, [1]))
