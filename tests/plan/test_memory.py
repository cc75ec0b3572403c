"""kiln.plan.memory: the ZeRO paper's worked example, Korthikanti et al.'s activation table, flash attention and
headroom."""

from __future__ import annotations

import pytest

from kiln.core.errors import ConfigError
from kiln.model.config import get_preset
from kiln.plan.memory import (
    Shape,
    activation_bytes_per_layer,
    format_memory,
    plan_memory,
)


@pytest.mark.parametrize(
    ("zero", "states_gb"),
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, Nd = 64, mixed-precision Adam (K = 12).
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_paper_worked_example(zero: int, states_gb: float) -> None:
    r = plan_memory(Shape(7.5e9), dp=64, zero=zero)
    assert r["model_states_gb"] == pytest.approx(states_gb, abs=0.05)
    # by hand: weights 2 * 7.5, gradients 2 * 7.5, optimizer 12 * 7.5 GB, divided by 64 from the stage that shards them
    assert r["weights_gb"] == pytest.approx(15.0 / (64 if zero >= 3 else 1))
    assert r["grads_gb"] == pytest.approx(15.0 / (64 if zero >= 2 else 1))
    assert r["optimizer_gb"] == pytest.approx(90.0 / (64 if zero >= 1 else 1))
    assert r["activations_gb"] is None and r["total_gb"] == r["model_states_gb"]


def test_tensor_and_pipeline_split_parameters_before_zero() -> None:
    r = plan_memory(Shape(8e9), dp=4, tp=2, pp=2, zero=1)
    # 8e9 / (2 * 2) = 2e9 local parameters: 2 + 2 + 12/4 = 7 bytes each = 14 GB
    assert r["params_per_gpu"] == 2e9 and r["model_states_gb"] == pytest.approx(14.0)
    assert r["gpus"] == 16
    assert plan_memory(Shape(1e9), precision="fp32")["model_states_gb"] == pytest.approx(16.0)  # 4 + 4 + 8


def test_korthikanti_table_2_per_layer() -> None:
    # GPT-3 175B shape (s=2048, h=12288, a=96), b=1, t=8; 5as/(ht) = 5*96*2048/(12288*8) = 10.
    # Eager attention stores the scores, as Korthikanti's table assumes.
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert activation_bytes_per_layer(s, b, h, a, 1, checkpointing="none", attention="eager") == pytest.approx(
        sbh * (34 + 80)
    )
    assert activation_bytes_per_layer(s, b, h, a, t, sequence_parallel=False, attention="eager") == pytest.approx(
        sbh * (10 + 3 + 10)
    )
    assert activation_bytes_per_layer(s, b, h, a, t, sequence_parallel=True, attention="eager") == pytest.approx(
        sbh * (34 / 8 + 10)
    )
    assert activation_bytes_per_layer(
        s, b, h, a, t, sequence_parallel=False, checkpointing="selective", attention="eager"
    ) == pytest.approx(sbh * 13)
    assert activation_bytes_per_layer(
        s, b, h, a, t, sequence_parallel=True, checkpointing="selective", attention="eager"
    ) == pytest.approx(sbh * 34 / 8)
    assert activation_bytes_per_layer(s, b, h, a, t, checkpointing="full", attention="eager") == 2 * sbh


@pytest.mark.parametrize(("tp", "sp"), [(1, True), (8, False), (8, True)])
def test_flash_attention_stores_no_scores(tp: int, sp: bool) -> None:
    # SDPA's flash kernel recomputes the scores in backward, so no recompute costs what selective does.
    s, b, h, a = 2048, 1, 12288, 96
    flash = activation_bytes_per_layer(s, b, h, a, tp, sp, "none")  # flash is the default
    assert flash == activation_bytes_per_layer(s, b, h, a, tp, sp, "selective", attention="eager")
    assert flash == activation_bytes_per_layer(s, b, h, a, tp, sp, "selective")
    assert activation_bytes_per_layer(s, b, h, a, tp, sp, "none", attention="eager") - flash == pytest.approx(
        s * b * h * 5 * a * s / (h * tp)
    )


def test_activations_for_a_preset() -> None:
    shape = Shape.from_config(get_preset("llama-7b"))
    r = plan_memory(shape, dp=8, zero=1, seq_len=4096, checkpointing="selective")
    # 32 layers * 34 * 4096 * 4096 bytes = 18.25 GB; states (2 + 2 + 12/8) * 6.738e9 = 37.06 GB
    assert r["activations_gb"] == pytest.approx(32 * 34 * 4096 * 4096 / 1e9)
    assert r["model_states_gb"] == pytest.approx(5.5 * 6_738_415_616 / 1e9)
    assert r["total_gb"] == pytest.approx(r["activations_gb"] + r["model_states_gb"])
    assert r["fits"] is True and plan_memory(shape, seq_len=4096, gpu_memory_gb=80)["fits"] is False
    # With flash attention (the default) no recompute is the same 18.25 GB; eager attention adds
    # 32 layers * 5 * 32 * 4096 / 4096 = 160 sbh each, 85.9 GB: 5.7x at s = 4096.
    assert plan_memory(shape, dp=8, zero=1, seq_len=4096)["activations_gb"] == pytest.approx(r["activations_gb"])
    eager = plan_memory(shape, dp=8, zero=1, seq_len=4096, attention="eager")["activations_gb"]
    assert eager == pytest.approx(32 * (34 + 160) * 4096 * 4096 / 1e9) and eager / r["activations_gb"] == pytest.approx(
        194 / 34
    )
    # 1F1B: pp stages of L/pp layers, pp micro-batches in flight on the first: the same L layers' worth
    piped = plan_memory(shape, dp=2, pp=4, zero=1, seq_len=4096, checkpointing="selective")
    assert piped["activations_gb"] == pytest.approx(r["activations_gb"])
    assert plan_memory(shape, pp=4, seq_len=4096, checkpointing="selective", micro_batches=2)[
        "activations_gb"
    ] == pytest.approx(r["activations_gb"] / 2)
    # fp32 activations are twice Korthikanti's 16-bit ones
    assert plan_memory(shape, seq_len=4096, checkpointing="selective", precision="fp32")[
        "activations_gb"
    ] == pytest.approx(2 * r["activations_gb"])
    # full recompute keeps each layer's input plus one layer being recomputed, which with flash
    # attention stores no scores either: (32 * 2 + 34) sbh; eager adds that layer's 160 sbh.
    full = plan_memory(shape, seq_len=4096, checkpointing="full")["activations_gb"]
    assert full == pytest.approx((32 * 2 + 34) * 4096 * 4096 / 1e9)
    full_eager = plan_memory(shape, seq_len=4096, checkpointing="full", attention="eager")["activations_gb"]
    assert full_eager == pytest.approx((32 * 2 + 34 + 160) * 4096 * 4096 / 1e9)
    text = format_memory(r)
    assert "18.25" in text and "yes (72.00 GB usable of 80 GB per GPU)" in text
    assert "with flash attention selective recompute saves nothing" in text


def test_the_reviewers_full_recompute_case() -> None:
    # kiln plan memory --preset llama-7b --dp 8 --zero 3 --activation-checkpointing full --micro-batch 4:
    # checkpoints 32 * 2 sbh = 4.29 GB plus one recomputed layer 34 sbh = 2.28 GB, s*b*h = 4096*4*4096.
    shape = Shape.from_config(get_preset("llama-7b"))
    r = plan_memory(shape, dp=8, zero=3, micro_batch=4, seq_len=4096, checkpointing="full")
    assert r["activations_gb"] == pytest.approx(6.576, abs=1e-3)
    # Eager attention keeps the recomputed layer's 160 sbh of scores: 10.7 GB more.
    eager = plan_memory(shape, dp=8, zero=3, micro_batch=4, seq_len=4096, checkpointing="full", attention="eager")
    assert eager["activations_gb"] - r["activations_gb"] == pytest.approx(160 * 4096 * 4 * 4096 / 1e9)


def test_fits_leaves_headroom() -> None:
    # 7.5B with ZeRO-1 on 8 GPUs: (2 + 2 + 12/8) * 7.5 = 41.25 GB of states.
    r = plan_memory(Shape(7.5e9), dp=8, zero=1, gpu_memory_gb=45)
    assert r["model_states_gb"] == pytest.approx(41.25)
    assert r["usable_gb"] == pytest.approx(40.5) and r["headroom"] == 0.1 and r["fits"] is False  # 41.25 > 0.9 * 45
    assert plan_memory(Shape(7.5e9), dp=8, zero=1, gpu_memory_gb=45, headroom=0.05)["fits"] is True  # 42.75 usable


def test_warnings() -> None:
    # params far from what the shape implies: 2 layers of width 64 hold about 1e5 parameters, not 7e9.
    r = plan_memory(Shape(7e9, 2, 64, 2))
    assert len(r["warnings"]) == 1 and "params = 7e+09 is 7.12e+04x the 9.83e+04" in r["warnings"][0]
    assert plan_memory(Shape.from_config(get_preset("llama-70b")), dp=8, zero=1)["warnings"] == []
    assert plan_memory(Shape.from_config(get_preset("gpt2-124m")))["warnings"] == []  # embeddings are 31% of it
    w = plan_memory(Shape(8e9), dp=4, pp=2, zero=2)["warnings"]
    assert len(w) == 1 and w[0].startswith(
        "ZeRO-2 with pp = 2: kiln's FSDP2 keeps a pipeline stage's weights and gradients whole"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp": 3}, "tp = 3 does not divide n_heads = 32.*valid tp: 1, 2, 4, 8, 16, 32"),
        ({"pp": 40}, "pp = 40 exceeds n_layers = 32: each pipeline stage holds at least one layer"),
        ({"zero": 4}, "zero = 4 is not a ZeRO stage"),
        ({"dp": 0}, "dp = 0 must be at least 1"),
        ({"micro_batch": 0}, "micro_batch = 0 must be at least 1"),
        (
            {"checkpointing": "some"},
            "activation_checkpointing = 'some' is unknown; choose one of none, selective, full",
        ),
        ({"precision": "int8"}, "precision = 'int8' is unknown"),
        ({"gpu_memory_gb": 0}, "gpu_memory_gb = 0 must be above 0"),
        ({"attention": "sdpa"}, "attention = 'sdpa' is unknown; choose one of flash, eager"),
        ({"headroom": 1.0}, r"headroom = 1 must be in \[0, 1\)"),
        ({"seq_len": 0}, "seq_len = 0 must be at least 1"),
    ],
)
def test_bad_layouts_name_the_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_memory(Shape.from_config(get_preset("llama-7b")), **kwargs)


def test_zero_params_and_partial_shapes_rejected() -> None:
    with pytest.raises(ConfigError, match="params = 0 must be above 0"):
        plan_memory(Shape(0))
    with pytest.raises(
        ConfigError,
        match=(
            r"needs all of n_layers \(--layers\), d_model \(--hidden\) and n_heads \(--heads\), or none of them; got "
            r"only d_model \(--hidden\)"
        ),
    ):
        plan_memory(Shape(7e9, d_model=4096))
    with pytest.raises(ConfigError, match="n_heads \\(--heads\\) = 0 must be at least 1"):
        plan_memory(Shape(7e9, 32, 4096, 0))


def test_uneven_stages_are_priced_by_the_largest() -> None:
    # kiln balances stages that need not be equal: 32 layers over 5 stages, the largest holds 7,
    # 7/8 of the activations of 4 stages of 8 (one micro-batch in flight either way).
    shape = Shape.from_config(get_preset("llama-7b"))
    five, four = (plan_memory(shape, pp=pp, seq_len=4096, micro_batches=1)["activations_gb"] for pp in (5, 4))
    assert five == pytest.approx(four * 7 / 8)
