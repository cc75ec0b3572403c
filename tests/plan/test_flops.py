"""kiln.plan.flops: training compute from the model config's own counts, and its table."""

from __future__ import annotations

import pytest

from kiln.core.recipe import load_recipe
from kiln.model.config import ModelConfig, count_params, flops_per_token
from kiln.plan.flops import format_plan, plan_training
from kiln.train.config import TrainConfig

# The shape recipes/demo.yaml trains, spelled out so the worked numbers do not move with the recipe.
DEMO_MODEL = ModelConfig(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256, tie_embeddings=True)
DEMO_TRAIN = TrainConfig(steps=300, seq_len=256, micro_batch_size=16, grad_accum_steps=1, warmup_steps=30)


def test_demo_shape_plan_by_hand() -> None:
    plan = plan_training(DEMO_MODEL, DEMO_TRAIN, vocab_size=8192)
    # params 5,048,576 (2,951,424 without the embedding), see tests/model/test_model_config.py.
    # FLOPs/token: 6 * (2,949,120 block matmuls + 2,097,152 output projection) = 30,277,632
    #   plus attention 12 * 4 layers * 256 seq * 256 d_attn = 3,145,728 -> 33,423,360.
    assert plan["params"] == 5_048_576
    assert plan["params_non_embedding"] == 2_951_424
    assert plan["tokens"] == 300 * 16 * 256 == 1_228_800
    assert plan["flops_per_token"] == 33_423_360
    assert plan["train_flops"] == 33_423_360 * 1_228_800
    assert plan["train_flops_6nd"] == 6 * 5_048_576 * 1_228_800
    assert plan["chinchilla_tokens"] == 20 * 5_048_576
    assert plan["tokens_per_param"] == round(1_228_800 / 5_048_576, 3)
    # 6ND / exact = 30,291,456 / 33,423,360 = 0.906: 6ND misses the attention term.
    assert plan["train_flops_6nd"] / plan["train_flops"] == pytest.approx(30_291_456 / 33_423_360)


@pytest.fixture(scope="module")
def demo_plan() -> dict:
    recipe = load_recipe("demo")
    return plan_training(recipe.model, recipe.train, recipe.tokenizer.vocab_size)


def test_6nd_is_within_20_percent_of_the_exact_count_for_the_demo_recipe(demo_plan: dict) -> None:
    assert demo_plan["train_flops_6nd"] == 6 * demo_plan["params"] * demo_plan["tokens"]
    assert 0.8 < demo_plan["train_flops_6nd"] / demo_plan["train_flops"] < 1.2


@pytest.mark.parametrize("tied", [True, False])
def test_train_flops_is_flops_per_token_times_tokens(tied: bool) -> None:
    model = ModelConfig(d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, tie_embeddings=tied)
    train = TrainConfig(steps=50, seq_len=128, micro_batch_size=4, grad_accum_steps=3, warmup_steps=5)
    plan = plan_training(model, train, vocab_size=1000)
    resolved = model.resolved(1000)
    assert plan["tokens"] == 50 * 128 * 4 * 3
    assert plan["params"] == count_params(resolved)
    assert plan["flops_per_token"] == flops_per_token(resolved, 128)
    assert plan["train_flops"] == flops_per_token(resolved, 128) * plan["tokens"]
    assert plan["vocab_size"] == 1000 and plan["seq_len"] == 128


def test_a_fixed_model_vocab_wins_over_the_tokenizers() -> None:
    plan = plan_training(ModelConfig(vocab_size=512, d_model=32, n_heads=2), TrainConfig(steps=2, warmup_steps=1), vocab_size=9999)
    assert plan["params"] == count_params(ModelConfig(vocab_size=512, d_model=32, n_heads=2))


def test_format_plan_shows_the_numbers() -> None:
    text = format_plan(plan_training(DEMO_MODEL, DEMO_TRAIN, vocab_size=8192))
    for needle in ("5,048,576", "2,951,424", "8,192", "1,228,800", "33,423,360", "4.107e+13", "3.722e+13", "100,971,520", "0.243"):
        assert needle in text, needle
    assert len(text.splitlines()) == 8
