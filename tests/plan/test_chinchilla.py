"""kiln.plan.chinchilla, .scaling and .hardware: compute-optimal sizes, predicted loss, GPU-hours and cost."""

from __future__ import annotations

import math

import pytest

from kiln.core.errors import ConfigError
from kiln.plan.chinchilla import format_size, size_for_budget
from kiln.plan.hardware import GPUS, gpu_hours, resolve_gpu
from kiln.plan.scaling import BESIROGLU_2024, HOFFMANN_2022, get_law

H100_1000 = resolve_gpu("h100", peak_tflops=1000)

# Hoffmann et al. 2022, Table 3 (Approach 1): parameters, training FLOPs, training tokens.
CHINCHILLA_TABLE_3 = [
    (400e6, 1.92e19, 8.0e9),
    (1e9, 1.21e20, 20.2e9),
    (10e9, 1.23e22, 205.1e9),
    (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12),
    (280e9, 9.90e24, 5.9e12),
    (520e9, 3.43e25, 11.0e12),
    (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
]


@pytest.mark.parametrize(("params", "flops", "tokens"), CHINCHILLA_TABLE_3)
def test_rule20_reproduces_chinchilla_table_3(params: float, flops: float, tokens: float) -> None:
    r = size_for_budget("rule20", H100_1000, 0.4, flops=flops)
    # Within 5% in parameters and 8% in tokens: the table's rows have 20 to 22.4 tokens per
    # parameter r, and rule20 at the same FLOPs gives N * sqrt(r / 20), up to 4.1% larger (the
    # 10T row); 67B on 1.5T is the loosest in tokens (its 6ND is 6.0e23, listed as 5.76e23).
    assert r["params"] == pytest.approx(params, rel=0.05)
    assert r["tokens"] == pytest.approx(tokens, rel=0.08)
    assert r["tokens"] == pytest.approx(20 * r["params"]) and r["flops"] == pytest.approx(6 * r["params"] * r["tokens"])


def test_epoch_fit_puts_chinchillas_budget_near_chinchilla() -> None:
    # Besiroglu et al. 2024: their refit agrees with Hoffmann's Approaches 1 and 2; at Gopher's
    # 5.76e23 FLOPs it picks 72B params on 1.33T tokens (Chinchilla: 70B on 1.4T).
    r = size_for_budget("epoch", H100_1000, 0.4, flops=5.76e23)
    assert r["params"] == pytest.approx(70e9, rel=0.05)
    assert r["tokens"] == pytest.approx(1.4e12, rel=0.06)
    assert 17 < r["tokens_per_param"] < 21


def test_hoffmann_loss_for_chinchilla_by_hand() -> None:
    # 1.69 + 406.4 / (7e10)^0.34 + 410.7 / (1.4e12)^0.28 = 1.69 + 0.0836 + 0.1630 = 1.9366
    assert HOFFMANN_2022.loss(70e9, 1.4e12) == pytest.approx(1.9366, abs=1e-4)
    assert BESIROGLU_2024.coefficients() == {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}
    assert HOFFMANN_2022.coefficients() == {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


@pytest.mark.parametrize("name", ["hoffmann", "epoch"])
def test_law_optimum_is_the_minimum_on_the_iso_flop_line(name: str) -> None:
    law = get_law(name)
    for flops in (1e20, 1e23, 1e26):
        n, d = law.optimal(flops)
        assert 6 * n * d == pytest.approx(flops)
        best = law.loss(n, d)
        for factor in (0.9, 1.1):  # moving either way along 6ND = C loses
            assert law.loss(n * factor, d / factor) > best
        assert law.optimal_tokens(n) == pytest.approx(d, rel=1e-9)  # the frontier read from N


def test_fixed_size_reads_the_frontier() -> None:
    r = size_for_budget("rule20", H100_1000, 0.4, params=7e9)
    assert r["tokens"] == 140e9 and r["flops"] == 6 * 7e9 * 140e9
    r = size_for_budget("epoch", H100_1000, 0.4, params=7e9)
    assert r["params"] == 7e9 and r["flops"] == pytest.approx(6 * 7e9 * BESIROGLU_2024.optimal_tokens(7e9))
    assert r["loss"] == pytest.approx(BESIROGLU_2024.loss(7e9, r["tokens"]))


def test_7b_on_2t_a100_hours() -> None:
    # The worked example: 8.4e22 FLOPs at 312 TFLOP/s and full utilisation is
    # 8.4e22 / 312e12 / 3600 = 74,786 A100-hours (about 74,800).
    assert gpu_hours(6 * 7e9 * 2e12, GPUS["a100"], mfu=1.0) == pytest.approx(74_786, abs=1)


def test_dollar_budget_worked_example() -> None:
    # The worked example: $500,000 at $3/GPU-hour = 166,667 H100-hours; at 1000 TFLOP/s
    # and 35% MFU that is 2.1e23 FLOPs; 20 tokens/param gives N = sqrt(2.1e23 / 120) = 41.8B
    # on 837B tokens, and 166,667 h / 128 GPUs / 24 = 54.3 days.
    r = size_for_budget("rule20", H100_1000, 0.35, gpus=128, usd=500_000, usd_per_gpu_hour=3.0)
    assert r["flops"] == pytest.approx(2.1e23, rel=1e-9)
    assert r["params"] == pytest.approx(41.8e9, rel=0.001)
    assert r["tokens"] == pytest.approx(837e9, rel=0.001)
    assert r["gpu_hours"] == pytest.approx(500_000 / 3)
    assert r["days"] == pytest.approx(54.25, abs=0.01)
    assert r["cost_usd"] == pytest.approx(500_000)
    assert r["loss"] is None
    text = format_size(r)
    assert "41,833,001,327 (41.8B)" in text and "54.3" in text and "500,000" in text
    assert "days on 128 GPUs" in text and r["warnings"] == []
    one = size_for_budget("rule20", H100_1000, 0.35, gpus=1, flops=2.1e23)
    assert "days on 1 GPU " in format_size(one)  # singular


def test_published_laws_warn_when_extrapolated() -> None:
    # Both coefficient sets rest on runs of 70M to 16B parameters on 5B to 500B tokens (Hoffmann
    # et al.'s abstract); Chinchilla's own budget stays inside 10x of that, 1e27 FLOPs does not.
    assert size_for_budget("epoch", H100_1000, 0.4, flops=5.76e23)["warnings"] == []
    r = size_for_budget("hoffmann", H100_1000, 0.4, flops=1e27)
    assert r["params"] > 160e9 and r["tokens"] > 5e12
    assert any("params = " in w and "largest of Hoffmann et al.'s runs (1.6e+10)" in w for w in r["warnings"])
    assert any("tokens = " in w and "largest of Hoffmann et al.'s runs (5e+11)" in w for w in r["warnings"])
    assert "warning: " in format_size(r)
    assert size_for_budget("rule20", H100_1000, 0.4, flops=1e27)["warnings"] == []  # no law, nothing extrapolated


def test_rule20_and_the_recipe_plan_share_one_constant() -> None:
    from kiln.plan import chinchilla, flops, scaling

    assert chinchilla.TOKENS_PER_PARAM is flops.TOKENS_PER_PARAM is scaling.TOKENS_PER_PARAM == 20


def test_the_planner_and_the_monitor_read_one_gpu_table() -> None:
    from kiln.core import hardware
    from kiln.plan import hardware as plan_hardware

    assert plan_hardware.GPUS is hardware.GPUS
    # Device names as torch.cuda.get_device_name reports them; L40S must not match L4.
    assert hardware.peak_flops_of("NVIDIA A100-SXM4-80GB") == GPUS["a100"].peak_flops == 312e12
    assert hardware.peak_flops_of("NVIDIA H100 80GB HBM3") == GPUS["h100"].peak_flops == 989e12
    assert hardware.peak_flops_of("NVIDIA L40S") == 362e12
    assert hardware.peak_flops_of("NVIDIA L4") == 121e12
    assert hardware.peak_flops_of("Tesla T4") is None
    assert resolve_gpu(None).name == GPUS["h100"].name  # the default
    assert resolve_gpu(None, peak_tflops=500).peak_flops == 500e12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flops": -1e23}, r"flops = -1e\+23 must be above 0"),
        ({"flops": 0}, "flops = 0 must be above 0"),
        ({"usd": 0, "usd_per_gpu_hour": 2}, "usd = 0 must be above 0"),
        ({"usd": 1e5}, "needs usd_per_gpu_hour"),
        ({"usd": 1e5, "usd_per_gpu_hour": -2}, "usd_per_gpu_hour = -2 must be above 0"),
        ({"flops": 1e23, "params": 7e9}, "exactly one budget.*flops, params"),
        ({}, "exactly one budget.*none"),
        ({"flops": 1e23, "mfu": 1.2}, r"mfu = 1.2 must be in \(0, 1\]"),
        ({"flops": 1e23, "mfu": 0}, r"mfu = 0 must be in \(0, 1\]"),
        ({"flops": 1e23, "gpus": 0}, "gpus = 0 must be at least 1"),
        ({"flops": 1e23, "fit": "kaplan"}, "fit = 'kaplan' is unknown; choose one of rule20, hoffmann, epoch"),
    ],
)
def test_bad_budgets_name_the_input(kwargs: dict, message: str) -> None:
    args = {"fit": "rule20", "gpu": H100_1000, "mfu": 0.4} | kwargs
    with pytest.raises(ConfigError, match=message):
        size_for_budget(**args)


def test_bad_gpu_inputs() -> None:
    with pytest.raises(ConfigError, match="gpu 'tpu' is unknown; choose one of a100-40gb, a100, h100, h200"):
        resolve_gpu("tpu")
    with pytest.raises(ConfigError, match="peak_tflops = 0 must be above 0"):
        resolve_gpu("h100", peak_tflops=0)
    assert math.isclose(resolve_gpu("a100", memory_gb=40).memory_gb, 40)
