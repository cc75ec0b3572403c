"""kiln.train.config.TrainConfig: sub-sections, batch geometry from global_batch_tokens, moved keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.core.manifest import config_hash, hashed_settings
from kiln.train.config import TrainConfig


def test_accumulation_follows_from_global_batch_tokens() -> None:
    cfg = TrainConfig(seq_len=64, micro_batch_size=8, global_batch_tokens=64 * 8 * 3)
    assert cfg.grad_accum_steps == 3 and cfg.tokens_per_step == 1536
    # None: one micro-batch per step.
    default = TrainConfig(seq_len=64, micro_batch_size=8)
    assert default.grad_accum_steps == 1 and default.tokens_per_step == 512


def test_global_batch_that_does_not_divide_is_refused_with_the_numbers() -> None:
    with pytest.raises(
        ValidationError,
        match=(
            r"global_batch_tokens \(1000\) is not a multiple of micro_batch_size \* seq_len \* data-parallel ranks "
            r"\(8 \* 64 \* 1 = 512\); use a multiple such as 1024"
        ),
    ):
        TrainConfig(seq_len=64, micro_batch_size=8, global_batch_tokens=1000)
    with pytest.raises(ValidationError, match="use a multiple such as 512"):
        TrainConfig(seq_len=64, micro_batch_size=8, global_batch_tokens=100)


def test_warmup_must_be_below_steps() -> None:
    with pytest.raises(ValidationError, match=r"schedule.warmup_steps \(10\) must be below steps \(10\)"):
        TrainConfig(steps=10, schedule={"warmup_steps": 10})
    assert TrainConfig(steps=10, schedule={"warmup_steps": 9}).schedule.warmup_steps == 9


@pytest.mark.parametrize(
    ("fraction", "steps", "warmup"),
    [
        (0.1, 40, 4),  # the case: the share of a short run
        (0.089, 450, 40),  # the demo recipe: 40.05 -> 40, its former warmup_steps
        (0.29, 100, 29),  # 0.29 * 100 is 28.999... in floats: rounded, not truncated
        (0.05, 30, 2),  # 1.5 -> 2 (nearest, halves to even)
        (0.0, 10, 0),  # no warmup
        (0.99, 3, 2),  # 2.97 -> 3 would leave no step after warmup: at most steps - 1
        (0.5, 1, 0),
    ],
)
def test_warmup_fraction_is_a_share_of_the_steps(fraction: float, steps: int, warmup: int) -> None:
    cfg = TrainConfig(steps=steps, schedule={"warmup_fraction": fraction})
    assert cfg.warmup_steps == warmup
    assert cfg.schedule.warmup_steps is None  # the default of 30 steps gave way to the fraction


def test_warmup_is_given_one_way() -> None:
    with pytest.raises(ValidationError, match=r"warmup_steps \(5\) and warmup_fraction \(0.1\) are both set; keep one"):
        TrainConfig(schedule={"warmup_steps": 5, "warmup_fraction": 0.1})
    with pytest.raises(ValidationError, match="warmup_steps is null and warmup_fraction is not set"):
        TrainConfig(schedule={"warmup_steps": None})
    for bad in (1.0, -0.1):
        with pytest.raises(ValidationError, match="warmup_fraction"):
            TrainConfig(schedule={"warmup_fraction": bad})
    assert TrainConfig(steps=10, schedule={"warmup_steps": None, "warmup_fraction": 0.2}).warmup_steps == 2
    assert TrainConfig(steps=100).warmup_steps == 30  # neither: the default in steps


def test_warmup_fraction_left_unset_keeps_the_hash_of_earlier_runs() -> None:
    # Unset optional keys are not hashed (kiln.core.manifest.hashed_settings): runs trained before
    # warmup_fraction existed stay current; a fraction is a new identity even where it gives the same steps.
    assert "warmup_fraction" not in hashed_settings({"train": TrainConfig()})["train"]["schedule"]
    steps = config_hash({"train": TrainConfig(steps=100, schedule={"warmup_steps": 10})})
    assert config_hash({"train": TrainConfig(steps=100, schedule={"warmup_fraction": 0.1})}) != steps


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"optim": {"lr": 0}}, "lr"),
        ({"optim": {"lr": 2.0}}, "lr"),
        ({"optim": {"beta2": 1.0}}, "beta2"),
        ({"optim": {"grad_clip": 0}}, "grad_clip"),
        ({"precision": {"device": "tpu"}}, "device"),
        ({"precision": {"dtype": "int8"}}, "dtype"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"checkpoint": {"every": 0}}, "every"),
    ],
)
def test_out_of_range_values_are_rejected(bad: dict, where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        TrainConfig(**bad)


@pytest.mark.parametrize(
    ("old", "message"),
    [
        ({"lr": 1e-3}, "train.lr moved to train.optim.lr"),
        ({"weight_decay": 0.0}, "train.weight_decay moved to train.optim.weight_decay"),
        ({"beta1": 0.8}, "train.beta1 moved to train.optim.beta1"),
        ({"beta2": 0.99}, "train.beta2 moved to train.optim.beta2"),
        ({"grad_clip": None}, "train.grad_clip moved to train.optim.grad_clip"),
        ({"warmup_steps": 5}, "train.warmup_steps moved to train.schedule.warmup_steps"),
        ({"min_lr_ratio": 0.0}, "train.min_lr_ratio moved to train.schedule.min_lr_ratio"),
        ({"device": "cpu"}, "train.device moved to train.precision.device"),
        ({"precision": "bf16"}, "train.precision is a section now: use train.precision.dtype=bf16"),
        ({"checkpoint_every": 10}, "train.checkpoint_every moved to train.checkpoint.every"),
        ({"grad_accum_steps": 2}, "train.grad_accum_steps is replaced by train.global_batch_tokens"),
    ],
)
def test_keys_of_the_flat_section_name_their_new_home(old: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
        TrainConfig(**old)


def test_speed_only_settings_do_not_change_the_hash() -> None:
    base = config_hash({"train": TrainConfig()})
    for same in ({"threads": 2}, {"eval_at_start": False}, {"checkpoint": {"every": 5}}):
        assert config_hash({"train": TrainConfig(**same)}) == base, same
    for other in (
        {"optim": {"lr": 1e-3}},
        {"schedule": {"min_lr_ratio": 0.0}},
        {"precision": {"dtype": "bf16"}},
        {"global_batch_tokens": 8192},
    ):
        assert config_hash({"train": TrainConfig(**other)}) != base, other


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"objective": "t5"}, "objective"),
        ({"objective": {"clm": 0, "mlm": 0}}, "give no objective a positive weight"),
        ({"mlm": {"replace_with_mask": 0.8, "replace_with_random": 0.3}}, "exceeds 1"),
        ({"prefix_lm": {"min_share": 0.8, "max_share": 0.2}}, "min_share"),
        ({"seq_len_schedule": [{"start": 0.2, "seq_len": 128}]}, "must begin at 0"),
        (
            {"seq_len_schedule": [{"start": 0.0, "seq_len": 128}, {"start": 0.0, "seq_len": 256}]},
            "must begin at 0 and increase",
        ),
        ({"seq_len_schedule": [{"start": 0.0, "seq_len": 512}]}, "seq_len 512 must be at most seq_len"),
        ({"seq_len_schedule": [{"start": 0.0, "seq_len": 96}]}, "divide micro_batch_size"),
    ],
)
def test_objective_and_schedule_settings_are_checked_before_any_work(bad: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainConfig(**bad)


def test_step_geometry_keeps_tokens_per_step_across_phases() -> None:
    cfg = TrainConfig(
        steps=10,
        seq_len=256,
        micro_batch_size=16,
        schedule={"warmup_steps": 2},
        seq_len_schedule=[{"start": 0.0, "seq_len": 64}, {"start": 0.5, "seq_len": 256, "rope_theta": 5e5}],
    )
    first, last = cfg.geometry(1), cfg.geometry(10)
    assert (first.seq_len, first.rows_per_rank, first.micro_rows, first.rope_theta) == (64, 64, 64, None)
    assert (last.seq_len, last.rows_per_rank, last.micro_rows, last.rope_theta) == (256, 16, 16, 5e5)
    assert first.tokens(1) == last.tokens(1) == 4096
    assert cfg.geometry(6).progress == 0.5 and cfg.geometry(6).seq_len == 256  # the phase starts at its progress
