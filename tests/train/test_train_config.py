"""kiln.train.config.TrainConfig: cross-field checks and derived sizes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.train.config import TrainConfig


def test_tokens_per_step_is_the_product_of_the_batch_geometry() -> None:
    assert TrainConfig(seq_len=64, micro_batch_size=8, grad_accum_steps=3).tokens_per_step == 64 * 8 * 3


def test_warmup_must_be_below_steps() -> None:
    with pytest.raises(ValidationError, match=r"warmup_steps \(10\) must be below steps \(10\)"):
        TrainConfig(steps=10, warmup_steps=10)
    assert TrainConfig(steps=10, warmup_steps=9).warmup_steps == 9


@pytest.mark.parametrize("bad", [{"lr": 0}, {"lr": 2.0}, {"beta2": 1.0}, {"grad_clip": 0}, {"device": "tpu"}, {"micro_batch_size": 0}])
def test_out_of_range_values_are_rejected(bad: dict) -> None:
    with pytest.raises(ValidationError, match=next(iter(bad))):
        TrainConfig(**bad)
