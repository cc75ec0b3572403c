"""Rollback on NaN and loss spikes (kiln.train.rollback, kiln.train.loop), through the real train
stage on the shared miniature run, with the faults carried in by the data.

The data source is mix's real sampler with some rows replaced, by their place in the global
stream: the rows of one step become uniformly random token ids (a corrupt shard: a real loss
spike), the rows of another carry a token id the tokenizer never emits (the model's vocabulary is
8 ids larger than the tokenizer's). kiln's model cannot turn valid ids into a NaN in fp32 (every
attention row sees itself), so the test makes that one id poisonous: a forward hook turns its
embedding into NaN, standing in for an overflow or a faulty device that this batch triggers.
Every fault must roll back to the newest state, skip exactly those rows on the way back, and go on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln.core.errors import FatalError
from kiln.mix.config import MixConfig
from kiln.mix.sampler import build_sampler
from kiln.model.config import ModelConfig, ScoringConfig
from kiln.train import parts
from kiln.train.config import TrainConfig
from kiln.train.rollback import Guard, RollbackConfig
from kiln.train.run import TrainInputs, run
from kiln.train.schedule import lr_at

ROWS = 8  # rows per step (one micro-batch of 8 x 64)
POISON = 519  # the model has 520 ids, the tokenizer 512
NAN_STEP, SPIKE_STEP = 14, 26
# The spike's rows are those step 27 would read; skipping step 14's rows moves them to step 26.
SPIKE_ROWS = list(range(26 * ROWS, 27 * ROWS))
MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64, vocab_size=520)
MIX = MixConfig(seed=0)


def cfg(**update: Any) -> TrainConfig:
    base = {
        "steps": 40,
        "seq_len": 64,
        "micro_batch_size": ROWS,
        "optim": {"lr": 1e-2},
        "schedule": {"warmup_steps": 4},
        "precision": {"device": "cpu"},
        "eval_at_start": False,
        "checkpoint": {"every": 4},
        "rollback": {"spike_factor": 1.3, "spike_window": 5, "max_rollbacks": 3, "lr_factor": 0.5, "lr_steps": 3},
    }
    return TrainConfig.model_validate({**base, **update})


class CorruptRows:
    """mix's sampler with the rows of chosen steps corrupted, by their global index."""

    def __init__(self, inner: Any, corrupt: dict[int, str]):
        self.inner, self.corrupt = inner, corrupt  # row index -> "spike" | "nan"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def next_rows(self, lengths: Any, progress: float, keep: slice) -> Any:
        rows = self.inner.next_rows(lengths, progress, keep)
        tokens = []
        for index, window in zip(rows.index_B.tolist(), rows.tokens, strict=True):
            kind = self.corrupt.get(index)
            if kind == "spike":
                window = np.random.default_rng(index).integers(0, 512, len(window))
            elif kind == "nan":
                window = window.copy()
                window[len(window) // 2] = POISON
            tokens.append(window)
        return dataclasses.replace(rows, tokens=tokens)


def copy_tokenized(run_dir: Path, dest: Path) -> Path:
    for stage in ("curate", "tokenizer", "tokenize"):
        shutil.copytree(run_dir / stage, dest / stage)
    return dest


def rows_of(step: int) -> list[int]:
    return list(range((step - 1) * ROWS, step * ROWS))


def poisonous_embeddings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models the loop builds turn the POISON id's embedding into NaN."""
    build = parts.build_model

    def build_with_hook(*args: Any) -> Any:
        model = build(*args)
        model.embed.register_forward_hook(
            lambda module, ids, out: out.masked_fill((ids[0] == POISON)[..., None], float("nan"))
        )
        return model

    monkeypatch.setattr(parts, "build_model", build_with_hook)


def train_corrupted(run_dir: Path, train_cfg: TrainConfig, corrupt: dict[int, str]) -> dict[str, Any]:
    def make_rows(seq_len: int, split: str = "train") -> Any:
        sampler = build_sampler(run_dir / "tokenize", MIX, seq_len, split)
        return CorruptRows(sampler, corrupt) if split == "train" else sampler

    return run(
        MODEL, train_cfg, TrainInputs(MIX, make_rows, ScoringConfig(max_tokens_per_source=2048, batch_size=8)), run_dir
    )


def records(run_dir: Path, folder: str = "train") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / folder / "metrics.jsonl").read_text().splitlines()]


