"""Training under Slurm without torchrun: each `srun` task takes the rank and rendezvous torchrun would give it,
and Slurm's warning signal (SIGUSR1) stops a run with a state to requeue from."""

from __future__ import annotations

import os
import signal

import pytest

from kiln.core import ranks
from kiln.core.ranks import adopt_slurm_tasks, first_node_address
from kiln.train.loop import StopRequest


def test_a_slurm_task_takes_its_rank_and_the_jobs_first_node_as_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranks, "first_node_address", lambda nodelist: f"addr-of-{nodelist.split(',')[0]}")
    task = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "1234"}
    env = {**task, "SLURM_JOB_NODELIST": "gpu7,gpu9"}
    assert adopt_slurm_tasks(env)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "addr-of-gpu7",
        "MASTER_PORT": "21234",
    }
    under_torchrun = {**task, "RANK": "0", "WORLD_SIZE": "8"}
    assert not adopt_slurm_tasks(under_torchrun) and under_torchrun["WORLD_SIZE"] == "8"  # torchrun's stand
    assert not adopt_slurm_tasks({"PATH": "/bin"})  # not a Slurm task


def test_the_first_node_is_reached_at_its_node_address(slurm: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    assert first_node_address("n[1-2]") == "127.0.0.1"  # the test cluster's nodes are localhost by their NodeAddr


def test_slurms_warning_signal_asks_for_a_state_and_a_requeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.requeue
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and not stop.requeue  # a plain stop: no requeue
    monkeypatch.delenv("SLURM_JOB_ID")
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and not stop.requeue  # outside Slurm there is no job to requeue
