"""`kiln train --slurm NODES`: the sbatch script it writes, and a training job on a real Slurm (tests/slurm_cluster.py:
slurmctld and two slurmd, n1 and n2, one CPU each) that Slurm's warning signal stops, that requeues itself and resumes,
ending with the losses of an uninterrupted run of the same two processes (torchrun on this machine), bit for bit.

Measured on 2 cores: about 19 s for the cluster test alone (the job's two starts, about 5 s each, the requeued job's
2 s wait, and beside the requeued job the reference run, about 17 s).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launches import ENV, command, copy_run, failed_lines, step_records, write_recipe

from kiln.cli import main

DDP = ("--set", "parallel.dp_replicate=2", "--set", "parallel.dp_shard=1")
STEPS = 60  # about 6 steps a second here: the warning after step 5 comes well before the end


def test_dry_run_prints_the_jobs_script_and_needs_no_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    recipe = write_recipe(tmp_path, micro=2)  # 1024 tokens a step: 2 rows of 64 on each of 8 processes
    settings = {
        "slurm.partition": "cpu",
        "slurm.account": "proj",
        "slurm.qos": "high",
        "slurm.setup": "module load cuda",
        "slurm.train.partition": "gpu",
        "slurm.train.tasks_per_node": "4",
        "slurm.train.gpus_per_node": "4",
        "slurm.train.cpus_per_task": "8",
        "slurm.train.mem": "200G",
        "slurm.train.time": "4:00:00",
        "slurm.train.warn_seconds": "300",
        "slurm.train.sbatch_args": '["--exclusive"]',
    }
    sets = [w for key, value in settings.items() for w in ("--set", f"{key}={value}")]
    code = main(["train", "--recipe", str(recipe), "--slurm", "2", "--dry-run", "--from", "8", *sets])
    out, _ = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    folder = re.search(r"--output=(\S+)/train-%j\.txt", out)
    assert folder and Path(folder[1]).parent == tmp_path / "runs" / "run" / "slurm"  # beside the stage folders
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --job-name=kiln-run-train",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --mem=200G",
        "#SBATCH --time=4:00:00",
        "#SBATCH --partition=gpu",  # slurm.train's, not the arrays' partition
        "#SBATCH --account=proj",
        "#SBATCH --qos=high",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR1@300",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={folder[1]}/train-%j.txt",
        f"#SBATCH --chdir={tmp_path}",
        "#SBATCH --exclusive",
    ]
    assert lines[0] == "#!/bin/bash" and "module load cuda" in lines
    assert "first=(--from 8)" in lines  # --from holds for the first start; a requeued job resumes from its newest state
    assert lines[-1] == (
        f'srun --cpus-per-task=8 {sys.executable} -m kiln train --recipe {folder[1]}/recipe.yaml "${{first[@]}}"'
    )
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted

    # Without sbatch, a submission is one line, and writes nothing; --nproc has no place in a Slurm job.
    assert main(["train", "--recipe", str(recipe), "--slurm", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kiln train: error: kiln train --slurm: sbatch is not on PATH" in err
    assert not (tmp_path / "runs").exists()
    assert main(["train", "--recipe", str(recipe), "--slurm", "1", "--nproc", "2"]) == 2
    assert "--slurm 1 and --nproc 2: give one" in capsys.readouterr().err


def ask(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout.strip()


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_slurms_warning_requeues_the_job_which_resumes_to_the_losses_of_an_uninterrupted_run(
    slurm: dict[str, str],
    tokenized_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # sbatch hands the job this process's environment: the cluster's, one thread, no GPU.
    for key, value in {"SLURM_CONF": slurm["SLURM_CONF"], "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    copy_run(tokenized_run, tmp_path / "runs")
    recipe = str(write_recipe(tmp_path, STEPS, micro=2))

    # A partition the cluster lacks: sbatch's refusal in one line, naming the script.
    assert main(["train", "--recipe", recipe, "--slurm", "1", "--set", "slurm.train.partition=nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(
        r"sbatch refused \S+/train\.sh: invalid partition specified: nowhere", err
    )

    assert main(["train", "--recipe", recipe, "--slurm", "2", *DDP]) == 0
    said = re.fullmatch(r"kiln train: Slurm job (\d+): 2 node\(s\) x 1 task\(s\), log (\S+)\n", capsys.readouterr().out)
    assert said, "the job id and its log"
    job, log = said[1], Path(said[2])
    reference = tmp_path / "uninterrupted"
    copy_run(tokenized_run, reference / "runs")
    uninterrupted: subprocess.Popen[bytes] | None = None
    try:
        metrics = tmp_path / "runs" / "run" / "train.partial" / "metrics.jsonl"
        wait_for("step 5", lambda: metrics.is_file() and '"step": 5,' in metrics.read_text())
        ask("scancel", "--signal=USR1", job)  # as Slurm's warning before the time limit: to the job's steps
        # subtle: Slurm holds a requeued job for AuthInfo's cred_expire + 1 s (121 s by default); the test starts it
        # sooner, but not within the second its old credential was revoked in: the nodes would refuse it ("Killing
        # non-startable batch JobId: Job credential revoked", and the job ends).
        wait_for("the requeue", lambda: ask("squeue", "-h", "-j", job, "-o", "%T %r") == "PENDING BeginTime")
        # The uninterrupted run of the same two processes, meanwhile: the requeued job spends most of its time
        # waiting and starting (alone, the test took 38 s with this run after the job's end, 19 s with it here).
        # subtle: not before the warning. Started with the job, on 2 busy cores, the signal once reached one task a
        # step before the other: the ranks stopped on its request, and rank 0, not warned itself, did not requeue
        # the job (kiln.train.loop requeues on rank 0's own signal).
        with open(reference / "stderr.txt", "w") as stderr:
            uninterrupted = subprocess.Popen(
                command(write_recipe(reference, STEPS, micro=2), 2, *DDP[1::2]),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=ENV,
            )
        ask("scontrol", "update", f"jobid={job}", "StartTime=now+2")
        wait_for("the job's end", lambda: not ask("squeue", "-h", "-j", job), timeout_s=120)
        uninterrupted.wait(timeout=300)
        assert uninterrupted.returncode == 0, failed_lines((reference / "stderr.txt").read_text())
    finally:
        subprocess.run(["scancel", job], capture_output=True)
        if uninterrupted is not None:
            uninterrupted.kill()  # a test that failed before its end leaves nothing running
    written = log.read_text()
    assert log.parent.parent == tmp_path / "runs" / "run" / "slurm" and written.count(f"kiln: Slurm job {job} ") == 2
    stopped = re.search(rf"Slurm job {job} requeued; it resumes after step (\d+)", written)
    assert "SIGUSR1 received" in written and stopped and 5 <= int(stopped[1]) < STEPS, written[-3000:]
    assert "(restart 1)" in written and f"resuming after step {stopped[1]}" in written
    assert (tmp_path / "runs" / "run" / "train" / "manifest.json").is_file()

    resumed = step_records(tmp_path / "runs")
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert [(r["loss"], r["grad_norm"]) for r in resumed] == [
        (r["loss"], r["grad_norm"]) for r in step_records(reference / "runs")
    ]
