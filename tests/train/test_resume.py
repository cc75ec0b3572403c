"""Resuming an interrupted train stage in process (kiln.train.run.pick_state, kiln.train.resume):
which state it continues from (`--from STEP`), what it refuses and why, and asynchronous saves.

The interruption is a crash inside the data stream (a row source that raises after drawing a
number of rows, as a failing disk would), which leaves `train.partial/` with its states.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from interrupt import Crash, CrashAfter

from kiln.cli import main
from kiln.core.errors import FatalError
from kiln.core.mirror import mirror_of
from kiln.mix.config import MixConfig
from kiln.mix.sampler import build_sampler
from kiln.model.config import ModelConfig, ScoringConfig
from kiln.train.config import TrainConfig
from kiln.train.run import TrainInputs, run

MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64)
MIX = MixConfig(seed=0)
SCORING = ScoringConfig(max_tokens_per_source=1024, batch_size=8)
STEPS, ROWS = 16, 8


def cfg(**update: Any) -> TrainConfig:
    base = {
        "steps": STEPS,
        "seq_len": 64,
        "micro_batch_size": ROWS,
        "optim": {"lr": 1e-2},
        "schedule": {"warmup_steps": 2},
        "precision": {"device": "cpu"},
        "eval_at_start": False,
        "checkpoint": {"every": 4, "keep_last": 3},
    }
    return TrainConfig.model_validate({**base, **update})


def make_rows(run_dir: Path, crash_after_step: int | None, seq_len: int, split: str = "train") -> Any:
    sampler = build_sampler(run_dir / "tokenize", MIX, seq_len, split)
    return CrashAfter(sampler, crash_after_step * ROWS) if crash_after_step and split == "train" else sampler


def train(
    run_dir: Path,
    train_cfg: TrainConfig,
    crash_after_step: int | None = None,
    force: bool = False,
    from_step: int | None = None,
) -> dict[str, Any]:
    return run(
        MODEL,
        train_cfg,
        TrainInputs(MIX, partial(make_rows, run_dir, crash_after_step), SCORING),
        run_dir,
        force,
        from_step=from_step,
    )


def losses(run_dir: Path, folder: str = "train") -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in map(json.loads, (run_dir / folder / "metrics.jsonl").read_text().splitlines())
        if "loss" in r
    }


@pytest.fixture(scope="module")
def runs(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A factory of fresh copies of the tokenized run, and the losses of one uninterrupted run."""
    root = tmp_path_factory.mktemp("resume")

    def fresh(name: str) -> Path:
        for stage in ("curate", "tokenizer", "tokenize"):
            shutil.copytree(tokenized_run / stage, root / name / stage)
        return root / name

    whole = fresh("whole")
    train(whole, cfg())
    return fresh, losses(whole)


def crashed(fresh: Any, name: str, after_step: int = 10, **update: Any) -> Path:
    run_dir = fresh(name)
    with pytest.raises(Crash):
        train(run_dir, cfg(**update), crash_after_step=after_step)
    return run_dir


def test_from_step_resumes_an_older_state_moves_the_newer_aside_and_continues_exactly(runs: Any) -> None:
    fresh, whole = runs
    run_dir = crashed(fresh, "from")
    states = run_dir / "train.partial" / "checkpoints"
    assert sorted(p.name for p in states.iterdir()) == ["step-0000004", "step-0000008"]
    with pytest.raises(
        FatalError, match=r"--from 5: no complete state for that step .*there are states after steps 4, 8"
    ):
        train(run_dir, cfg(), from_step=5)
    train(run_dir, cfg(), from_step=4)
    assert losses(run_dir) == whole  # bit for bit: steps 5.. replayed from the state after step 4
    superseded = list((run_dir / "train" / "checkpoints").glob("superseded-*/step-0000008"))
    assert len(superseded) == 1 and (superseded[0] / "complete.json").is_file()  # kept, never deleted


def test_a_changed_setting_is_named_and_a_checkpoint_setting_is_not_one(runs: Any) -> None:
    fresh, whole = runs
    run_dir = crashed(fresh, "changed")
    with pytest.raises(
        FatalError,
        match=(
            r"settings differ from these: train\.optim\.lr: 0\.01 -> 0\.005; train\.schedule\.warmup_steps: 2 -> 3\. "
            r"Resuming would not continue the same run"
        ),
    ):
        train(run_dir, cfg(optim={"lr": 5e-3}, schedule={"warmup_steps": 3}))
    # Where and how often states are saved, and what a fault does, do not change the math.
    train(run_dir, cfg(checkpoint={"every": 3, "keep_last": 1, "async_save": True}, rollback={"max_rollbacks": 1}))
    assert losses(run_dir) == whole
    assert sorted(p.name for p in (run_dir / "train" / "checkpoints").iterdir()) == ["step-0000015"]


def test_from_step_without_an_interrupted_run_is_refused(runs: Any) -> None:
    fresh, _ = runs
    with pytest.raises(
        FatalError,
        match=(
            r"--from 4 resumes a saved state, and .*train\.partial/checkpoints holds no complete state \(nor is there "
            r"a finished run to extend\)"
        ),
    ):
        train(fresh("nothing"), cfg(), from_step=4)


