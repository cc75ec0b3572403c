"""kiln.plan.flops: training compute from the model config's own counts, for a recipe, a preset or raw numbers."""

from __future__ import annotations

import pytest

from kiln.core.errors import ConfigError
from kiln.model.config import ModelConfig, count_params, flops_per_token, get_preset
from kiln.plan.flops import count_flops, format_flops, format_plan, plan_training
from kiln.recipe import load_recipe
from kiln.train.config import TrainConfig

# The shape recipes/demo.yaml trains, spelled out so the worked numbers do not move with the recipe.
DEMO_MODEL = ModelConfig(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=256, tie_embeddings=True)
DEMO_TRAIN = TrainConfig(
    steps=300, seq_len=256, micro_batch_size=16, global_batch_tokens=4096, schedule={"warmup_steps": 30}
)


def test_demo_shape_plan_by_hand() -> None:
    plan = plan_training(DEMO_MODEL, DEMO_TRAIN.seq_len, DEMO_TRAIN.steps * DEMO_TRAIN.tokens_per_step, vocab_size=8192)
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
    return plan_training(
        recipe.model,
        recipe.train.seq_len,
        recipe.train.steps * recipe.train.tokens_per_step,
        recipe.tokenizer.vocab_size,
    )


def test_6nd_is_within_20_percent_of_the_exact_count_for_the_demo_recipe(demo_plan: dict) -> None:
    assert demo_plan["train_flops_6nd"] == 6 * demo_plan["params"] * demo_plan["tokens"]
    assert 0.8 < demo_plan["train_flops_6nd"] / demo_plan["train_flops"] < 1.2


@pytest.mark.parametrize("tied", [True, False])
def test_train_flops_is_flops_per_token_times_tokens(tied: bool) -> None:
    model = ModelConfig(d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, tie_embeddings=tied)
    train = TrainConfig(
        steps=50, seq_len=128, micro_batch_size=4, global_batch_tokens=3 * 4 * 128, schedule={"warmup_steps": 5}
    )
    plan = plan_training(model, train.seq_len, train.steps * train.tokens_per_step, vocab_size=1000)
    resolved = model.resolved(1000)
    assert plan["tokens"] == 50 * 128 * 4 * 3
    assert plan["params"] == count_params(resolved)
    assert plan["flops_per_token"] == flops_per_token(resolved, 128)
    assert plan["train_flops"] == flops_per_token(resolved, 128) * plan["tokens"]
    assert plan["vocab_size"] == 1000 and plan["seq_len"] == 128


def test_a_fixed_model_vocab_wins_over_the_tokenizers() -> None:
    plan = plan_training(ModelConfig(vocab_size=512, d_model=32, n_heads=2), 256, 2 * 4096, vocab_size=9999)
    assert plan["params"] == count_params(ModelConfig(vocab_size=512, d_model=32, n_heads=2))


def test_format_plan_shows_the_numbers() -> None:
    text = format_plan(
        plan_training(DEMO_MODEL, DEMO_TRAIN.seq_len, DEMO_TRAIN.steps * DEMO_TRAIN.tokens_per_step, vocab_size=8192)
    )
    for needle in (
        "5,048,576",
        "2,951,424",
        "8,192",
        "1,228,800",
        "33,423,360",
        "4.107e+13",
        "3.722e+13",
        "100,971,520",
        "0.243",
    ):
        assert needle in text, needle
    assert len(text.splitlines()) == 8


# ---- kiln plan flops: raw numbers and presets ----


def test_gpt3_training_flops() -> None:
    # Brown et al. 2020, Table D.1: GPT-3 175B trained on 300B tokens took 3.14e23 FLOPs.
    r = count_flops(300e9, params=175e9)
    assert r["method"] == "6nd" and r["train_flops"] == 6 * 175e9 * 300e9
    assert r["train_flops"] == pytest.approx(3.14e23, rel=0.01)


def test_gpt3_attention_term() -> None:
    # GPT-3 175B: 96 layers, d_attn 12288, 2048-token context (Brown et al. 2020, Table 2.1).
    # PaLM App. B: 6N + 12*L*T*d_attn per token; the attention term adds 2.8% here.
    r = count_flops(300e9, params=175e9, n_layers=96, d_attn=12288, seq_len=2048)
    assert r["flops_per_token"] == 6 * 175e9 + 12 * 96 * 2048 * 12288
    assert r["train_flops"] / r["train_flops_6nd"] == pytest.approx(1.0276, abs=1e-4)
    # Kaplan et al. 2020 Table 1 counts the context term once: 6N + 6*L*T*d_attn.
    assert r["train_flops_kaplan"] == (6 * 175e9 + 6 * 96 * 2048 * 12288) * 300e9


def test_chinchilla_training_flops() -> None:
    # Hoffmann et al. 2022: Chinchilla (70B, 1.4T tokens) used Gopher's budget, 5.76e23 FLOPs
    # (Table 3); 6ND gives 5.88e23, within 3% (70B and 1.4T are themselves rounded).
    r = count_flops(1.4e12, params=70e9)
    assert r["train_flops"] == pytest.approx(5.76e23, rel=0.03)


def test_7b_on_2t_tokens() -> None:
    # The worked example: 7B parameters on 2T tokens is 8.4e22 FLOPs.
    assert count_flops(2e12, params=7e9)["train_flops"] == pytest.approx(8.4e22, rel=1e-12)


def test_preset_uses_the_model_configs_counts() -> None:
    cfg = get_preset("llama-7b")
    r = count_flops(2e12, preset="llama-7b", seq_len=4096)
    assert r["params"] == count_params(cfg) == 6_738_415_616
    assert r["flops_per_token"] == flops_per_token(cfg, 4096)
    assert r["train_flops"] == flops_per_token(cfg, 4096) * 2e12
    assert r["train_flops_6nd"] == 6 * count_params(cfg) * 2e12
    assert count_flops(1e9, preset="demo-5m")["seq_len"] == 256  # the preset's max_seq_len by default
    text = format_flops(r)
    assert "6,738,415,616 (6.74B)" in text and "PaLM" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": 0, "params": 1e9}, "tokens = 0 must be above 0"),
        ({"tokens": 1e9, "params": -5}, "params = -5 must be above 0"),
        ({"tokens": 1e9}, "exactly one of params"),
        ({"tokens": 1e9, "params": 1e9, "preset": "llama-7b"}, "exactly one of params"),
        ({"tokens": 1e9, "params": 1e9, "n_layers": 4}, "needs all of n_layers"),
        ({"tokens": 1e9, "preset": "llama-7b", "seq_len": 0}, "seq_len = 0 must be at least 1"),
        ({"tokens": 1e9, "params": 1e9, "n_layers": 4, "d_attn": 64, "seq_len": 0}, "seq_len = 0 must be at least 1"),
        (
            {"tokens": 1e9, "preset": "llama-7b", "d_attn": 128},
            r"d_attn \(--d-attn\) goes only with params \(--params\); preset 'llama-7b' has its own shape",
        ),
        (
            {"tokens": 1e9, "preset": "llama-7b", "n_layers": 2, "d_attn": 128},
            r"n_layers \(--layers\) and d_attn \(--d-attn\) go only with params",
        ),
    ],
)
def test_bad_flops_inputs_name_the_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        count_flops(**kwargs)