def test_a_nan_and_a_spike_in_the_data_roll_back_skip_their_rows_and_training_goes_on(
    tokenized_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    poisonous_embeddings(monkeypatch)
    run_dir = copy_tokenized(tokenized_run, tmp_path / "run")
    corrupt = {**{i: "nan" for i in rows_of(NAN_STEP)}, **{i: "spike" for i in SPIKE_ROWS}}
    with caplog.at_level(logging.WARNING, logger="kiln.train"):
        manifest = train_corrupted(run_dir, cfg(), corrupt)

    assert manifest["counts"]["rollbacks"] == 2
    log = records(run_dir)
    rollbacks = [r["rollback"] for r in log if r.get("kind") == "rollback"]
    assert [(r["at_step"], r["to_step"]) for r in rollbacks] == [
        (NAN_STEP, 12),
        (SPIKE_STEP, 24),
    ]  # the newest states (every 4)
    assert "loss is nan" in rollbacks[0]["reason"] and rollbacks[1]["reason"].startswith("loss spike")
    assert [r["rows"] for r in rollbacks] == [rows_of(NAN_STEP), SPIKE_ROWS]
    assert all(len(r["sources"]) == ROWS and set(r["sources"]) <= {"code", "legal"} for r in rollbacks)
    steps = [r for r in log if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 41))  # the replayed steps replace the abandoned ones
    assert all(np.isfinite(r["loss"]) for r in steps)
    assert [r["rollbacks"] for r in steps if r["step"] in (12, 13, 25, 40)] == [0, 1, 2, 2]
    # After each rollback the lr is halved up to 3 steps past the faulting step.
    schedule = cfg()
    for r in steps:
        lowered = 13 <= r["step"] <= NAN_STEP + 3 or 25 <= r["step"] <= SPIKE_STEP + 3
        expected = lr_at(
            r["step"],
            1e-2,
            4,
            40,
            schedule.schedule.min_lr_ratio,
            schedule.schedule.kind,
            schedule.schedule.decay_fraction,
        ) * (0.5 if lowered else 1)
        assert r["lr"] == pytest.approx(expected, rel=1e-9), r["step"]
    # The replay reached each faulting step again and drew the rows after the offending ones.
    skipped = [m.getMessage().split(" (")[0] for m in caplog.records if "skipping rows" in m.getMessage()]
    assert skipped == [
        f"train: step {NAN_STEP}: skipping rows 104..111 of the stream",
        f"train: step {SPIKE_STEP}: skipping rows 208..215 of the stream",
    ]
    assert manifest["counts"]["val_after"]["all"]["loss"] < 5.5  # it learned (ln 520 = 6.25)


def test_a_fault_with_no_state_to_go_back_to_or_no_rollbacks_left_stops_with_the_reason(
    tokenized_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poisonous_embeddings(monkeypatch)
    corrupt = {i: "nan" for i in rows_of(6)}
    no_states = copy_tokenized(tokenized_run, tmp_path / "none")
    with pytest.raises(
        FatalError,
        match=(
            r"step 6: loss is nan on rows 40\.\.47 of the stream .*no resumable state to roll back to \(set "
            r"train\.checkpoint\.every to save them\)"
        ),
    ):
        train_corrupted(no_states, cfg(steps=8, checkpoint={"every": None}), corrupt)
    none_left = copy_tokenized(tokenized_run, tmp_path / "max")
    with pytest.raises(
        FatalError,
        match=r"step 6: loss is nan .*0 rollback\(s\) already, train\.rollback\.max_rollbacks is 0: stopping",
    ):
        train_corrupted(none_left, cfg(steps=8, rollback={"max_rollbacks": 0}), corrupt)


def test_the_guard_finds_nan_inf_and_spikes_against_the_running_median() -> None:
    guard = Guard(RollbackConfig(spike_factor=2.0, spike_window=3))
    assert [guard.check(loss, 1.0) for loss in (5.0, 4.0, 3.0)] == [None, None, None]
    assert guard.check(8.5, 1.0) == "loss spike: 8.5000 > 2 x 4.0000, the median of the last 3 steps"
    assert guard.check(float("nan"), 1.0) == "loss is nan"
    assert guard.check(3.0, float("inf")) == "gradient norm is inf"
    assert (
        Guard(RollbackConfig(), check_grad_norm=False).check(3.0, float("inf")) is None
    )  # fp16: the loss scaler's business
    assert guard.check(7.9, 1.0) is None  # below 2 x the median, which faults never moved
    guard.rolled_back(10)
    restored = Guard(RollbackConfig(spike_factor=2.0, spike_window=3))
    restored.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert (restored.rollbacks, restored.skips, list(restored.history)) == (1, {10: 1}, [4.0, 3.0, 7.9])