def test_async_states_are_complete_and_resume_exactly(runs: Any, caplog: pytest.LogCaptureFixture) -> None:
    fresh, whole = runs
    run_dir = crashed(fresh, "async", after_step=10, checkpoint={"every": 4, "keep_last": 3, "async_save": True})
    states = run_dir / "train.partial" / "checkpoints"
    # The crash came while training went on after step 8's save had started: the failing run let it finish.
    assert [p.name for p in sorted(states.iterdir())] == ["step-0000004", "step-0000008"]
    assert all((p / "complete.json").is_file() for p in states.iterdir())
    with caplog.at_level(logging.INFO, logger="kiln.train"):
        train(run_dir, cfg(checkpoint={"every": 4, "keep_last": 3, "async_save": True}))
    assert any("resuming after step 8" in r.getMessage() for r in caplog.records)
    assert losses(run_dir) == whole


def test_kiln_train_from_on_the_command_line(runs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fresh, _ = runs
    run_dir = fresh("cli")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: {run_dir.name}\nruns_dir: {run_dir.parent}\nmodel: "
        f"{json.dumps(MODEL.model_dump(exclude_none=True))}\ntrain: {{seq_len: 64}}\n"
    )
    assert main(["train", "--recipe", str(recipe), "--from", "3"]) == 2
    assert "--from 3 resumes a saved state" in capsys.readouterr().err


def test_a_kill_during_the_first_save_leaves_nothing_to_resume_and_the_same_command_starts_again(runs: Any) -> None:
    fresh, whole = runs
    run_dir = crashed(fresh, "first-save", after_step=6)
    states = run_dir / "train.partial" / "checkpoints"
    # As a kill -9 inside the first save leaves it: a `.tmp` folder with no complete.json.
    (states / "step-0000004" / "complete.json").unlink()
    (states / "step-0000004").rename(states / "step-0000004.tmp")
    train(run_dir, cfg())  # not "holds checkpoints of another training run"
    assert losses(run_dir) == whole


def wsd(**update: Any) -> TrainConfig:
    return cfg(
        schedule={"warmup_steps": 2, "kind": "wsd", "decay_fraction": 0.25}, checkpoint={"every": None}, **update
    )


def test_a_finished_wsd_run_given_more_steps_goes_on_from_its_last_stable_state(
    runs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fresh, _ = runs
    longer = fresh("wsd-longer")
    train(longer, wsd(steps=24))
    run_dir = fresh("wsd")
    train(run_dir, wsd())  # 16 steps: stable until step 12, where a state is kept with no checkpoint.every
    assert sorted(p.name for p in (run_dir / "train" / "checkpoints").iterdir()) == ["step-0000012"]
    first = losses(run_dir)
    with caplog.at_level(logging.INFO, logger="kiln.train"):
        manifest = train(run_dir, wsd(steps=24))
    previous = list(run_dir.glob("train.old-*"))
    assert len(previous) == 1 and losses(run_dir, previous[0].name) == first  # the finished run is kept as it was
    assert manifest["counts"]["extended_from"] == {"run": str(previous[0]), "step": 12}
    assert any("resuming after step 12" in r.getMessage() for r in caplog.records)
    # Up to step 12 both schedules hold the peak: the extended run is the 24-step run, bit for bit.
    assert losses(run_dir) == losses(longer)
    assert "extended the finished run" in (run_dir / "train" / "summary.txt").read_text()


def test_a_finished_run_of_other_settings_is_moved_aside_and_trained_again(
    runs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fresh, whole = runs
    run_dir = fresh("other")
    train(run_dir, cfg(optim={"lr": 5e-3}))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        manifest = train(run_dir, cfg(steps=STEPS))  # the lr back at 1e-2: not an extension, started over
        train(run_dir, cfg(steps=STEPS + 4))  # a cosine schedule cannot be extended: started over, and said why
    assert losses(run_dir)[STEPS] != whole[STEPS]  # 20 steps of their own cosine
    kept = sorted(run_dir.glob("train.old-*"))
    assert len(kept) == 2 and manifest["counts"]["previous_run"] == str(kept[0])
    assert all((k / "manifest.json").is_file() for k in kept)
    said = [r.getMessage() for r in caplog.records]
    assert any("train.optim.lr: 0.005 -> 0.01" in m and "it is kept" in m for m in said)
    assert any("not extended but started over: a cosine schedule" in m for m in said)


def test_force_while_another_run_holds_the_lock_moves_nothing(runs: Any) -> None:
    fresh, _ = runs
    run_dir = crashed(fresh, "live")
    held = sorted(p.name for p in (run_dir / "train.partial" / "checkpoints").iterdir())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live train on this host
    try:
        (run_dir / "train.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid, "since": "now"}))
        with pytest.raises(FatalError, match=rf"being built by pid {live.pid}"):
            train(run_dir, cfg(), force=True)
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in (run_dir / "train.partial" / "checkpoints").iterdir()) == held
    assert not list(run_dir.glob("train.old-*"))


def in_a_bucket(run_dir: Path, name: str) -> tuple[Any, str]:
    """A copy of the run as runs/r in a new bucket of tests/conftest.py's S3 server: (s3fs, the bucket)."""
    s3fs = pytest.importorskip("s3fs")
    fs, bucket = s3fs.S3FileSystem(), name.lower().replace("_", "-").strip("-")
    fs.mkdir(bucket)
    fs.put(str(run_dir), f"{bucket}/runs/r", recursive=True)
    return fs, bucket


def test_a_run_on_a_store_resumes_on_another_machine_from_the_state_the_store_kept(
    runs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_store: str
) -> None:
    """The tokenized run in a bucket (tests/conftest.py's S3 server); training crashes after step 10 with
    states after steps 4 and 8 stored; a machine with an empty cache resumes from step 8's and trains the
    same steps 9-16 as an uninterrupted run."""
    fresh, whole = runs
    fs, bucket = in_a_bucket(fresh("to-store"), "resume-" + tmp_path.name[-12:])
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "first"))
    with pytest.raises(Crash):
        train(mirror_of(f"s3://{bucket}/runs") / "r", cfg(), crash_after_step=10)
    stored = sorted(fs.glob(f"{bucket}/runs/r/train.partial/checkpoints/*/complete.json"))
    assert [p.split("/")[-2] for p in stored] == ["step-0000004", "step-0000008"]

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "second"))
    run_dir = mirror_of(f"s3://{bucket}/runs") / "r"
    assert not (run_dir / "train.partial").exists()
    manifest = train(run_dir, cfg())
    assert manifest["counts"]["steps"] == STEPS and fs.exists(f"{bucket}/runs/r/train/checkpoint/model.safetensors")
    resumed = losses(run_dir)
    assert min(resumed) == 9 and resumed == {s: v for s, v in whole.items() if s > 8}
    assert not fs.exists(f"{bucket}/runs/r/train.partial")  # published, then the attempt's objects removed


