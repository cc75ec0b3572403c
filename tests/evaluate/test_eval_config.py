"""kiln.evaluate.config.EvalConfig: the validation scorer's settings plus the eval stage's precision."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.core.manifest import config_hash
from kiln.evaluate.config import EvalConfig, GenerateConfig
from kiln.model.config import ScoringConfig


def test_eval_extends_the_scoring_settings_and_hands_them_to_the_trainer() -> None:
    cfg = EvalConfig(seq_len=64, max_tokens_per_source=1000, batch_size=4, precision={"dtype": "bf16"})
    assert isinstance(cfg, ScoringConfig)
    assert cfg.scoring() == ScoringConfig(seq_len=64, max_tokens_per_source=1000, batch_size=4)
    assert type(cfg.scoring()) is ScoringConfig  # no precision: the trainer scores in its own


def test_batch_size_is_not_hashed_and_precision_is() -> None:
    base = config_hash({"eval": EvalConfig()})
    assert config_hash({"eval": EvalConfig(batch_size=64)}) == base
    assert config_hash({"eval": EvalConfig(precision={"dtype": "bf16"})}) != base


def test_the_probe_set_is_not_the_eval_stages_identity_but_tasks_and_data_are() -> None:
    base = config_hash({"eval": EvalConfig()})
    assert config_hash({"eval": EvalConfig(probe={"prompts": ["def "], "documents_per_source": 5})}) == base
    assert config_hash({"eval": EvalConfig(tasks=["arc.jsonl"])}) != base
    assert config_hash({"eval": EvalConfig(data=["notes.txt"])}) != base


def test_an_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least 1 character"):
        GenerateConfig(stop=["\n\n", ""])
