"""Resumable states under hostile or failing conditions (kiln.train.resume, kiln.train.state_files,
kiln.train.monitor): a state folder that would run code, edited JSON with recomputed checksums, a
torn metrics.jsonl, a disk that fills up during a save.

States come from real 8-step runs of the miniature run (a state every 2 steps), interrupted by a
row source that raises inside step 7 (as a failing disk would). Every damaged state must end in a
FatalError naming the file (never a traceback, never code run), and the run must still resume,
bit for bit, from what is intact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from interrupt import Crash, CrashAfter

from kiln.core.errors import FatalError
from kiln.mix.config import MixConfig
from kiln.mix.sampler import build_sampler
from kiln.model.config import ModelConfig, ScoringConfig
from kiln.model.init import build_model
from kiln.text.tokenizer import KilnTokenizer
from kiln.train.collate import build_collator
from kiln.train.config import CheckpointConfig, TrainConfig
from kiln.train.geometry import step_geometry
from kiln.train.mesh import one_process
from kiln.train.monitor import MixtureWindows, truncate_metrics
from kiln.train.objectives import token_ids
from kiln.train.optim import build_optimizer
from kiln.train.resume import States, verify
from kiln.train.rollback import Guard
from kiln.train.run import TrainInputs, run
from kiln.train.state_files import drawn_by

MODEL = ModelConfig(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64)
MIX = MixConfig(seed=0)
SCORING = ScoringConfig(max_tokens_per_source=1024, batch_size=8)
STEPS, ROWS, CRASH_STEP = 8, 8, 7  # 8 rows of 64 tokens a step; the crash comes inside step 7


def cfg(**update: Any) -> TrainConfig:
    base = {
        "steps": STEPS,
        "seq_len": 64,
        "micro_batch_size": ROWS,
        "optim": {"lr": 1e-2},
        "schedule": {"warmup_steps": 2},
        "precision": {"device": "cpu"},
        "eval_at_start": False,
        "checkpoint": {"every": 2, "keep_last": 3},
    }
    return TrainConfig.model_validate({**base, **update})


def make_rows(run_dir: Path, crash: bool, seq_len: int, split: str = "train") -> Any:
    sampler = build_sampler(run_dir / "tokenize", MIX, seq_len, split)
    return CrashAfter(sampler, (CRASH_STEP - 1) * ROWS) if crash and split == "train" else sampler


def train(
    run_dir: Path, train_cfg: TrainConfig | None = None, crash: bool = False, from_step: int | None = None
) -> dict[str, Any]:
    return run(
        MODEL,
        train_cfg or cfg(),
        TrainInputs(MIX, partial(make_rows, run_dir, crash), SCORING),
        run_dir,
        from_step=from_step,
    )


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, lines)) if "loss" in r}


def recompute_checksums(state: Path) -> None:
    """What someone who edits a state does so that complete.json matches again."""
    sums = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.iterdir()) if p.name != "complete.json"
    }
    (state / "complete.json").write_text(json.dumps(sums))


@pytest.fixture(scope="module")
def runs(tokenized_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """fresh(name): a copy of the tokenized run; crashed(): one run interrupted in step 7 (states after
    steps 2, 4, 6 in train.partial), as it was left, in the same place each time (a stage records
    its inputs' paths); the losses and folder of the uninterrupted run."""
    root = tmp_path_factory.mktemp("state_safety")

    def fresh(name: str, under: Path = root) -> Path:
        for stage in ("curate", "tokenizer", "tokenize"):
            shutil.copytree(tokenized_run / stage, under / name / stage)
        return under / name

    whole = fresh("whole")
    train(whole)
    interrupted = fresh("interrupted")
    with pytest.raises(Crash):
        train(interrupted, crash=True)
    as_left = Path(shutil.copytree(interrupted, root / "as-left"))

    def crashed() -> Path:
        shutil.rmtree(interrupted)
        return Path(shutil.copytree(as_left, interrupted))

    return fresh, crashed, losses(whole), whole


def test_states_are_written_without_pickles(runs: Any) -> None:
    _, crashed, _, _ = runs
    state = crashed() / "train.partial" / "checkpoints" / "step-0000006"
    assert sorted(p.name for p in state.iterdir()) == [
        "__0_0.distcp",
        "complete.json",
        "metadata.json",
        "rng-0.json",
        "train_state.json",
    ]
    described = json.loads((state / "metadata.json").read_text())
    assert described["format"] == "kiln-dcp-metadata v1"
    # Only tensors: DCP would pickle anything else (the optimizer's group settings come from the recipe).
    assert described["tensors"] and not any(key.startswith("optimizer.param_groups") for key in described["tensors"])
    saved = json.loads((state / "train_state.json").read_text())
    assert saved["step"] == 6 and saved["data_ranks"] == [[1, 1]] and saved["batches"]["rows"]["rows_drawn"] == 6 * ROWS


class RunsCode:
    """An object whose unpickling runs a command (it creates `marker`): what a forged state would hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_metadata_is_refused_unread_and_an_older_state_resumes_exactly(runs: Any, tmp_path: Path) -> None:
    _, crashed, whole, _ = runs
    run_dir = crashed()
    state = run_dir / "train.partial" / "checkpoints" / "step-0000006"
    marker = tmp_path / "code-ran"

    # A state as an earlier kiln wrote it (DCP's pickled .metadata), made hostile, its checksums recomputed.
    (state / "metadata.json").unlink(missing_ok=True)
    (state / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    recompute_checksums(state)
    with pytest.raises(
        FatalError,
        match=(
            r"step-0000006/\.metadata: DCP's metadata as a pickle.* so it is not loaded: resume from a state this "
            r"kiln wrote with --from STEP, or pass --force"
        ),
    ):
        train(run_dir)
    assert not marker.exists()
    train(run_dir, from_step=4)
    assert losses(run_dir) == whole  # steps 5..8 replayed from the intact state after step 4


def test_a_shard_that_would_run_code_is_refused_by_weights_only(runs: Any, tmp_path: Path) -> None:
    _, crashed, _, _ = runs
    run_dir = crashed()
    state = run_dir / "train.partial" / "checkpoints" / "step-0000006"
    marker = tmp_path / "code-ran"

    # The embedding's chunk now points at a torch.save record whose unpickling runs a command.
    torch.save(RunsCode(marker), state / "__0_1.distcp")
    described = json.loads((state / "metadata.json").read_text())
    entry = next(e for e in described["storage"] if e["fqn"] == "model.embed.weight")
    entry.update(file="__0_1.distcp", start=0, length=(state / "__0_1.distcp").stat().st_size)
    (state / "metadata.json").write_text(json.dumps(described))
    recompute_checksums(state)
    with pytest.raises(
        FatalError,
        match=(
            r"step-0000006: its model and optimizer shards cannot be loaded \(UnpicklingError: Weights only load "
            r"failed"
        ),
    ):
        train(run_dir)
    assert not marker.exists()


def test_an_edited_rows_drawn_is_refused_with_the_expected_and_found_values(runs: Any) -> None:
    _, crashed, _, _ = runs
    run_dir = crashed()
    state = run_dir / "train.partial" / "checkpoints" / "step-0000006"
    saved = json.loads((state / "train_state.json").read_text())
    saved["batches"]["rows"]["rows_drawn"] += ROWS  # skip a step's rows ...
    saved["batches"]["rows"]["drawn"][0] += ROWS  # ... and keep the per-source counts adding up
    (state / "train_state.json").write_text(json.dumps(saved))
    recompute_checksums(state)
    with pytest.raises(
        FatalError,
        match=(
            r"train_state\.json: batches\.rows\.rows_drawn: 56, but steps 1\.\.6 of this run draw 48 rows .*--from "
            r"STEP, or pass --force"
        ),
    ):
        train(run_dir)
    saved["batches"]["rows"]["drawn"][0] -= ROWS
    (state / "train_state.json").write_text(json.dumps(saved))
    recompute_checksums(state)
    with pytest.raises(
        FatalError, match=r"batches\.rows\.rows_drawn: 56, but its rows per source \(drawn\) add up to 48"
    ):
        verify(state, cfg())


@settings(max_examples=150, deadline=None)
@given(
    steps=st.integers(4, 200),
    rows=st.sampled_from([2, 4, 8]),
    warmup=st.none() | st.tuples(st.sampled_from([0.1, 0.25, 0.5]), st.integers(1, 40)),
    phase=st.none() | st.sampled_from([0.1, 0.3, 1 / 3, 0.5, 0.7]),
    data=st.data(),
)
def test_the_rows_a_state_must_have_drawn_are_the_sum_over_its_steps(
    steps: int, rows: int, warmup: tuple[float, int] | None, phase: float | None, data: st.DataObject
) -> None:
    """drawn_by adds whole stretches of steps of one shape; the reference adds every step's rows."""
    section: dict[str, Any] = {
        "steps": steps,
        "seq_len": 64,
        "micro_batch_size": rows,
        "schedule": {"warmup_steps": 1},
        "precision": {"device": "cpu"},
    }
    if warmup:
        section["batch_warmup"] = {"start_fraction": warmup[0], "steps": warmup[1]}
    if phase:
        section["seq_len_schedule"] = [{"start": 0, "seq_len": 32}, {"start": phase, "seq_len": 64}]
    train_cfg = TrainConfig.model_validate(section, context={"data_ranks": 1})
    step = data.draw(st.integers(1, steps), label="step")
    later = data.draw(
        st.lists(st.tuples(st.integers(2, max(2, step)), st.sampled_from([1, 2, 4])), max_size=2), label="stretches"
    )
    data_ranks = sorted({(1, 1), *later})
    data_ranks = [r for i, r in enumerate(data_ranks) if i == 0 or r[0] != data_ranks[i - 1][0]]
    skips = data.draw(st.dictionaries(st.integers(1, steps), st.integers(1, 2), max_size=3), label="skips")
    rows_drawn = tokens = 0
    for s in range(1, step + 1):
        world = [w for first, w in data_ranks if first <= s][-1]
        shape = step_geometry(s, train_cfg, world)
        rows_drawn += shape.rows_per_rank * world * (1 + skips.get(s, 0))
        tokens += shape.tokens(world)
    assert drawn_by(train_cfg, step, data_ranks, skips) == (rows_drawn, tokens)


# Any JSON value, for replacing part of a file.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def places(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value in a JSON document, the document itself first."""
    inner = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    return [at, *(p for k, v in inner for p in places(v, (*at, k)))]


@st.composite
def edited(draw: st.DrawFn, text: str) -> str:
    """`text` (a JSON document) with one edit: a value replaced, nudged or removed, or the text cut."""
    doc = json.loads(text)
    how = draw(st.sampled_from(["replace", "nudge", "remove", "cut"]))
    if how == "cut":
        return text[: draw(st.integers(0, len(text) - 1))]
    at = draw(st.sampled_from(places(doc)))
    if not at:
        return json.dumps(draw(JSON))
    parent = doc
    for key in at[:-1]:
        parent = parent[key]
    value = parent[at[-1]]
    if how == "nudge" and type(value) is int:
        parent[at[-1]] = value + draw(st.sampled_from([-2, -1, 1, 2, 10**6]))
    elif how == "remove":
        del parent[at[-1]]
    else:
        parent[at[-1]] = draw(JSON)
    return json.dumps(doc)


@pytest.fixture(scope="module")
def intact(runs: Any) -> Path:
    """A state as saved, which loads (so that the edits below are what a refusal is about)."""
    _, crashed, _, _ = runs
    run_dir = crashed()
    state = Path(
        shutil.copytree(
            run_dir / "train.partial" / "checkpoints" / "step-0000006", run_dir.parent / "intact" / "step-0000006"
        )
    )
    with torch.random.fork_rng():
        resume_short_of_training(state, run_dir.parent / "as-left")
    return state


def resume_short_of_training(state: Path, run_dir: Path) -> None:
    """What a resume reads and builds from a state (model, optimizer, RNGs, data stream, guard,
    mixture), then the next batch: everything but the steps."""
    train_cfg, ranks = cfg(), one_process(torch.device("cpu"))
    ids = token_ids(KilnTokenizer.load(run_dir / "tokenizer" / "tokenizer.json"))
    batches = build_collator(build_sampler(run_dir / "tokenize", MIX, train_cfg.seq_len), train_cfg, ids)
    model = build_model(MODEL.resolved(512), train_cfg.seed, ranks.device)
    states = States(state.parent, ranks, CheckpointConfig(keep_last=3))
    saved = states.load(state, model, build_optimizer(model, train_cfg.optim), train_cfg)
    batches.load_state_dict(saved["batches"])
    MixtureWindows(batches.sources, train_cfg.steps, 10).load_state_dict(saved["mixture"])
    Guard(train_cfg.rollback).load_state_dict(saved["guard"])
    batches.next_batch(ROWS, train_cfg.seq_len, train_cfg.geometry(saved["step"] + 1).progress)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), name=st.sampled_from(["train_state.json", "rng-0.json", "metadata.json", "complete.json"]))
