"""`kiln submit`: the demo's stages as a chain of Slurm jobs, each starting once the one before succeeded. The
scripts it writes (the whole chain, through the closing `kiln demo`), and chains on a real Slurm
(tests/slurm_cluster.py): curate, train-tokenizer and tokenize on a tiny corpus, each job starting after the stage
before wrote its manifest; and a stage that fails, which takes the jobs after it out of the queue. (The later jobs
run as their verbs do anywhere, each importing torch, about 3 s a job: left to the dry run here. Training as a
Slurm job, requeued by Slurm's warning: tests/train/test_train_slurm.py.)

Measured on 2 cores: about 7 s for the two chains (six jobs; Slurm schedules once a second).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import time
from datetime import datetime
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.verbs import DEMO_STAGES

OFF = ("line_dedup", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb", "code_quality")
STEPS_OFF = "".join(f"  {step}: {{enabled: false}}\n" for step in OFF)  # rules for prose, not for code
RECIPE = f"""\
name: chain
runs_dir: runs
curate:
  inputs: [{{source: code, format: text, path: data/*.py}}]
  executor: {{workers: 1}}
{STEPS_OFF}\
tokenizer: {{vocab_size: 512, sample_mb: 0.3}}
tokenize: {{val_fraction: 0.2}}
model: {{d_model: 64, n_layers: 2, n_heads: 2, n_kv_heads: 1, max_seq_len: 64}}
train: {{steps: 40, seq_len: 64, micro_batch_size: 4, global_batch_tokens: 512, precision: {{device: cpu}}}}
"""


def tiny_run(root: Path) -> Path:
    """A recipe over the stdlib's email package (20 files, 0.3 MB), in root; returns its path."""
    (root / "data").mkdir()
    for path in sorted((Path(sysconfig.get_paths()["stdlib"]) / "email").glob("*.py")):
        shutil.copy(path, root / "data" / path.name)
    (root / "chain.yaml").write_text(RECIPE)
    return root / "chain.yaml"


def test_dry_run_prints_every_jobs_script_chained_and_needs_no_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    recipe = tiny_run(tmp_path)
    sets = ["slurm.partition=cpu", "slurm.train.partition=gpu", "slurm.train.gpus_per_node=2", "slurm.time=1:00:00"]
    sets += ["slurm.train.time=8:00:00"]
    args = ["submit", "--recipe", str(recipe), "--dry-run", "--nodes", "2", *(w for s in sets for w in ("--set", s))]
    assert main(args) == 0
    out = capsys.readouterr().out
    scripts = dict(re.findall(r"^# (\S+)\n(#!/bin/bash\n.*?)(?=\n\n# |\Z)", out, flags=re.S | re.M))
    names = [v.name for v in DEMO_STAGES] + ["demo"]
    assert [Path(p).name for p in scripts] == [f"{n}.sh" for n in names]
    folder = Path(next(iter(scripts))).parent
    assert folder.parent == tmp_path / "runs" / "chain" / "slurm"
    for i, text in enumerate(scripts.values()):
        name = names[i]
        lines = text.splitlines()
        assert f"#SBATCH --job-name=kiln-chain-{name}" in lines and f"#SBATCH --output={folder}/{name}-%j.txt" in lines
        if i == 0:
            assert not any("--dependency" in line for line in lines)
        else:
            assert f"#SBATCH --dependency=afterok:<job id of {names[i - 1]}>" in lines
            assert "#SBATCH --kill-on-invalid-dep=yes" in lines
        command = f"{sys.executable} -m kiln {name} --recipe {folder}/recipe.yaml"
        if name == "train":  # as `kiln train --slurm 2`: one srun task per node, requeued on Slurm's warning
            assert {"#SBATCH --nodes=2", "#SBATCH --gpus-per-node=2", "#SBATCH --partition=gpu"} <= set(lines)
            assert "#SBATCH --requeue" in lines and lines[-1] == f"srun --cpus-per-task=1 {command}"
        else:
            assert "#SBATCH --nodes=1" in lines and lines[-1] == f"exec {command}"
            # The stages that read the model run where training does, on one GPU; the others on the slurm section's.
            on_gpu = name in ("eval", "generate", "export")
            assert ("#SBATCH --partition=gpu" in lines) == on_gpu and ("#SBATCH --gpus-per-node=1" in lines) == on_gpu
            assert f"#SBATCH --time={'8:00:00' if on_gpu else '1:00:00'}" in lines
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted


def started_at(log: Path) -> float:
    """When the job started, from the first line its script writes (`... at 2026-12-07T07:06:11.988794502Z`)."""
    stamp = re.search(r" at (\S+)\.(\d+)Z$", log.read_text().splitlines()[0])
    assert stamp, log.read_text()[:500]
    return datetime.fromisoformat(f"{stamp[1]}.{stamp[2][:6]}+00:00").timestamp()


def submitted(out: str) -> list[tuple[str, str, Path]]:
    """(job id, verb, log) of each job `kiln submit` printed."""
    return [(job, verb, Path(log)) for job, verb, log in re.findall(r"^ +(\d+)  (\S+) +(\S+)$", out, flags=re.M)]


def wait_until_gone(jobs: list[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-j", ",".join(jobs)], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"jobs {jobs} still queued after {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_chain_runs_its_stages_in_order_and_a_failed_stage_takes_the_rest_out_of_the_queue(
    slurm: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm["SLURM_CONF"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # sbatch hands the jobs this process's environment
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    recipe = str(tiny_run(tmp_path))
    assert main(["submit", "--recipe", recipe, "--until", "tokenize"]) == 0
    out = capsys.readouterr().out
    jobs = submitted(out)
    stages = DEMO_STAGES[: [v.name for v in DEMO_STAGES].index("tokenize") + 1]
    assert [verb for _, verb, _ in jobs] == [v.name for v in stages], out
    try:
        wait_until_gone([job for job, _, _ in jobs])
    finally:
        subprocess.run(["scancel", *(job for job, _, _ in jobs)], capture_output=True)
    run = tmp_path / "runs" / "chain"
    for (_, _, log), verb in zip(jobs, stages, strict=True):
        assert (run / verb.stage / "manifest.json").is_file(), log.read_text()[-2000:]
    # afterok: each job started once the stage before had written its manifest (its last file).
    for (_, _, log), before in zip(jobs[1:], stages, strict=False):
        assert started_at(log) >= (run / before.stage / "manifest.json").stat().st_mtime, (log, before.stage)

    # A curate that fails (its input matches no file): the jobs after it never start and leave the queue.
    broken = "curate.inputs=[{source: code, format: text, path: nowhere/*.py}]"
    assert main(["submit", "--recipe", recipe, "--until", "tokenize", "--set", "name=broken", "--set", broken]) == 0
    out = capsys.readouterr().out
    assert "A job that fails takes the ones after it out of the queue" in out and "ls -t " in out
    jobs = submitted(out)
    try:
        wait_until_gone([job for job, _, _ in jobs])
    finally:
        subprocess.run(["scancel", *(job for job, _, _ in jobs)], capture_output=True)
    (_, _, curate_log), *later = jobs
    assert "matches no file" in curate_log.read_text()
    assert not any(log.exists() for _, _, log in later)  # they never started
    assert not (tmp_path / "runs" / "broken" / "tokenizer").exists()