def test_on_a_store_a_finished_run_moved_aside_is_kept_in_the_bucket_and_leaves_no_state_behind(
    runs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_store: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A finished run in a bucket, trained again with other settings on a machine whose cache is empty: the
    earlier model moves aside in the bucket (named there), and the new stage holds its own states only."""
    fresh, _ = runs
    fs, bucket = in_a_bucket(fresh("to-store-aside"), "aside-" + tmp_path.name[-12:])
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "first"))
    train(mirror_of(f"s3://{bucket}/runs") / "r", cfg(optim={"lr": 5e-3}))  # states after steps 4, 8 and 12
    before = {p.removeprefix(f"{bucket}/runs/r/train/"): fs.info(p)["ETag"] for p in fs.find(f"{bucket}/runs/r/train")}

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "second"))
    with caplog.at_level(logging.WARNING, logger="kiln"):
        train(mirror_of(f"s3://{bucket}/runs") / "r", cfg(checkpoint={"every": 5, "keep_last": 3}))
    fs.invalidate_cache()
    (aside,) = fs.glob(f"{bucket}/runs/r/train.old-*")
    assert {p.removeprefix(f"{aside}/"): fs.info(p)["ETag"] for p in fs.find(aside)} == before
    assert f"moved s3://{bucket}/runs/r/train aside to s3://{aside}" in caplog.text
    states = sorted(p.split("/")[-2] for p in fs.glob(f"{bucket}/runs/r/train/checkpoints/*/complete.json"))
    assert states == ["step-0000005", "step-0000010", "step-0000015"]


def test_a_damaged_state_in_a_bucket_is_named_there_and_from_resumes_the_one_before_on_any_machine(
    runs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_store: str
) -> None:
    fresh, whole = runs
    fs, bucket = in_a_bucket(fresh("to-store-damaged"), "damaged-" + tmp_path.name[-12:])
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "first"))
    with pytest.raises(Crash):
        train(mirror_of(f"s3://{bucket}/runs") / "r", cfg(), crash_after_step=10)  # states after steps 4 and 8
    shard = f"{bucket}/runs/r/train.partial/checkpoints/step-0000008/__0_0.distcp"
    data = bytearray(fs.cat(shard))
    data[100:116] = bytes(16)
    fs.pipe(shard, bytes(data))

    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "second"))
    run_dir = mirror_of(f"s3://{bucket}/runs") / "r"
    state = f"s3://{bucket}/runs/r/train.partial/checkpoints/step-0000008"
    with pytest.raises(FatalError, match=rf"^{state}: its files do not match .* with --from 4 \(this one is then"):
        train(run_dir, cfg())
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "third"))  # what it advises, on yet another machine
    train(mirror_of(f"s3://{bucket}/runs") / "r", cfg(), from_step=4)
    assert losses(mirror_of(f"s3://{bucket}/runs") / "r") == {s: v for s, v in whole.items() if s > 4}
    fs.invalidate_cache()
    assert not fs.exists(state.removeprefix("s3://") + "/complete.json")  # moved aside there too