def test_an_edited_state_file_is_refused_by_name_or_loads_never_a_traceback(
    intact: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, name: str
) -> None:
    state = tmp_path_factory.mktemp("edited") / intact.name
    shutil.copytree(intact, state)
    (state / name).write_text(data.draw(edited((intact / name).read_text()), label=name))
    if name != "complete.json":
        recompute_checksums(state)
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng():
            resume_short_of_training(state, intact.parents[1] / "as-left")
        event(f"{name}: loaded")  # a harmless edit (a log record, a value nothing checks)
    except FatalError as e:
        event(f"{name}: refused")
        assert str(state) in str(e) or "checkpoint sampler, source" in str(e), e
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_a_damaged_one_before_it_is_named(
    runs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, crashed, whole, _ = runs
    run_dir = crashed()
    metrics = run_dir / "train.partial" / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines(keepends=True)
    torn = b'{"step": 7, "loss": 4.71, "loss_by_so'  # a write cut short by a full disk: no end, no newline
    metrics.write_bytes(b"".join([*lines[:3], b"\n", *lines[3:], torn]))  # a blank line too
    with caplog.at_level(logging.WARNING, logger="kiln.train"):
        train(run_dir)
    assert losses(run_dir) == whole
    assert any(
        f"{metrics}: its last line (line {len(lines) + 2}, {len(torn)} bytes) is not a whole record" in r.getMessage()
        and "dropped" in r.getMessage()
        for r in caplog.records
    )
    damaged = run_dir / "damaged.jsonl"
    damaged.write_bytes(b"".join([*lines[:2], torn + b"\n", *lines[2:]]))
    with pytest.raises(FatalError, match=rf"{damaged}: line 3 is not a metrics record .*remove that line"):
        truncate_metrics(damaged, 4)


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 24 MiB tmpfs (a disk that fills up for real); skipped where it cannot be mounted (not root, not Linux)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = (
        sys.platform == "linux"
        and os.geteuid() == 0
        and not subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True
        ).returncode
    )
    if not mounted:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_during_a_save_stops_with_one_line_and_the_next_run_resumes_exactly(
    runs: Any, small_disk: Path, async_save: bool
) -> None:
    fresh, _, whole, whole_dir = runs
    run_dir = fresh("run", under=small_disk)
    one_state = sum(p.stat().st_size for p in (whole_dir / "train" / "checkpoints" / "step-0000002").iterdir())
    # Room for the state after step 2 and half of the next: step 4's save fills the disk.
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(shutil.disk_usage(small_disk).free - one_state * 3 // 2))
    every = {"every": 2, "keep_last": 3, "async_save": async_save}
    with pytest.raises(
        FatalError,
        match=(
            r"^cannot write /.*: No space left on device; free space on that disk and run the same command again: "
            r"finished work is kept"
        ),
    ) as failed:
        train(run_dir, cfg(checkpoint=every))
    states = run_dir / "train.partial" / "checkpoints"
    assert sorted(p.name for p in states.iterdir()) == ["step-0000002"]  # step 4's partial folder is gone
    if not async_save:  # an async save's failure may surface first as the next metrics line that cannot be written
        assert re.search(
            (
                r"step-0000004\.tmp/__0_0\.distcp: No space left on device; .*\(training resumes from .*step-0000002; "
                r"the state after step 4 was not saved\)$"
            ),
            str(failed.value),
        )
    ballast.unlink()  # space freed
    train(run_dir, cfg(checkpoint=every))
    assert losses(run_dir) == whole
